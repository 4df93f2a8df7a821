"""What every endpoint adapter offers the server loop; each step has a do-nothing default. Also the
turn's budget (``TurnBudget``), which the loop shares among every endpoint and periodic task."""

from __future__ import annotations

import itertools
import logging
import os
import stat
import time
from collections.abc import Callable

import zmq

from pzq.clock import Now
from pzq.curve import CurveServer, Gate
from pzq.endpoints.memory import UNWATCHED, MemoryAlarm
from pzq.errors import ConfigError
from pzq.logs import warn_bad
from pzq.zmqio import peer_of_fd, recv_frames, recv_frames_fd, recv_frames_user

log = logging.getLogger("pzq.server")

_watch_ids = itertools.count(1)
REBIND_WAIT_S = 2.0  # how long a revocation may hold the loop while a re-made socket waits for its address


class Sockets:
    """Makes the server's bound sockets: remembers them (to close or re-bind them), and sets options
    before the bind, where libzmq copies them into the listener (options set later never reach the
    connections it accepts).

    With CURVE configured, every ZeroMQ endpoint (tcp:// and ipc://; inproc:// never leaves the process)
    is a CURVE server unless its role (``--receive-dsn`` -> ``receive``) is named in
    ``unauthenticated``."""

    def __init__(
        self, ctx: zmq.Context, curve: CurveServer | None = None, unauthenticated: frozenset[str] = frozenset()
    ):
        self.ctx = ctx
        self.curve = curve
        self.unauthenticated = unauthenticated
        self.owned: list[zmq.Socket] = []
        self.open_roles: list[str] = []  # bound without authentication, for the start-up log
        self._made: dict[zmq.Socket, tuple] = {}  # how each was made, to re-bind it
        self._unbound: dict[zmq.Socket, str] = {}  # re-made, waiting for its address to be free
        # The socket monitor (an inproc PAIR) of each bound tcp:// ZeroMQ socket -> (role,
        # socket): libzmq accepts connections by itself, and its events are how pzq counts them.
        self.monitors: dict[zmq.Socket, tuple[str, zmq.Socket]] = {}
        # Told the descriptor of each connection a watched socket loses (its monitor's DISCONNECTED
        # event; ConnectionWatch calls them): the memory bound forgets what that peer's pipe held.
        self.on_disconnect: dict[zmq.Socket, Callable[[int], None]] = {}
        # The descriptors of each watched socket's open connections, as its monitor's events have told
        # so far; ``drain_events(sock)`` reads the events waiting now (set by ConnectionWatch).
        self.open_fds: dict[zmq.Socket, set[int]] = {}
        # When each of those connections was accepted (epoch µs), by descriptor, for the console's lists
        # (bounded as the connections are: --max-connections); its peer's address is read only for the
        # rows a page shows (``peer``), not at every accept
        self.peers: dict[zmq.Socket, dict[int, int]] = {}
        self.drain_events: Callable[[zmq.Socket], None] = lambda sock: None

    def peer(self, sock: zmq.Socket, fd: int) -> tuple[str, int]:
        """The "ip:port" of ``sock``'s connection on descriptor ``fd`` and since when it is connected
        (epoch µs); ("", 0) for a connection not known (ipc://, or gone)."""
        since = self.peers.get(sock, {}).get(fd)
        return ("", 0) if since is None else (peer_of_fd(fd), since)

    def bind(self, kind: int, endpoint: str, option: str, **options) -> zmq.Socket:
        """A socket of ``kind`` bound to ``endpoint`` (linger 0 unless given); ConfigError naming
        ``option`` if it cannot bind. ``options`` must give SNDHWM and RCVHWM: what each of its pipes
        may hold is part of the memory bound (docs/limits.md), so no socket is bound without saying it.
        And MAXMSGSIZE (but a STREAM's, raw TCP read 8 KiB at a time): libzmq counts a pipe in messages
        and allocates a frame whole from the length its header announces, so without it one peer's
        frame of any size is held (a 500 MB ack on the send socket: 848 MiB; a 500 MB subscription on
        the eMQP PUB, which libzmq files byte by byte in a trie: past 13 GB)."""
        if "SNDHWM" not in options or "RCVHWM" not in options:
            raise TypeError(f"{option}: a bound socket must set SNDHWM and RCVHWM (the memory bound)")
        if kind != zmq.STREAM and options.get("MAXMSGSIZE", -1) < 0:
            raise TypeError(f"{option}: a bound ZeroMQ socket must set MAXMSGSIZE (the memory bound)")
        role = option.removeprefix("--").removesuffix("-dsn")
        # A STREAM socket is raw TCP, no CURVE: Config.validate lets one be bound under CURVE only when
        # the operator named it unauthenticated.
        secured = (
            self.curve is not None
            and role not in self.unauthenticated
            and kind != zmq.STREAM
            and not endpoint.startswith("inproc://")
        )
        if not secured:
            self.open_roles.append(f"{role} {endpoint}")
        if endpoint.startswith("ipc://"):
            _check_ipc_path(endpoint, option)
        if secured and self.curve is not None:
            options = {**self.curve.options(role), **options}
        sock = self._socket(kind, options)
        self._watch(sock, role, endpoint)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self._unwatch(sock)
            sock.close()
            raise ConfigError(f"{option} {endpoint}: cannot bind: {exc}") from None
        if endpoint.startswith("ipc://"):
            _restrict_ipc(endpoint)
        self.owned.append(sock)
        self._made[sock] = (kind, endpoint, option, options, secured)
        return sock

    def _socket(self, kind: int, options: dict) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        return sock

    def _watch(self, sock: zmq.Socket, role: str, endpoint: str) -> None:
        """Attach a monitor before the bind, so that no accepted connection goes uncounted."""
        if sock.type == zmq.STREAM or not endpoint.startswith("tcp://"):
            # STREAM endpoints count their connections themselves; ipc files are owner-only (a process
            # of pzq's own user can do worse than connect), and inproc costs no descriptor.
            return
        address = f"inproc://pzq-watch-{next(_watch_ids)}"  # (ids of closed sockets are reused)
        sock.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPT_FAILED)
        pair = self.ctx.socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.setsockopt(zmq.RCVHWM, 0)  # libzmq drops monitor events past a full pipe: none may be lost
        pair.connect(address)
        self.monitors[pair] = (role, sock)

    def _unwatch(self, sock: zmq.Socket) -> None:
        """Stop the monitor before its reader goes: libzmq sends monitor events from its I/O thread
        without NOBLOCK, and an event with no reader would block that thread (every socket) for good."""
        self.open_fds.pop(sock, None)
        self.peers.pop(sock, None)  # (its connections went with it: kept, each CURVE revocation left a table)
        for pair, (_, watched) in list(self.monitors.items()):
            if watched is sock:
                del self.monitors[pair]
                sock.disable_monitor()
                pair.close(linger=0)

    def gate(self, sock: zmq.Socket) -> Gate | None:
        """The allow-list every message received on ``sock`` is checked against (None: not CURVE)."""
        if self.curve is None or not self._made[sock][4]:
            return None
        return self.curve.gate_of(self._made[sock][2].removeprefix("--").removesuffix("-dsn"))

    def rebind(self, sock: zmq.Socket) -> zmq.Socket:
        """Close ``sock`` and bind a new one like it: every peer is cut off and must connect (and
        authenticate) again. ZeroMQ clients reconnect by themselves. The new socket is returned at
        once; if its address is not free yet, it is bound by ``bind_pending`` in a later turn."""
        kind, endpoint, option, options, secured = self._made.pop(sock)
        self.owned.remove(sock)
        self._unbound.pop(sock, None)  # (re-made again before it could bind)
        self._unwatch(sock)
        sock.close(linger=0)
        fresh = self._socket(kind, options)
        self._watch(fresh, option.removeprefix("--").removesuffix("-dsn"), endpoint)
        self.owned.append(fresh)
        self._made[fresh] = (kind, endpoint, option, options, secured)
        self._unbound[fresh] = endpoint
        self.bind_pending(wait_s=REBIND_WAIT_S)
        return fresh

    def bind_pending(self, wait_s: float = 0.0) -> None:
        """Bind re-made sockets whose address was still held by the closed one (libzmq closes listeners
        in its I/O thread, a moment after ``close``), waiting up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        for sock, endpoint in list(self._unbound.items()):
            while True:
                try:
                    sock.bind(endpoint)  # (an ipc file left by the closed listener is replaced)
                    if endpoint.startswith("ipc://"):
                        _restrict_ipc(endpoint)
                except zmq.ZMQError as exc:
                    if time.monotonic() < deadline:
                        time.sleep(0.005)
                        continue
                    log.warning("%s not re-bound yet (%s): trying again", endpoint, exc)
                    break
                del self._unbound[sock]
                log.info("%s re-bound", endpoint)
                break

    @property
    def pending(self) -> bool:
        """True while a re-made socket waits for its address."""
        return bool(self._unbound)

    def close(self) -> None:
        for _, watched in list(self.monitors.values()):
            self._unwatch(watched)
        for sock in self.owned:
            sock.close()
        self.owned.clear()
        self._made.clear()


def receive(sock: zmq.Socket, gate: Gate | None, role: str, flags: int) -> list[bytes] | None:
    """One message from ``sock`` (zmq.Again when none waits). None, logged, when it came over a
    connection whose CURVE key has been revoked since its handshake: such a client is cut off."""
    if gate is None:  # (the usual case, one call shorter: every message comes here)
        return recv_frames(sock, flags)
    return receive_from(sock, gate, role, flags)[0]


def receive_from(sock: zmq.Socket, gate: Gate | None, role: str, flags: int) -> tuple[list[bytes] | None, str | None]:
    """``receive`` plus the sender's CURVE key (z85; None without CURVE), for protocols that tie what
    a client owns to its key."""
    if gate is None:
        return recv_frames(sock, flags), None
    frames, user = recv_frames_user(sock, flags)
    if gate.admits(user):
        return frames, user
    warn_bad(role, "revoked", f"a message from CURVE key {user!r}, no longer allowed: dropped")
    return None, user


def receive_with_fd(
    sock: zmq.Socket, gate: Gate | None, role: str, flags: int
) -> tuple[list[bytes] | None, str | None, int]:
    """``receive_from`` plus the descriptor of the sender's connection (-1 when unknown), which a
    socket monitor names when that connection goes."""
    frames, user, fd = recv_frames_fd(sock, flags, user=gate is not None)
    if gate is None or gate.admits(user):
        return frames, user, fd
    warn_bad(role, "revoked", f"a message from CURVE key {user!r}, no longer allowed: dropped")
    return None, user, fd


def _restrict_ipc(endpoint: str) -> None:
    """Make an ipc socket file owner-only, whatever the umask: other local users cannot connect."""
    if not endpoint.startswith("ipc://@"):
        try:
            os.chmod(endpoint[len("ipc://") :], 0o600)
        except OSError as exc:
            log.warning("cannot restrict %s to its owner: %s", endpoint, exc)


def _check_ipc_path(endpoint: str, option: str) -> None:
    """Never bind over a socket file of another user: whoever made it may be waiting for our clients."""
    path = endpoint[len("ipc://") :]
    if path.startswith("@"):  # Linux abstract namespace: no file
        return
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"{option} {endpoint}: cannot check the socket file: {exc.strerror}") from None
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"{option} {endpoint}: the file exists and belongs to uid {info.st_uid}, not to this "
            "process: refusing to bind over it (another user may have put it there)"
        )
    if not stat.S_ISSOCK(info.st_mode):
        raise ConfigError(f"{option} {endpoint}: the path exists and is not a socket: refusing to replace it")


class TurnBudget:
    """One turn's budget for all the work outside the commit: a clock deadline (``limits.turn_budget_s``
    from the turn's start), the bytes of messages the turn may let in (``limits.turn_write_bytes``: the
    commit pays for them all, so one client's big messages cannot make another's ack wait for several big
    writes) and the records it may touch (``limits.turn_records``: each request served counts one, a run
    of deliveries, acks or returns counts each of its messages). The commit's cost and the flush's (what
    the turn sends after it) grow with the records and bytes, which the clock before the commit does not
    see: the counts bound them whatever the clock says.

    Readers call ``spent()`` before each request and ``take(size)`` after reading one; they stop
    between requests, never inside one (each request stays atomic), and leave the rest to the next turn.
    Work that comes in runs (deliveries, acks) asks ``records_for(chunk)`` how many it may do next.
    The first request of a turn is always served (``spent()`` is False until something was taken), so a
    budget of zero still serves one request a turn, and a message bigger than the byte budget gets a
    turn of its own."""

    __slots__ = ("deadline", "bytes_left", "records_left", "served", "let_in")

    def __init__(self, deadline: float, bytes_left: int, records_left: int = 1 << 62):
        self.deadline = deadline  # time.monotonic() at which the turn's work stops
        self.bytes_left = bytes_left
        self.records_left = records_left
        self.served = 0  # requests (and periodic tasks) served this turn
        self.let_in = 0  # bytes of the requests served

    @classmethod
    def start(cls, seconds: float, write_bytes: int, records: int = 1 << 62) -> TurnBudget:
        """A budget that begins now."""
        return cls(time.monotonic() + seconds, write_bytes, records)

    def take(self, size: int = 0, records: int = 1) -> None:
        """One request (or run) served, which let ``size`` bytes into the turn and touched ``records``."""
        self.served += 1
        self.bytes_left -= size
        self.let_in += size
        self.records_left -= records

    def left(self) -> float:
        """Seconds left (negative once the deadline passed)."""
        return self.deadline - time.monotonic()

    def spent(self) -> bool:
        """True when the turn must stop taking work: its time, bytes or records are used up, and it has
        served something already."""
        return self.served > 0 and (self.bytes_left <= 0 or self.records_left <= 0 or time.monotonic() >= self.deadline)

    def records_for(self, chunk: int) -> int:
        """How many records the next run of work may touch: at most ``chunk`` and what the turn has left,
        none once the budget is spent, and always something for the turn's first work."""
        if self.spent():
            return 0
        return max(1, min(chunk, self.records_left))


UNBOUNDED = TurnBudget(float("inf"), 1 << 62)  # an endpoint's budget outside a server's turn (tests)


class Endpoint:
    """One endpoint's turn: ``read`` and ``work`` before the commit, ``flush`` after it (or
    ``rolled_back`` first, when the commit failed and the turn's writes are gone)."""

    name = ""
    sockets: list[zmq.Socket]  # polled for input
    # The turn's shared budget: the loop sets it before each turn; read loops check it between requests.
    budget: TurnBudget = UNBOUNDED
    # The server's memory alarm (set by the loop at start): asked before a big reply is made.
    alarm: MemoryAlarm = UNWATCHED

    def before_poll(self, poller: zmq.Poller) -> None:
        """Adjust what the poller waits for (e.g. writability) before the turn's poll."""

    def read(self, ready: dict, now: Now) -> None:
        """Read what arrived on this endpoint's sockets (bounded per turn)."""

    def work(self, now: Now) -> None:
        """Hand out messages, heartbeats and schedules: the turn's writes before the commit."""

    def waiting(self) -> bool:
        """True if output of this turn waits for the commit (a producer's ack, a delivery)."""
        return False

    # Output waits for the commit it depends on to be on disk (pzq/endpoints/held.py). An endpoint that
    # ``holds_output`` keeps it per commit (``hold``, ``release``); for the others the loop syncs before
    # their ``flush`` whenever ``output_waiting`` says it would send something.
    holds_output = False

    def hold(self, commit: int) -> None:
        """The turn's output so far depends on ``commit``: keep it until ``release`` reaches it."""

    def release(self, durable: int) -> None:
        """Output held for commits up to ``durable`` goes at the next ``flush``."""

    def output_waiting(self) -> bool:
        """True if ``flush`` would send something read from the store (an answer, a delivery, figures)."""
        return True

    def rolled_back(self) -> None:
        """The turn's writes were rolled back: turn pending acks into errors, drop deliveries."""

    def flush(self, now: Now) -> None:
        """Send the turn's output; the commit it depends on is done."""

    def recover(self) -> None:
        """The broker restarted from the disk (a failed turn): forget what was in flight."""

    def wake_at(self, now: float) -> float | None:
        """The monotonic time this endpoint needs a turn by, if any (heartbeats, schedules)."""
        return None

    def stats(self) -> dict | None:
        """This endpoint's monitor figures, or None to report nothing."""
        return None

    def memory(self) -> dict[str, int]:
        """Bytes this endpoint holds for its clients, by what holds them (the memory bound adds them up
        once a turn): backlogs, unfinished input, what its pipes may hold. Running totals: cheap."""
        return {}

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        """Lists of this endpoint's clients for the web console (see Gateway.clients), each table
        naming its ``gateway``, a page of ``limit`` rows from ``offset``; none by default (ZeroMQ does
        not name a socket's peers)."""
        return []

    def consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        """The consumers of ``queue`` among this endpoint's clients (at most ``limit`` of them: see
        Gateway.queue_consumers), and how many there are; none by default."""
        return [], 0

    def narrowed(self, lost: dict[str, set[str]]) -> None:
        """The permissions changed (SIGHUP): cut off at once what a client may no longer do where no
        per-request check will (deliveries already promised, workers and consumers registered). ``lost``
        holds, per role (``send``, ``receive``, ``consume``), the CURVE keys (z85) no longer let onto its
        sockets. Sockets may be replaced, as in ``revoked``."""

    def revoked(self, users: set[str]) -> None:
        """These CURVE keys were removed (SIGHUP): cut off their peers where a message check cannot
        (sockets that only send, workers given jobs unasked). Sockets may be replaced: the server
        polls ``sockets`` afresh after this call."""
