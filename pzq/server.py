"""The server: the only place that owns sockets. One thread, one poller, one loop.

Each turn of the loop:
  1. polls every socket, with a timeout that ends at the next ack deadline (never a busy loop);
  2. reads what arrived (bounded per socket, so one busy peer cannot starve the others) and feeds it to
     the protocol codecs and the broker;
  3. requeues expired deliveries and picks messages for consumers with credit;
  4. commits the turn's writes in one durable transaction (group commit);
  5. only then sends producer acks, deliveries and monitor replies.
Step 5 after step 4 is the durability promise: no ack leaves for data that is not on disk.
"""
from __future__ import annotations

import logging
import os
import signal
import time

import zmq

from pzq.admin import Admin
from pzq.broker import Broker, Ref
from pzq.config import Config
from pzq.errors import ConfigError, ProtocolError, StoreError, StoreFull
from pzq.gateways.api import ApiGateway
from pzq.gateways.emqp import BACK, FRONT, EmqpGateway
from pzq.gateways.phpmq import PhpmqGateway
from pzq.leases import Leases
from pzq.logs import warn_bad
from pzq.protocols import api as api_proto
from pzq.protocols import monitor as monitor_proto
from pzq.protocols import pzq as native
from pzq.store import Message, Store, parse_message_id
from pzq.zmqio import NOBLOCK, POLLIN, POLLOUT, Again, events, recv_frames, send_frames

log = logging.getLogger("pzq.server")

READ_BATCH = 4096  # messages read from one socket per turn
NATIVE_CONSUMER = "native"  # the send socket's DEALER hides which consumer got what: one credit pool
TICK_S = 1.0  # housekeeping (rates); idle wake-ups are at most this frequent
MAX_FAILED_TURNS = 100


class Server:
    """A pzq server on one Config. ``start()`` binds, ``run()`` loops until ``stop()`` or a signal."""

    def __init__(self, config: Config, *, context: zmq.Context | None = None):
        self.config = config
        self.ctx = context or zmq.Context.instance()
        self.store: Store | None = None
        self.broker: Broker | None = None
        self._sockets: list[zmq.Socket] = []
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._next_tick = 0.0
        self._native_stalled = False
        self._dirty_since: float | None = None  # when uncommitted writes nobody waits for began
        self._next_lease_check = 0.0

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the store and bind every endpoint; raises ConfigError or StoreError with a clear text."""
        cfg = self.config
        self.store = Store(cfg.database, max_size=cfg.max_store_size, sync=cfg.hard_sync)
        self.store.queue(cfg.queue)
        self.store.commit()
        self.broker = Broker(self.store, ack_timeout_s=cfg.ack_timeout / 1e6, max_deliveries=cfg.max_deliveries)
        self.receive = self._bind(zmq.ROUTER, cfg.receive_dsn, "--receive-dsn")
        self.receive.setsockopt(zmq.MAXMSGSIZE, cfg.max_message_size + 4096)
        self.receive.setsockopt(zmq.LINGER, 2000)  # let the last acks out on shutdown
        self.send = self._bind(zmq.DEALER, cfg.send_dsn, "--send-dsn")
        self.send.setsockopt(zmq.SNDHWM, max(cfg.max_inflight, 1000))
        self.send.setsockopt(zmq.LINGER, 0)  # unsent deliveries are still stored: nothing to flush
        self.monitor = self._bind(zmq.ROUTER, cfg.monitor_dsn, "--monitor-dsn")
        _restrict_ipc(cfg.monitor_dsn)
        self.poller = zmq.Poller()
        self.poller.register(self.receive, zmq.POLLIN)
        self.poller.register(self.send, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.poller.register(self._wake_r, zmq.POLLIN)
        self.phpmq_sock = None
        self.phpmq = PhpmqGateway(self.broker, max_content=cfg.max_message_size, dialect=cfg.phpmq_dialect,
                                  max_credit=cfg.max_inflight)
        self._phpmq_closed: dict[bytes, float] = {}  # closed by us: STREAM gives no notice for those
        if cfg.phpmq_dsn:
            # A ZeroMQ STREAM socket is raw TCP inside the same poller as every other endpoint, with
            # connect/disconnect notices and libzmq's buffering; each dispatch goes out as one send,
            # which the legacy client needs (it reads a header in one 8-byte read). Memory per slow
            # reader is bounded by its send pipe (SNDHWM messages; past it a dispatch is taken back).
            self.phpmq_sock = self._bind(zmq.STREAM, cfg.phpmq_dsn, "--phpmq-dsn")
            self.phpmq_sock.setsockopt(zmq.SNDHWM, 2 * cfg.max_inflight)
            self.poller.register(self.phpmq_sock, zmq.POLLIN)
        self.emqp = None
        if cfg.emqp_frontend_dsn:
            self.emqp_front = self._bind(zmq.ROUTER, cfg.emqp_frontend_dsn, "--emqp-frontend-dsn")
            self.emqp_back = self._bind(zmq.ROUTER, cfg.emqp_backend_dsn, "--emqp-backend-dsn")
            self.emqp_pub = (self._bind(zmq.PUB, cfg.emqp_publish_dsn, "--emqp-publish-dsn")
                             if cfg.emqp_publish_dsn else None)
            for sock in (self.emqp_front, self.emqp_back):
                sock.setsockopt(zmq.MAXMSGSIZE, cfg.max_message_size + 4096)
                self.poller.register(sock, zmq.POLLIN)
            self.emqp = EmqpGateway(self.broker, heartbeat_s=cfg.emqp_heartbeat_interval,
                                    liveness=cfg.emqp_heartbeat_liveness, publish=self.emqp_pub is not None,
                                    default_queues=[q.strip() for q in cfg.emqp_default_queues.split(",")
                                                    if q.strip()])
        # Leases are loaded even with the API off, so that messages a group held go back when it expires.
        self.leases = Leases(self.broker, timeout_s=cfg.lease_timeout)
        self.api = ApiGateway(self.broker, self.leases, max_message_size=cfg.max_message_size,
                              dedup_window_s=cfg.api_dedup_window)
        self.api_sock = None
        if cfg.api_dsn:
            self.api_sock = self._bind(zmq.ROUTER, cfg.api_dsn, "--api-dsn")
            self.api_sock.setsockopt(zmq.MAXMSGSIZE, cfg.max_message_size + (8 << 20))
            self.poller.register(self.api_sock, zmq.POLLIN)
        self.admin = Admin(self.broker, store_limit=cfg.max_store_size, gateways=self._gateway_stats)
        if cfg.user:
            _drop_privileges(cfg.user, cfg.database)
        log.info("pzq serving queue %r from %s: receive %s, send %s, monitor %s", cfg.queue, cfg.database,
                 cfg.receive_dsn, cfg.send_dsn, cfg.monitor_dsn)

    def _bind(self, kind: int, endpoint: str, option: str) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise ConfigError(f"{option} {endpoint}: cannot bind: {exc}") from None
        self._sockets.append(sock)
        return sock

    def stop(self) -> None:
        """Ask the loop to stop after the current turn; safe from another thread or a signal handler."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.stop())

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()
        if self.store is not None:
            self.store.close()
            self.store = None
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def run(self) -> None:
        """Serve until ``stop()``. The commit of the turn in progress always completes.

        A turn that fails on a bug (not on input: input errors are answered inside the turn) is
        rolled back like a store failure and the loop goes on; a run of MAX_FAILED_TURNS failing turns
        in a row means something is broken for good, and the server exits for its supervisor to
        restart it.
        """
        failed = 0
        while not self._stopping:
            try:
                self._turn(self._poll_timeout_ms())
                failed = 0
            except Exception:  # noqa: BLE001 - keep serving other clients; logged with its traceback
                failed += 1
                log.exception("unexpected error in the event loop (%d in a row); rolled back", failed)
                self._recover()
                if failed >= MAX_FAILED_TURNS:
                    raise
        log.info("pzq stopping: %d messages stored, %d commits", self.broker.stats()["messages"], self.store.syncs)

    # -- the loop ---------------------------------------------------------------------------------

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        wake = min(self._next_tick, now + self.config.reaper_frequency / 1e6)
        deadline = self.broker.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline)
        if self._dirty_since is not None:
            wake = min(wake, self._dirty_since + self.config.commit_interval / 1e6)
        if self.emqp is not None:
            wake = min(wake, self.emqp.next_heartbeat)
            due_us = self.emqp.next_schedule_us()
            if due_us is not None:  # schedules keep wall-clock times (they outlive restarts)
                wake = min(wake, now + (due_us - time.time_ns() // 1000) / 1e6)
        return max(0, int((wake - now) * 1000 + 0.999))

    def _turn(self, timeout_ms: int) -> None:
        want_out = (not self._native_stalled and self._native_credit() > 0
                    and self.broker.has_ready(self.config.queue))
        self.poller.modify(self.send, POLLIN | (POLLOUT if want_out else 0))
        ready = dict(self.poller.poll(timeout_ms))
        now, now_us = time.monotonic(), time.time_ns() // 1000
        if self._wake_r in ready:
            _drain_fd(self._wake_r)
        acks: list[tuple[bytes, bytes, str | None]] = []
        requests: list[monitor_proto.Request] = []
        deliveries: list[Message] = []
        closing: list[bytes] = []
        phpmq_out: list[tuple[bytes, bytes]] = []
        emqp_out: list = []
        api_out: list[list[bytes]] = []
        produced = self.broker.counters.produced
        try:
            if self.receive in ready:
                self._read_producers(acks, now_us)
                self._native_stalled = False
            if ready.get(self.send, 0) & POLLIN:
                self._read_consumer_answers()
                self._native_stalled = False
            if self.monitor in ready:
                self._read_monitor(requests)
            if self.phpmq_sock is not None and self.phpmq_sock in ready:
                self._read_phpmq(closing, now_us)
            if self.emqp is not None:
                self._read_emqp(ready, emqp_out, now, now_us)
            if self.api_sock is not None and self.api_sock in ready:
                self._read_api(api_out, now, now_us)
            if now >= self._next_lease_check:
                self._next_lease_check = now + TICK_S
                if self.leases.expire(now_us):
                    self._native_stalled = False
            if self.broker.expire(now):
                self._native_stalled = False
            deliveries = self._take_for_native(now, now_us)
            if self.phpmq.sessions:
                phpmq_out = self.phpmq.dispatch(now=now, now_us=now_us)
            if self.emqp is not None:
                self.emqp.run_schedules(now_us)
                emqp_out += self.emqp.tick(now)
                emqp_out += self.emqp.dispatch(now=now, now_us=now_us)
            # New messages are made durable at once, whether or not their protocol acks them.
            self._commit_if_due(now, waiting=bool(acks) or bool(phpmq_out) or bool(emqp_out) or bool(api_out)
                                or self.broker.counters.produced != produced)
        except StoreError:
            log.exception("store failure; this turn was rolled back and in-flight deliveries will repeat")
            self._recover()
            acks = [(r, m, err or native.STORE_FAILED) for r, m, err in acks]
            deliveries = []
            phpmq_out = []
            if self.emqp is not None:
                self.emqp.recover(emqp_out)
            emqp_out = []
            api_out = [api_proto.as_error(reply, "store-failed", "store failure: nothing was done, try again")
                       for reply in api_out]
        for routing, message_id, error in acks:
            send_frames(self.receive, native.produce_ack(routing, message_id, error))
        self._send_deliveries(deliveries, now_us)
        if phpmq_out or closing:
            self._send_phpmq(phpmq_out, closing, now)
        for target, frames in emqp_out:
            sock = self.emqp_front if target == FRONT else self.emqp_back if target == BACK else self.emqp_pub
            try:
                send_frames(sock, frames, NOBLOCK)
            except Again:
                log.warning("eMQP %s socket full: a message to %r was dropped", target, frames[0][:40])
        for reply in api_out:
            try:
                send_frames(self.api_sock, reply, NOBLOCK)
            except (Again, zmq.ZMQError):  # the client is gone; it resends after its timeout
                pass
        for request in requests:
            try:
                text, wrote = self.admin.answer(request)
                if wrote:  # the admin committed: nothing waits, and requeued letters are ready
                    self._dirty_since = None
                    self._native_stalled = False
            except StoreError as exc:
                log.exception("monitor request %s failed", request.command)
                self._recover()
                text = monitor_proto.error_text(str(exc))
            self.monitor.send_multipart(monitor_proto.reply(request, text))
        if now >= self._next_tick:
            self.admin.tick(now)
            self._next_tick = now + TICK_S

    def _recover(self) -> None:
        """Start over from what is on disk, as a restart would: uncommitted writes are dropped and
        whatever was in flight is ready again (at-least-once)."""
        self.store.abort()
        self.broker.reset()
        self.leases.load()
        self.api.load()
        self._dirty_since = None
        if self.emqp is not None:
            self.emqp.recover([])

    def _commit_if_due(self, now: float, waiting: bool) -> None:
        """Commit when a producer waits for its ack; otherwise let writes gather for commit_interval."""
        if not self.store.dirty:
            return
        if self._dirty_since is None:
            self._dirty_since = now
        interval = self.config.commit_interval / 1e6
        if waiting or now - self._dirty_since >= interval:
            self.store.commit(counts_older_than=now - interval)
            self._dirty_since = now if self.store.dirty else None

    def _read_producers(self, acks: list, now_us: int) -> None:
        queue, limit = self.config.queue, self.config.max_message_size
        for _ in range(READ_BATCH):
            try:
                frames = recv_frames(self.receive, NOBLOCK)
            except Again:
                return
            event = native.parse_produce(frames, limit)
            if event is None:
                continue
            if isinstance(event, native.Rejected):
                warn_bad("producer", event.error.code, event.error.detail)
                acks.append((event.routing, event.message_id, event.error.detail))
                continue
            try:
                self.broker.produce(queue, event.body, now_us=now_us)
            except StoreFull:
                acks.append((event.routing, event.message_id, native.QUEUE_FULL))
                continue
            acks.append((event.routing, event.message_id, None))

    def _read_consumer_answers(self) -> None:
        for _ in range(READ_BATCH):
            try:
                frames = recv_frames(self.send, NOBLOCK)
            except Again:
                return
            answer = native.parse_consumer_ack(frames)
            if answer is None:
                warn_bad("consumer", "short", f"{len(frames)} frame(s), expected [key, ack]")
                continue
            ref = _ref_of_key(answer.key)
            if ref is None:
                warn_bad("consumer", "bad-key", f"unknown message key {answer.key[:80]!r}")
                continue
            if answer.ok:
                if not self.broker.ack(ref):
                    log.info("ack for a message no longer stored (or now held by a lease): %r", answer.key[:80])
            else:
                self.broker.nack(ref)

    def _read_phpmq(self, closing: list, now_us: int) -> None:
        for _ in range(READ_BATCH):
            try:
                conn, data = recv_frames(self.phpmq_sock, NOBLOCK)
            except Again:
                return
            if data == b"":  # STREAM's notice: the first for a peer is its connect, the next its close
                if conn in self.phpmq.sessions:
                    self.phpmq.disconnected(conn)
                elif conn not in closing and self._phpmq_closed.pop(conn, None) is None:
                    self.phpmq.connected(conn)
                continue
            if conn in closing or conn in self._phpmq_closed:
                continue
            try:
                self.phpmq.received(conn, data, now_us=now_us)
            except ProtocolError as exc:
                warn_bad("phpmq", exc.code, f"{exc.detail}; closing the connection")
                self.phpmq.closed_total += 1
                self.phpmq.disconnected(conn)
                closing.append(conn)

    def _send_phpmq(self, out: list, closing: list, now: float) -> None:
        for conn, data, ref in out:
            try:
                send_frames(self.phpmq_sock, [conn, data], NOBLOCK)
            except Again:  # the client reads too slowly: the message stays stored for later
                self.broker.undeliver(ref)
            except zmq.ZMQError:  # gone since its bytes were read (EHOSTUNREACH)
                self.phpmq.disconnected(conn)
        for conn in closing:
            try:
                send_frames(self.phpmq_sock, [conn, b""], NOBLOCK)  # an empty frame closes a STREAM peer
            except zmq.ZMQError:
                pass
            self._phpmq_closed[conn] = now
        for conn in [c for c, t in self._phpmq_closed.items() if now - t > 60]:
            del self._phpmq_closed[conn]

    def _read_emqp(self, ready: dict, out: list, now: float, now_us: int) -> None:
        for sock, handle in ((self.emqp_front, self.emqp.from_client), (self.emqp_back, self.emqp.from_worker)):
            if sock not in ready:
                continue
            for _ in range(READ_BATCH):
                try:
                    frames = recv_frames(sock, NOBLOCK)
                except Again:
                    break
                out += handle(frames, now=now, now_us=now_us)

    def _read_api(self, out: list, now: float, now_us: int) -> None:
        for _ in range(READ_BATCH):
            try:
                frames = recv_frames(self.api_sock, NOBLOCK)
            except Again:
                return
            reply = self.api.handle(frames, now=now, now_us=now_us)
            if reply is not None:
                out.append(reply)

    def _native_credit(self) -> int:
        return self.config.max_inflight - self.broker.inflight.count(NATIVE_CONSUMER)

    def _take_for_native(self, now: float, now_us: int) -> list[Message]:
        credit = self._native_credit()
        if credit <= 0 or not events(self.send) & POLLOUT:
            return []
        taken = self.broker.take(self.config.queue, credit, NATIVE_CONSUMER, now=now, now_us=now_us)
        if not taken:
            self._native_stalled = True
        return taken

    def _send_deliveries(self, deliveries: list[Message], now_us: int) -> None:
        timeout_us = self.config.ack_timeout
        for i, message in enumerate(deliveries):
            frames = native.delivery(native.message_key(message.enqueued_us, message.id), now_us, timeout_us,
                                     message.frames)
            try:
                send_frames(self.send, frames, NOBLOCK)
            except Again:
                # The last consumer left between the writability check and now: keep the rest stored.
                for rest in deliveries[i:]:
                    self.broker.undeliver((rest.qid, rest.seq))
                return

    # -- monitor ----------------------------------------------------------------------------------

    def _read_monitor(self, requests: list) -> None:
        for _ in range(64):
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            requests.append(monitor_proto.parse_request(frames))

    def stats(self) -> dict:
        """Every figure the monitor reports, the six PZQ fields first."""
        return self.admin.stats()

    def _gateway_stats(self) -> dict:
        out = {}
        if self.phpmq_sock is not None:
            out["phpmq"] = self.phpmq.stats()
        if self.emqp is not None:
            out["emqp"] = self.emqp.stats()
        if self.api_sock is not None:
            out["api"] = self.api.stats()
        return out


def _ref_of_key(key: bytes) -> Ref | None:
    mid = native.key_message_id(key)
    return None if mid is None else parse_message_id(mid)


def _drain_fd(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _restrict_ipc(endpoint: str) -> None:
    """Make an ipc socket file owner-only, so other local users cannot reach it."""
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        try:
            os.chmod(endpoint[len("ipc://"):], 0o600)
        except OSError as exc:
            log.warning("cannot restrict %s to its owner: %s", endpoint, exc)


def _drop_privileges(user: str, database: str) -> None:
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ConfigError(f"--user: no such user {user!r}") from None
    if os.getuid() != 0:
        if os.getuid() != entry.pw_uid:
            raise ConfigError(f"--user {user}: only root can switch users")
        return
    for root, dirs, files in os.walk(database):
        for name in [root, *(os.path.join(root, f) for f in files)]:
            os.chown(name, entry.pw_uid, entry.pw_gid)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    log.info("dropped privileges to %s", user)


def serve(config: Config) -> None:
    """Run a server in this process until SIGTERM or SIGINT; the CLI's `pzq serve`."""
    server = Server(config)
    try:
        server.start()
        server.install_signal_handlers()
        server.run()
    finally:
        server.close()
