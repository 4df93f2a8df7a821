"""The native PZQ protocol on the shared store: producers' runs of messages, consumers' acks, credit.

Two sockets (docs/protocols.md, "The native protocol"): producers speak on ``receive`` (the server's ROUTER: each
message starts with the producer's routing frame, and so does each ack), consumers on ``send`` (the
server's DEALER, which picks the consumer itself: deliveries carry no routing frame, and a consumer's
answer arrives without one). The DEALER hides which consumer got what, so every delivery is held by
one holder, ``CONSUMER``, sized by one credit pool (pzq/credit.py), and their bodies are charged to one
pool of bytes (pzq/gateways/native_pool.py: its epochs are the payers).

Inputs and outputs are runs: ``received_many`` takes every message a socket gave in a turn and stores
a producer run in one ``produce_many`` call, acknowledging in the order the messages came (a rejected
message in the middle is answered in its place); a consumer's run of acks is settled by ``ack_many``;
``dispatch`` hands out one ``take`` of as many as the credit allows. A batched frame (many messages per
ZeroMQ message, PZQ-BATCH/1: pzq/gateways/native_batches.py) is stored in its place in the run, in one
``produce_many`` call of its own, and answered in its place. Nothing here touches a socket or reads a clock: ``now`` and
``now_us`` are passed in, and every ``Send`` leaves only after the turn's commit.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence

from pzq.broker import Broker, Ref
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.credit import NativeCredit
from pzq.errors import StoreFull
from pzq.gateways.contract import Send
from pzq.gateways.native_batches import Batches
from pzq.gateways.native_pool import SendPool
from pzq.logs import warn_bad
from pzq.protocols import native
from pzq.protocols.native_batch import MARK, is_batch
from pzq.store import Upload
from pzq.store.dedup_keys import DedupKeys

log = logging.getLogger("pzq.server")

RECEIVE = "receive"  # producers: the server's ROUTER
SEND = "send"  # consumers: the server's DEALER (its sends have no routing frame)
CONSUMER = "native"  # the holder of every delivery through the send socket: one credit pool
TAKE_BACK_LOG_S = 10.0  # at most one line this often about deliveries taken back early


class NativeGateway:
    """Stores what producers send and acks it after the commit; hands ``queue`` to consumers, at most
    ``max_inflight`` young deliveries at once (see NativeCredit)."""

    def __init__(
        self,
        broker: Broker,
        *,
        queue: str,
        max_message_size: int,
        max_inflight: int,
        ack_timeout_s: float,
        keys: DedupKeys | None = None,
        dedup_window_s: float = 86400.0,
        limits: Limits = DEFAULT_LIMITS,
    ):
        """``keys``: the store's dedup table, where batch ids are remembered for ``dedup_window_s``
        (None: a resent batch is stored again); ``limits`` gives the batch caps (batch_*)."""
        self.broker = broker
        self.queue = queue
        self.max_message_size = max_message_size
        self.ack_timeout_us = round(ack_timeout_s * 1e6)  # what the wire tells consumers
        self.ack_timeout_s = ack_timeout_s
        self.credit = NativeCredit(max_inflight, ack_timeout_s)
        self.pool = SendPool(
            broker,
            limits.native_send_pool,
            limits.send_pipe_messages(max_message_size + 4096) + 1,  # (SNDHWM, and libzmq's encoder one more)
            check_s=limits.native_send_check_s,
            unwatched_s=ack_timeout_s,
        )
        self.batches = Batches(
            broker, queue, keys, max_message_size=max_message_size, dedup_window_s=dedup_window_s, limits=limits
        )
        # Its deliveries of earlier turns stay in flight through a rolled-back turn (see Broker.rolled_back):
        # nothing here would forget them, and a consumer's ack is never answered, so it is done again.
        broker.keep_on_rollback.add(CONSUMER)
        self.taken_back_total = 0
        self._take_back_logged = float("-inf")
        # The broker's readiness when a take found nothing: until it changes, nothing is ready for us.
        self._stalled_at: int | None = None
        self._owed: list[Send] = []  # answers of a run whose store call failed, for rolled_back
        # A big message being written a part per turn (received_big), and (routing, message id) of it
        self._upload: Upload | None = None
        self._uploader: tuple[bytes, bytes] = (b"", b"")
        self.big_written = 0  # bytes of its body the last received_big call wrote
        self.dispatched = 0  # deliveries taken back and handed out by the last dispatch call
        self.dispatched_bytes = 0  # bytes of the bodies it handed out (when asked to bound them)

    # -- what arrives ----------------------------------------------------------------------------

    def received(
        self, socket: str, frames: list[bytes], *, now: float, now_us: int, user: str | None = None
    ) -> list[Send]:
        """One message from ``socket`` (a run of one); ``user`` is not needed by this protocol."""
        return self.received_many(socket, [frames], now=now, now_us=now_us)

    def received_many(self, socket: str, messages: Sequence[list[bytes]], *, now: float, now_us: int) -> list[Send]:
        """A run of messages from ``socket``, in the order they came: what to answer (producers' acks,
        in that order; consumers' answers need none). Raises StoreError when the store failed: the
        turn is rolled back, and ``rolled_back`` then answers every producer of the run."""
        if socket == RECEIVE:
            return self._produce(messages, now_us)
        self._answers(messages, now)
        return []

    def _produce(self, messages: Sequence[list[bytes]], now_us: int) -> list[Send]:
        out: list[Send] = []
        waiting: list[tuple[bytes, bytes]] = []  # (routing, message id) of the messages not yet stored
        bodies: list[list[bytes]] = []
        limit = self.max_message_size
        at = 0  # the message being looked at
        try:
            for at in range(len(messages)):
                frames = messages[at]
                if len(frames) > 2 and frames[2] == MARK:  # a batch (or a probe): in its place
                    self._store(waiting, bodies, out, now_us)
                    out.append(self.batches.received(frames, now_us))
                    continue
                # The usual shape, [routing, id, "", body...], read without a Produce (what parse_produce
                # would make of it); anything else goes through parse_produce
                if len(frames) > 3 and frames[2] == b"" and len(frames[1]) <= native.MAX_ID:
                    body = frames[3:]
                    if sum(map(len, body)) <= limit:
                        waiting.append((frames[0], frames[1]))
                        bodies.append(body)
                        continue
                event = native.parse_produce(frames, limit)
                if event is None:
                    continue  # (no id frame: there is no one to answer)
                if isinstance(event, native.Rejected):
                    self._store(waiting, bodies, out, now_us)  # (acks keep the order of the messages)
                    warn_bad("producer", event.error.code, event.error.detail)
                    out.append(Send(RECEIVE, native.refusal(event)))
                    continue
                waiting.append((event.routing, event.message_id))
                bodies.append(event.body)
            at = len(messages)
            self._store(waiting, bodies, out, now_us)
        except Exception:  # noqa: BLE001 - a StoreError, or a bug: the loop rolls the turn back either way
            # Every producer of the run hears so, in order, those whose messages were not looked at yet
            # too (they were read off the socket: nobody else will answer them).
            self._owed = [
                *out,
                *(_failed(routing, mid) for routing, mid in waiting),
                *self._all_failed(messages[at:], limit),
            ]
            raise
        return out

    def _store(
        self, waiting: list[tuple[bytes, bytes]], bodies: list[list[bytes]], out: list[Send], now_us: int
    ) -> None:
        """Store the run read so far in one call and append its acks to ``out``; those past the store
        limit are answered "queue full"."""
        if not waiting:
            return
        stored = self.broker.produce_many(self.queue, bodies, now_us=now_us)
        if stored == len(waiting):  # (the usual case: produce_ack's frames for "stored", a call less each)
            make = Send._make
            out += [make((RECEIVE, [routing, message_id, b"1", b""], None, False)) for routing, message_id in waiting]
            waiting.clear()
            bodies.clear()
            return
        for i, (routing, message_id) in enumerate(waiting):
            error = None if i < stored else native.QUEUE_FULL
            out.append(Send(RECEIVE, native.produce_ack(routing, message_id, error)))
        waiting.clear()
        bodies.clear()

    def received_big(self, frames: list[bytes], *, chunk: int, most: int, now_us: int) -> list[Send] | None:
        """A big message from the receive socket, written a part per call (one call a turn): its body in
        chunks of ``chunk`` bytes, about ``most`` bytes a call (``big_written`` says how many this call
        wrote). None while parts remain: call again with the same frames next turn. Its answer once it
        is stored (in the call of its last part, so the ack follows the commit that stored all of it),
        or refused. Raises StoreError when the store failed (``rolled_back`` answers it)."""
        self.big_written = 0
        upload = self._upload
        if upload is None:
            event = native.parse_produce(frames, self.max_message_size)
            if event is None:
                return []
            if isinstance(event, native.Rejected):
                warn_bad("producer", event.error.code, event.error.detail)
                return [Send(RECEIVE, native.refusal(event))]
            self._uploader = (event.routing, event.message_id)
            try:
                upload = self.broker.begin_big(event.body, chunk)
            except StoreFull:
                return [Send(RECEIVE, native.produce_ack(*self._uploader, native.QUEUE_FULL))]
            except Exception:  # noqa: BLE001 - a StoreError, or a bug: the loop rolls the turn back either way
                self._owed = [_failed(*self._uploader)]
                raise
            self._upload = upload
        try:
            self.big_written = self.broker.write_big(upload, most)
            if not upload.done:
                return None
            self.broker.produce_big(self.queue, upload, now_us=now_us)
        except StoreFull:
            self._upload = None
            self.broker.drop_big(upload)
            return [Send(RECEIVE, native.produce_ack(*self._uploader, native.QUEUE_FULL))]
        except Exception:  # noqa: BLE001 - as above
            self._upload = None
            self._owed = [_failed(*self._uploader)]
            raise
        self._upload = None
        return [Send(RECEIVE, native.produce_ack(*self._uploader, None))]

    def _answers(self, messages: Sequence[list[bytes]], now: float) -> None:
        """Consumers' acks and nacks, settled in order; a run of acks in one ``ack_many``."""
        acks: list[Ref] = []
        keys: list[bytes] = []
        answered: set[Ref] = set()  # (acks settle at the run's end: a repeat must not count twice)
        timeout_s = self.ack_timeout_s
        deadline_of = self.broker.inflight.deadline_of(CONSUMER)  # (broker.deadline's answer, a call each)
        sent_at: list[tuple[Ref, float | None]] = []  # (told to the credit in one call, in order)
        for frames in messages:
            if len(frames) < 2:  # (parse_consumer_ack's None, read without a ConsumerAck per answer)
                warn_bad("consumer", "short", f"{len(frames)} frame(s), expected [key, ack]")
                continue
            key = frames[0]
            ref = ref_of_key(key)
            if ref is None:
                warn_bad("consumer", "bad-key", f"unknown message key {key[:80]!r}")
                continue
            deadline = None if ref in answered else deadline_of(ref)
            answered.add(ref)
            sent_at.append((ref, None if deadline is None else deadline - timeout_s))
            if frames[1] == b"1":
                acks.append(ref)
                keys.append(key)
                continue
            self._ack_run(acks, keys)  # (a nack settles after the acks before it)
            self.credit.answered_many(sent_at, now)
            sent_at.clear()
            if not self.broker.nack(ref, by=CONSUMER):
                warn_bad(
                    "consumer",
                    "not-held",
                    f"nack for {key[:80]!r}, not in flight through the send socket: ignored",
                )
        self._ack_run(acks, keys)
        self.credit.answered_many(sent_at, now)

    def _ack_run(self, acks: list[Ref], keys: list[bytes]) -> None:
        if not acks:
            return
        refused = self.broker.ack_many(acks, by=CONSUMER)
        if refused:
            key_of = dict(zip(acks, keys, strict=True))
            for ref in refused:
                warn_bad(
                    "consumer",
                    "not-held",
                    f"ack for {key_of[ref][:80]!r}, which no delivery through "
                    "the send socket holds (unknown, settled or another's): ignored",
                )
        acks.clear()
        keys.clear()

    # -- what the turn sends ---------------------------------------------------------------------

    def would_send(self, now: float) -> bool:
        """True if ``dispatch`` would hand out deliveries were the send socket writable: the endpoint
        then polls it for writability (asking when nothing is ready would wake the loop for nothing)."""
        return (
            self._stalled_at != self.broker.readiness
            and self._available(now) > 0
            and self.pool.room() > 0
            and self.broker.has_ready(self.queue)
        )

    def dispatch(
        self,
        *,
        now: float,
        now_us: int,
        blocked: frozenset[Hashable] = frozenset(),
        most: int | None = None,
        most_bytes: int | None = None,
    ) -> list[Send]:
        """Take back the oldest deliveries when consumers together hold too many, then hand out a run
        of deliveries within the credit. ``blocked`` holds ``SEND`` while the send socket takes
        nothing (no consumer, or every consumer's pipe full): then nothing is taken. ``most`` bounds the
        call's work (the turn's share): at most that many taken back, or else that many handed out; the
        caller calls again for more (``dispatched`` says how many this call handled). ``most_bytes``
        bounds the bodies handed out (the first always goes; ``dispatched_bytes`` says how many)."""
        held = self.broker.held_count(CONSUMER)
        overdue = self.credit.overdue(held, self.broker.held_by(CONSUMER), most)
        self.dispatched, self.dispatched_bytes = len(overdue), 0
        if overdue:
            self.broker.take_back_many(overdue, by=CONSUMER)
            self.taken_back_total += len(overdue)
            # (a consumer that acks late takes this path every turn: one line per TAKE_BACK_LOG_S)
            if now >= self._take_back_logged + TAKE_BACK_LOG_S:
                log.warning(
                    "native consumers hold %d unacknowledged deliveries together (the most is %d): the "
                    "oldest went back to the queue early (%d in all so far)",
                    held,
                    self.credit.cap,
                    self.taken_back_total,
                )
                self._take_back_logged = now
            if most is not None and len(overdue) >= most:
                return []  # (this call's work is done: what else is overdue, and the deliveries, come next)
        credit, room = self._available(now), self.pool.room()
        if credit <= 0 or room <= 0 or SEND in blocked:
            return []
        if most is not None:
            credit = min(credit, most - len(overdue))
        readiness = self.broker.readiness  # (as the take began: a take cut short raises it, and is no stall)
        # (as runs of stored records, no Message a delivery: take_run looks at each only where a TTL, meta,
        # a delivery cap, a lease range or a message that came back asks for it)
        taken = self.broker.take_columns(
            self.queue,
            credit,
            CONSUMER,
            now=now,
            now_us=now_us,
            max_bytes=room if most_bytes is None else min(room, most_bytes),
            payer=self.pool.payer,
        )
        self.dispatched += len(taken.refs)
        if not taken.refs:
            self._stalled_at = readiness
            return []
        # native.delivery's frames, built inline: the two numbers once per run, the key from the ref
        head, make = [b"%d" % now_us, b"%d" % self.ack_timeout_us, b""], Send._make
        self.credit.sent_many(taken.refs, now)
        out = [
            # (the key: native.message_key)
            make((SEND, [b"%016d|%016x%016x" % (enqueued_us, *ref), *head, *frames], ref, False))
            for ref, enqueued_us, frames in zip(taken.refs, taken.enqueued, taken.frames, strict=True)
        ]
        self.dispatched_bytes = sum(taken.sizes)
        self.pool.handed(max(taken.sizes))
        return out

    def sendable(self, sends: Sequence[Send]) -> list[Send]:
        """Of deliveries that waited for room in the send socket's pipes (turns of a full socket), those
        still in flight: one that timed out or was taken back meanwhile is not sent."""
        deadline_of = self.broker.inflight.deadline_of(CONSUMER)
        return [send for send in sends if send.socket != SEND or deadline_of(send.token) is not None]  # type: ignore[arg-type]

    def unsent(self, send: Send) -> bool:
        """A delivery the send socket would not take is ready again (False); replies are kept (True)."""
        return bool(self.unsent_many([send]))

    def unsent_many(self, sends: Sequence[Send]) -> list[Send]:
        """A run of sends that could not leave: deliveries go back to the queue; returns what to keep
        for later (producers' acks, which the endpoint's backlog never gives back)."""
        refs: list[Ref] = [send.token for send in sends if send.socket == SEND]  # type: ignore[misc]
        self.broker.undeliver_many(refs)
        for ref in refs:
            self.credit.forget(ref)
        return [send for send in sends if send.socket != SEND]

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        """The commit failed: a producer's "stored" becomes "store failure", errors stay, deliveries
        (of a state that is gone) are dropped."""
        out = []
        if self._upload is not None:  # (its parts of earlier turns are dropped by the store)
            self._upload = None
            self._owed.append(_failed(*self._uploader))
        for send in [*sends, *self._owed]:
            if send.socket != RECEIVE:
                continue
            if send.token is not None:  # a batch's answer
                out.append(self.batches.rolled_back(send))
                continue
            stored = native.stored_ack(send.frames)
            out.append(send if stored is None else _failed(*stored))
        self._owed = []
        return out

    def recover(self) -> None:
        """The broker forgot deliveries (a rolled-back turn: this turn's, or all of them after a bug):
        so does the credit."""
        self.credit.retain(self._ours)
        self.batches.load()

    def next_wake(self, now: float) -> float | None:
        """When the oldest young delivery stops counting against the credit, or the pool's closed epochs
        are next worth a look (no message wakes us then)."""
        wakes = [t for t in (self.credit.wake_at(), self.pool.next_check()) if t is not None]
        return min(wakes) if wakes else None

    def stats(self) -> dict:
        """The consumers' credit window, young deliveries, and deliveries taken back early."""
        return {
            "consumer_window_ms": round(self.credit.window_s * 1000, 1),
            "young_deliveries": self.credit.young,
            "taken_back_total": self.taken_back_total,
            **self.pool.stats(),
            **self.batches.stats(),
        }

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        """None to list: ZeroMQ does not name a socket's peers, and the DEALER hides its consumers."""
        return []

    def queue_consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        return [], 0  # (as clients: the DEALER's consumers are not told apart)

    def _all_failed(self, messages: Sequence[list[bytes]], limit: int) -> list[Send]:
        """The answers to producers' messages of a turn that failed before they were stored."""
        return [send for frames in messages if (send := self._failed_one(frames, limit)) is not None]

    def _failed_one(self, frames: list[bytes], limit: int) -> Send | None:
        if is_batch(frames):
            return self.batches.failed(frames)
        event = native.parse_produce(frames, limit)
        if isinstance(event, native.Rejected):
            return Send(RECEIVE, native.refusal(event))
        return None if event is None else _failed(event.routing, event.message_id)

    def _available(self, now: float) -> int:
        return self.credit.available(now, self.broker.held_count(CONSUMER))

    def _ours(self, ref: Ref) -> bool:
        return self.broker.deadline(ref, CONSUMER) is not None


def _failed(routing: bytes, message_id: bytes) -> Send:
    return Send(RECEIVE, native.produce_ack(routing, message_id, native.STORE_FAILED))


ref_of_key = native.key_ref  # (the message a consumer's key names, or None: the codec reads keys)
