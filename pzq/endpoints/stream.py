"""Raw-TCP endpoints (PHPMQ, MQKS): a ZeroMQ STREAM socket feeding a ``StreamGateway``
(gateways/contract.py). This adapter owns the connections' limits, slow readers' backlogs and closing;
the gateway owns everything the protocol means.

Its work draws on the turn's budget: deliveries are handed out in runs (``Limits.turn_chunk`` records,
and the turn's bytes left), each drawn on the turn before the next is asked for, and a gateway's big
messages (gateways/parted.py: PHPMQ sends past ``body_chunk_bytes``) are written a part per turn. What
is sent to a connection is one send a turn (its deliveries, charged to it by the broker until they are
known gone, and its replies); libzmq keeps SNDHWM of them at most, then pzq's backlog (counted).

Bounded in bytes: each connection's deliveries by its share of delivered bytes (pzq/broker/accounts.py:
they stay charged until acked or its connection closes, wherever they wait), and what libzmq holds for
one by SNDHWM sends, 2 x --max-inflight: more than the deliveries a connection may hold (its credit), so
that a send is refused (a delivery taken back, to be taken again next turn) only past its share, never
while it reads; a PHPMQ connection is sent nothing else.

For a gateway that charges what it sends (MQKS: ``PipedGateway``), it reads what each peer's TCP
acknowledged (endpoints/unread.py) and closes a connection that leaves too much unacknowledged. On every
door, a connection whose peer acknowledges none of the bytes waiting for it for ``stuck_reader_s`` is
closed once it holds no delivery within its ack timeout (endpoints/stuck.py): its share is released."""

from __future__ import annotations

import logging

import zmq

from pzq.clock import Now
from pzq.config import Config
from pzq.endpoints.allow_ips import allowed, allowed_networks
from pzq.endpoints.base import Endpoint, Sockets
from pzq.endpoints.connwatch import shut
from pzq.endpoints.shares import ConnectionLimit
from pzq.endpoints.stream_closing import Closing
from pzq.endpoints.stuck import StuckReaders
from pzq.endpoints.unread import Unread
from pzq.gateways.contract import PacedGateway, PipedGateway, Send, StreamGateway
from pzq.gateways.parted import Parted
from pzq.logs import warn_bad
from pzq.zmqio import NOBLOCK, Again, peer_address, recv_frames_last, send_frames, source_fd

log = logging.getLogger("pzq.server")

BACKLOG_BYTES = 16 << 20  # unsent replies kept for a slow reader; past this its connection is closed
RETRY_S = 0.01  # how soon a backlog is tried again
UNREAD_S = 0.05  # how soon peers' acknowledgements are read again while some are awaited (endpoints/unread.py)


class StreamEndpoint(Endpoint):
    """A ZeroMQ STREAM socket is raw TCP inside the same poller as every other endpoint, with
    connect/disconnect notices and libzmq's buffering; each dispatch goes out as one send, which the
    legacy client needs (it reads a header in one 8-byte read). Memory per slow reader is bounded by
    its share of delivered bytes (what it was handed stays charged to it) and its send pipe (SNDHWM
    sends of a turn's output each; past it a dispatch is taken back, a reply waits in the backlog)."""

    def __init__(
        self,
        name: str,
        dsn: str,
        gateway: StreamGateway,
        config: Config,
        binder: Sockets,
        connections: ConnectionLimit | None = None,
    ):
        self.limits = config.limits  # (read_batch, turn_bytes: each socket's share of a turn)
        self.name = name
        self.connections = connections or ConnectionLimit(1 << 62)
        self.connections.join(name, gateway, self._close_for_share)
        self.allowed = allowed_networks(config.allow_ips)  # None: every address (the bind address decides)
        self.gateway = gateway
        # (MQKS: a gateway that serves a write's pipelined requests while the turn's budget lasts)
        self.paced: PacedGateway | None = gateway if isinstance(gateway, PacedGateway) else None
        # (PHPMQ: big sends written a part per turn; a connection with one waits behind it, read slowly)
        parts = getattr(gateway, "parts", None)
        self.parts: Parted | None = parts if isinstance(parts, Parted) else None
        # (MQKS: a gateway that charges what it sends until the peer's TCP has it: endpoints/unread.py)
        self.piped: PipedGateway | None = gateway if isinstance(gateway, PipedGateway) else None
        self.unread = Unread()
        # A connection whose peer acknowledges none of the bytes waiting for it (its deliveries' ack timeouts
        # past: they went back) is closed: 14 PHPMQ consumers that read nothing had held the memory bound's
        # whole room for deliveries for good, every consumer of every door then handed one message at a time
        self._fds: dict[bytes, int] = {}  # open connection -> libzmq's descriptor (SRCFD), where readable
        self._conn_of: dict[int, bytes] = {}
        self.stuck = StuckReaders(
            name, dsn, lambda: set(self._conn_of), config.limits, cut=self._cut_stuck, spare=self._holding
        )
        # SNDHWM: a turn's output for one connection is one send (see flush); RCVHWM: raw reads of up to
        # 8 KiB each wait for a turn to read them, a bound per connection (Limits.stream_pipe_reads)
        self.sock = binder.bind(
            zmq.STREAM,
            dsn,
            f"--{name}-dsn",
            SNDHWM=2 * config.max_inflight,
            RCVHWM=config.limits.stream_pipe_reads,
        )
        self.sockets = [self.sock]
        self.closing = Closing()  # (connections we close: their close frames, and a memory of them)
        self._out: list[Send] = []
        self._backlog: dict[bytes, list[bytes]] = {}  # per slow connection: bytes to send, in order
        self.closed_total = 0  # connections closed for bad input or for reading too slowly
        self._peers: dict[bytes, tuple[str, int]] = {}  # open connection -> ("ip:port", connected since, µs)

    def read(self, ready: dict, now: Now) -> None:
        if self.sock in ready:
            self._read(now)
        if self.paced is not None and self.paced.waiting():  # one line of each connection in turn
            self._out += self.paced.serve(now=now, budget=self.budget)
            for conn in self.paced.served():
                if conn in self.gateway.sessions:  # (what it holds went down: it may have room again)
                    self.connections.hold(self.name, conn, self.gateway.buffered(conn))

    def _read(self, now: Now) -> None:
        """Read the socket's connections, libzmq's fair queue taking one chunk of each in turn. A paced
        gateway's lines are served after (``serve``), so reading goes on past the turn's budget until a
        connection comes round again: each connection with input is read once a turn, whatever the
        others sent. A connection without room (``ConnectionLimit.room``: it holds too much unserved), or
        with a big message still being written (``parts``: what it sends next waits behind it), is read at
        most once a turn; the rest waits in its pipe and TCP (back-pressure) while the others are read, and
        it is closed only past its whole share. While the big messages waiting to be written are past their
        bound (``Parted.full``: PHPMQ cannot answer "busy"), nothing is read."""
        sessions = self.gateway.sessions
        budget = self.limits.turn_bytes  # (this socket's share; the turn's budget, shared, may end it first)
        restricted: set[bytes] = set()  # read this turn once the budget was spent or while without room
        parts = self.parts
        for _ in range(self.limits.read_batch):
            if budget <= 0 or (self.budget.spent() and self.paced is None) or (parts is not None and parts.full):
                return
            try:
                (conn, data), last = recv_frames_last(self.sock, NOBLOCK)
            except Again:
                return
            budget -= len(data)
            if self.paced is None:  # (a paced gateway's lines draw on the turn when they are served, not read:
                self.budget.take(len(data))  # bytes read to be kept had left it nothing to serve them with)
            if data == b"":  # STREAM's notice: the first for a peer is its connect, the next its close
                if conn in sessions:
                    self._backlog.pop(conn, None)
                    self._gone(conn)
                elif conn not in self.closing.pending and self.closing.closed.pop(conn, None) is None:
                    self._connect(conn, *peer_address(last), now.wall_us)
                    if conn in sessions and (fd := source_fd(last)) >= 0:
                        self._fds[conn], self._conn_of[fd] = fd, conn
                        if self.piped is not None:
                            self.unread.opened(conn, fd)
                continue
            if conn in self.closing.pending or conn in self.closing.closed:
                continue
            if self.paced is not None:
                sends = self.paced.keep(conn, data)  # (served after the reads: ``serve``)
            else:
                before = getattr(self.gateway, "received_total", 0)
                sends = self.gateway.received(conn, data, now=now)
                # (a record a message, as every door counts them: a read of tiny PHPMQ sends or acks held ~110)
                if (more := getattr(self.gateway, "received_total", 0) - before - 1) > 0:
                    self.budget.take(records=more)
            self._out += sends
            if sends and sends[-1].close:
                self._close(conn)
                continue
            for name, victim in self.connections.hold(self.name, conn, self.gateway.buffered(conn)):
                self.connections.close(name, victim)
            if (
                self.paced is not None
                and (self.budget.spent() or not self.connections.room(self.name, conn))
                or parts is not None
                and parts.busy(conn)
            ):
                if conn in restricted:  # come round again in the fair queue: every other one was read
                    return
                restricted.add(conn)

    def _connect(self, conn: bytes, peer: str, address: str, now_us: int) -> None:
        """A new connection from IP ``peer`` ("ip:port" ``address``): accepted, or closed at once (not
        allowed, or no room for it)."""
        if self.allowed is not None and not allowed(peer, self.allowed):
            warn_bad(self.name, "not-allowed", f"connection from {peer or 'an unknown address'} refused by --allow-ips")
            self.closing.pending.append(conn)
        elif self.connections.full(len(self.gateway.sessions)):
            warn_bad(
                self.name,
                "too-many-connections",
                f"{self.connections.total()} connections are "
                f"open (--max-connections {self.connections.limit}, at most "
                f"{self.connections.per_endpoint} on one endpoint, {self.connections.reserve} kept for "
                "each): a new one was closed at once",
            )
            self.closing.pending.append(conn)
        else:
            self.gateway.connected(conn, address)  # (its network's permissions apply to it)
            self._peers[conn] = (address, now_us)

    def _close_for_share(self, conn: bytes) -> None:
        """Close ``conn``, which holds more unfinished input than its share (``ConnectionLimit.hold``)."""
        if conn not in self.gateway.sessions:
            return  # (already closed)
        share = self.connections
        warn_bad(
            self.name,
            "partial-input",
            f"a connection holds more unfinished input than its share ({share.connection_share} bytes of one, "
            f"{share.partial_reserve} kept for each endpoint, {share.partial_limit} in all: --max-partial-input); "
            "closing it",
        )
        self._close(conn)

    def narrowed(self, lost: dict[str, set[str]]) -> None:
        """The permissions changed (SIGHUP): connections consuming a queue their network may no longer
        consume are closed at once (a per-request check would not stop deliveries to a standing consumer)."""
        cut = [conn for conn in self.gateway.narrowed() if conn in self.gateway.sessions]
        if cut:  # (one line, however many: a narrowed network may have thousands of consumers)
            log.warning(
                "SIGHUP: %d %s connection(s) consuming a queue their network may no longer consume closed (%s)",
                len(cut),
                self.name,
                ", ".join(self._peers.get(conn, ("?", 0))[0] for conn in cut[:5]) + (", ..." if len(cut) > 5 else ""),
            )
        for conn in cut:
            self._gone(conn)
            self.closing.pending.append(conn)

    def _close(self, conn: bytes) -> None:
        self.closed_total += 1
        self._gone(conn)
        self.closing.pending.append(conn)

    def work(self, now: Now) -> None:
        # Deliveries a run at a time (Limits.turn_chunk), each drawn on the turn's records and their bodies
        # on its bytes: a PHPMQ consumer asking for 1,000 of 1 MiB was handed 700 MiB in one turn (a
        # second and more of the loop), and every client waited for it
        if self.piped is not None and self.unread.pending:
            self._read_back(self.piped)
        if self._conn_of and (most := self.budget.records_for(self.limits.stuck_checks_per_turn)):
            if looked := self.stuck.check(now.mono, most):  # (a look is two system calls: a record)
                self.budget.take(records=looked)
        blocked = frozenset(self._backlog)
        while most := self.budget.records_for(self.limits.turn_chunk):
            most_bytes = max(self.budget.bytes_left, 1)
            self._out += self.gateway.dispatch(now=now, blocked=blocked, most=most, most_bytes=most_bytes)
            done = self.gateway.dispatched
            self.budget.take(self.gateway.dispatched_bytes, records=done)
            if done < most:  # nothing more to hand out now (no credit, nothing ready, no room)
                break
        if self.parts is not None and self.parts.pending:  # after the deliveries: they are not starved by it
            self._out += self._closes(self.parts.step(self.budget, now.wall_us))
            for conn in self.parts.settled():  # (what it holds went down: its share of unfinished input)
                if isinstance(conn, bytes) and conn in self.gateway.sessions:
                    self.connections.hold(self.name, conn, self.gateway.buffered(conn))

    def _closes(self, sends: list[Send]) -> list[Send]:
        """Close the connections ``sends`` ask to close (a send the store refused: PHPMQ's only signal);
        the rest goes out after the commit."""
        out = []
        for send in sends:
            if send.close:
                if send.peer in self.gateway.sessions:
                    self._close(send.peer)
            else:
                out.append(send)
        return out

    def _read_back(self, piped: PipedGateway) -> None:
        """What peers' TCP acknowledged is no longer charged to them; a connection whose charged bytes
        are past its share and a slow reader's backlog (replies it leaves unread: the rest stops at its
        share) is closed, as a slow reader is."""
        back, over = self.unread.read_back(self.limits.delivery_share + self.limits.stream_backlog_bytes)
        for conn, size in back:
            piped.unpiped(conn, size)
        for conn in over:
            log.warning(
                "%s connection %s reads too slowly (%d bytes sent and not acknowledged): closing it",
                self.name,
                conn.hex(),
                self.unread.charged(conn),
            )
            self._close(conn)

    def waiting(self) -> bool:
        # (a big message's part written this turn: committed now, so that no commit carries more)
        writing = self.parts is not None and self.parts.writing or self.paced is not None and self.paced.writing
        return bool(self._out) or writing

    def rolled_back(self) -> None:
        out, self._out = self._out, []
        self._out = self.gateway.rolled_back(out)  # the gateway decides what may still be said
        if self.parts is not None:  # (its big messages whose parts the turn lost)
            self._out += self._closes(self.parts.rolled_back())

    def output_waiting(self) -> bool:
        return bool(self._out)

    def flush(self, now: Now) -> None:
        if self.parts is not None:
            self.parts.flushed()
        if self.paced is not None:
            self.paced.flushed()
        out, self._out = self._out, []
        by_conn: dict[bytes, list[Send]] = {conn: [] for conn in self._backlog}
        for send in out:
            if len(send.frames) > 1:  # (a bare close has no bytes)
                by_conn.setdefault(send.peer, []).append(send)
        # One send per connection and turn (a client's lines in one TCP write), after its backlog.
        for conn, sends in by_conn.items():
            backlog = self._backlog.pop(conn, [])
            data = b"".join(backlog) + b"".join(b"".join(send.frames[1:]) for send in sends)
            try:
                send_frames(self.sock, [conn, data], NOBLOCK)
                if self.piped is not None and data and self.unread.tracks(conn):  # (charged until its TCP has it)
                    earlier = sum(map(len, backlog))  # (a backlog holds no manual-ack delivery: see unsent)
                    self.unread.sent(conn, len(data), self.piped.piped(conn, sends, earlier))
            except Again:  # the client reads too slowly
                kept = backlog + [
                    b"".join(send.frames[1:]) for send in sends if send.token is None or self.gateway.unsent(send)
                ]
                if sum(map(len, kept)) > BACKLOG_BYTES:
                    log.warning(
                        "%s connection %s reads too slowly (%d bytes waiting): closing it",
                        self.name,
                        conn.hex(),
                        sum(map(len, kept)),
                    )
                    self._close(conn)
                elif kept:
                    self._backlog[conn] = kept
            except zmq.ZMQError:  # gone since its bytes were read (EHOSTUNREACH)
                self._gone(conn)
        self.closing.send(self.sock, now.mono)

    def _holding(self, fd: int) -> bool:
        conn = self._conn_of.get(fd)
        return conn is not None and self.gateway.holding(conn)

    def _cut_stuck(self, fd: int, endpoint: str) -> None:
        """``fd``'s peer read nothing for ``stuck_reader_s`` (logged): closed, and its descriptor shut down
        (a close frame waits behind what its pipe holds)."""
        conn = self._conn_of.get(fd)
        if conn is not None and conn in self.gateway.sessions:
            self._close(conn)
            shut(fd, endpoint)

    def _gone(self, conn: bytes) -> None:
        fd = self._fds.pop(conn, None)
        if fd is not None and self._conn_of.get(fd) == conn:
            del self._conn_of[fd]
        self._peers.pop(conn, None)
        self.unread.gone(conn)
        self.gateway.disconnected(conn)
        self.connections.hold(self.name, conn, 0)

    def recover(self) -> None:
        self.gateway.recover()

    def wake_at(self, now: float) -> float | None:
        if self.paced is not None and self.paced.waiting() or self.parts is not None and self.parts.pending:
            return now
        if self._backlog or self.closing.pending:
            return now + RETRY_S
        if self.unread.pending:  # (what peers acknowledged since: their charges go, their room comes back)
            return now + UNREAD_S
        return self.gateway.next_wake(now)

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        tables = [{**table, "gateway": self.name} for table in self.gateway.clients(now, limit, offset)]
        for table in tables:  # (a connection's first column is its id in hex: what it is known by here)
            if table["columns"][:1] == ["connection"]:
                table["columns"] = [*table["columns"], "address", "connected_us"]
                table["rows"] = [[*row, *self._peers.get(bytes.fromhex(row[0]), ("", 0))] for row in table["rows"]]
        return tables

    def consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        rows, total = self.gateway.queue_consumers(queue, limit)
        for row in rows:
            row["address"], row["connected_us"] = self._peers.get(row.pop("conn"), ("", 0))
        return rows, total

    def memory(self) -> dict[str, int]:
        parts = {} if self.parts is None else {f"{self.name}_big": self.parts.bodies_bytes}
        return {
            f"{self.name}_backlogs": sum(len(chunk) for chunks in self._backlog.values() for chunk in chunks),
            # (with the sends waiting behind big ones: a connection's requests not yet applied)
            f"{self.name}_partial_input": self.connections.partial_of(self.name),
            **parts,
        }

    def stats(self) -> dict:
        return {
            **self.gateway.stats(),
            "closed_bad_input_total": self.closed_total,
            "stuck_readers_cut_total": self.stuck.cut_total,  # (read nothing, held nothing in time)
            # (the unfinished input of every raw-TCP connection together, as --max-partial-input bounds it)
            "partial_input_bytes_all": self.connections.partial_total,
            "partial_input_bytes": self.connections.partial_of(self.name),  # (this endpoint's connections')
        }
