"""The native PZQ protocol on the shared store: producers' runs of messages, consumers' acks, credit.

Two sockets (docs/protocols.md, "The native protocol"): producers speak on ``receive`` (the server's ROUTER: each
message starts with the producer's routing frame, and so does each ack), consumers on ``send`` (the
server's DEALER, which picks the consumer itself: deliveries carry no routing frame, and a consumer's
answer arrives without one). The DEALER hides which consumer got what, so every delivery is held by
one holder, ``CONSUMER``, sized by one credit pool (pzq/credit.py), and their bodies are charged to one
pool of bytes (pzq/gateways/native_pool.py: its epochs are the payers).

Inputs and outputs are runs: ``received_many`` takes every message a socket gave in a turn; a producer
run is stored by gateways/native_produce.py (one ``produce_many`` call, acknowledged in the order the
messages came; batched frames and big messages there too); a consumer's run of acks is settled by
``ack_many``; ``dispatch`` hands out one ``take`` of as many as the credit allows. This module is the
consumers' side and the gateway's face. Nothing here touches a socket or reads a clock: the turn's
``Now`` is passed in, and every ``Send`` leaves only after the turn's commit.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence

from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.credit import NativeCredit
from pzq.gateways.contract import BrokerSurface, Ref, Send
from pzq.gateways.native_batches import Batches
from pzq.gateways.native_pool import SendPool
from pzq.gateways.native_produce import RECEIVE, Producers
from pzq.logs import warn_bad
from pzq.protocols import native
from pzq.store.dedup_keys import DedupKeys

log = logging.getLogger("pzq.server")

SEND = "send"  # consumers: the server's DEALER (its sends have no routing frame)
CONSUMER = "native"  # the holder of every delivery through the send socket: one credit pool
TAKE_BACK_LOG_S = 10.0  # at most one line this often about deliveries taken back early


class NativeGateway:
    """Stores what producers send and acks it after the commit; hands ``queue`` to consumers, at most
    ``max_inflight`` young deliveries at once (see NativeCredit)."""

    def __init__(
        self,
        broker: BrokerSurface,
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
        self.producers = Producers(broker, queue, self.batches, max_message_size=max_message_size)
        # Its deliveries of earlier turns stay in flight through a rolled-back turn (see Broker.rolled_back):
        # nothing here would forget them, and a consumer's ack is never answered, so it is done again.
        broker.deliveries.redo_on_rollback(CONSUMER)
        self.taken_back_total = 0
        self._take_back_logged = float("-inf")
        # The broker's readiness when a take found nothing: until it changes, nothing is ready for us.
        self._stalled_at: int | None = None
        self.dispatched = 0  # deliveries taken back and handed out by the last dispatch call
        self.dispatched_bytes = 0  # bytes of the bodies it handed out (when asked to bound them)

    # -- what arrives ----------------------------------------------------------------------------

    def received(self, socket: str, frames: list[bytes], *, now: Now, user: str | None = None) -> list[Send]:
        """One message from ``socket`` (a run of one); ``user`` is not needed by this protocol."""
        return self.received_many(socket, [frames], now=now)

    def received_many(self, socket: str, messages: Sequence[list[bytes]], *, now: Now) -> list[Send]:
        """A run of messages from ``socket``, in the order they came: what to answer (producers' acks,
        in that order; consumers' answers need none). Raises StoreError when the store failed: the
        turn is rolled back, and ``rolled_back`` then answers every producer of the run."""
        if socket == RECEIVE:
            return self.producers.received(messages, now.wall_us)
        self._answers(messages, now.mono)
        return []

    def received_big(self, frames: list[bytes], *, chunk: int, most: int, now_us: int) -> list[Send] | None:
        """A big message from the receive socket, written a part per call (see Producers.received_big)."""
        return self.producers.received_big(frames, chunk=chunk, most=most, now_us=now_us)

    @property
    def big_written(self) -> int:
        """Bytes of its body the last ``received_big`` call wrote."""
        return self.producers.big_written

    def _answers(self, messages: Sequence[list[bytes]], now: float) -> None:
        """Consumers' acks and nacks, settled in order; a run of acks in one ``ack_many``."""
        acks: list[Ref] = []
        keys: list[bytes] = []
        answered: set[Ref] = set()  # (acks settle at the run's end: a repeat must not count twice)
        timeout_s = self.ack_timeout_s
        deadline_of = self.broker.deliveries.deadline_of(
            CONSUMER
        )  # (deadline's answer, no call through the broker each)
        sent_at: list[tuple[Ref, float | None]] = []  # (told to the credit in one call, in order)
        for frames in messages:
            answer = native.consumer_answer(frames)
            if answer is None:
                warn_bad("consumer", "short", f"{len(frames)} frame(s), expected [key, ack]")
                continue
            key, ok = answer
            ref = ref_of_key(key)
            if ref is None:
                warn_bad("consumer", "bad-key", f"unknown message key {key[:80]!r}")
                continue
            due = None if ref in answered else deadline_of(ref)
            answered.add(ref)
            sent_at.append((ref, None if due is None else due - timeout_s))
            if ok:
                acks.append(ref)
                keys.append(key)
                continue
            self._ack_run(acks, keys)  # (a nack settles after the acks before it)
            self.credit.answered_many(sent_at, now)
            sent_at.clear()
            if not self.broker.requeue(ref, by=CONSUMER):
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
            and self.broker.ready_count(self.queue) > 0
        )

    def dispatch(
        self,
        *,
        now: Now,
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
        held = self.broker.deliveries.count(CONSUMER)
        overdue = self.credit.overdue(held, self.broker.deliveries.held_by(CONSUMER), most)
        self.dispatched, self.dispatched_bytes = len(overdue), 0
        if overdue:
            self.broker.take_back_many(overdue, by=CONSUMER)
            self.taken_back_total += len(overdue)
            # (a consumer that acks late takes this path every turn: one line per TAKE_BACK_LOG_S)
            if now.mono >= self._take_back_logged + TAKE_BACK_LOG_S:
                log.warning(
                    "native consumers hold %d unacknowledged deliveries together (the most is %d): the "
                    "oldest went back to the queue early (%d in all so far)",
                    held,
                    self.credit.cap,
                    self.taken_back_total,
                )
                self._take_back_logged = now.mono
            if most is not None and len(overdue) >= most:
                return []  # (this call's work is done: what else is overdue, and the deliveries, come next)
        credit, room = self._available(now.mono), self.pool.room()
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
            max_bytes=room if most_bytes is None else min(room, most_bytes),
            payer=self.pool.payer,
        )
        self.dispatched += len(taken.refs)
        if not taken.refs:
            self._stalled_at = readiness
            return []
        # native.delivery's frames, built inline: the two numbers once per run, the key from the ref
        head, make = [b"%d" % now.wall_us, b"%d" % self.ack_timeout_us, b""], Send._make
        self.credit.sent_many(taken.refs, now.mono)
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
        deadline_of = self.broker.deliveries.deadline_of(CONSUMER)
        return [send for send in sends if send.socket != SEND or deadline_of(send.token) is not None]  # type: ignore[arg-type]

    def unsent(self, send: Send) -> bool:
        """A delivery the send socket would not take is ready again (False); replies are kept (True)."""
        return bool(self.unsent_many([send]))

    def unsent_many(self, sends: Sequence[Send]) -> list[Send]:
        """A run of sends that could not leave: deliveries go back to the queue; returns what to keep
        for later (producers' acks, which the endpoint's backlog never gives back)."""
        refs: list[Ref] = [send.token for send in sends if send.socket == SEND]  # type: ignore[misc]
        self.broker.take_back_many(refs)
        for ref in refs:
            self.credit.forget(ref)
        return [send for send in sends if send.socket != SEND]

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        """The commit failed: a producer's "stored" becomes "store failure", errors stay, deliveries
        (of a state that is gone) are dropped."""
        return self.producers.rolled_back(sends)

    def recover(self) -> None:
        """The broker forgot deliveries (a rolled-back turn: this turn's, or all of them after a bug):
        so does the credit."""
        self.credit.retain(self.broker.deliveries.held_by(CONSUMER))
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

    def _available(self, now: float) -> int:
        return self.credit.available(now, self.broker.deliveries.count(CONSUMER))


ref_of_key = native.key_ref  # (the message a consumer's key names, or None: the codec reads keys)
