"""The server loop: lifecycle, turn order, the group-commit boundary, signals (see pzq.server).

The turn's steps and the durability promise they keep are drawn in pzq.server's docstring.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import zmq

from pzq.admin import Admin
from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, TurnBudget
from pzq.endpoints.connwatch import ConnectionWatch
from pzq.endpoints.memory import MemoryAlarm
from pzq.endpoints.monitor import MonitorEndpoint
from pzq.endpoints.shares import ConnectionLimit
from pzq.errors import StoreError, SyncLost
from pzq.leases import Leases
from pzq.leases.returns import TurnRecords
from pzq.logs import Throttled
from pzq.server.access import permissions_for
from pzq.server.chores import Chores, Task
from pzq.server.collector import Collector
from pzq.server.commits import Commits
from pzq.server.console_child import ConsoleChild
from pzq.server.process import connection_limit, drain_fd, drop_privileges
from pzq.server.reload import Reloading
from pzq.server.wiring import gateway_endpoints, log_start, mqks_routing, shard_identity
from pzq.store import Store
from pzq.systemd import Notifier
from pzq.zmqio import draining

if TYPE_CHECKING:
    from pzq.curve import CurveServer
    from pzq.metrics import Metrics

log = logging.getLogger("pzq.server")

MAX_FAILED_TURNS = 100


class Server(Reloading):
    """A pzq server on one Config. ``start()`` binds, ``run()`` loops until ``stop()`` or a signal.
    With ``--http-dsn``, the web console runs as a child process (pzq/server/console_child.py);
    ``console_command`` replaces its `python -m pzq console` (tests run a stand-in)."""

    def __init__(
        self,
        config: Config,
        *,
        context: zmq.Context | None = None,
        console_command: Sequence[str] | None = None,
    ):
        self.config = config
        self._console_command = console_command
        self.ctx = context or zmq.Context.instance()
        # Made by start(); nothing but start() and close() runs before it.
        self.store: Store
        self.broker: Broker
        self.endpoints: list[Endpoint] = []
        self._sockets = Sockets(self.ctx)
        self.curve: CurveServer | None = None
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK)
        self.notifier = Notifier.from_environment()  # inert unless systemd started us with Type=notify
        self._next_watchdog = 0.0
        self._reload_requested = False
        self.reloads = 0  # SIGHUPs handled so far (a test waits for its own)
        self.reloader: Callable[[], Config] | None = None  # re-reads the settings on SIGHUP
        self.metrics: Metrics | None = None
        self.console: ConsoleChild | None = None  # the web console's process (--http-dsn)
        # A full disk fails every turn's commit: one line now and then, not a traceback each time.
        self._store_failures = Throttled(log, config.limits.store_failure_log_s)
        self._task_list: list[Task] = []  # made by _register
        self._first_task = 0  # the task the next turn begins with: the first one the last turn did not reach
        self._behind = False  # the last turn's budget ran out with work left: poll without waiting
        self.turns = 0  # turns run (tests count them)
        self.alarm = MemoryAlarm(config.memory_high_water, config.memory_low_water, config.limits)
        self.collector: Collector | None = None  # (made by run: the garbage collector's rule)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the store and bind every endpoint; raises ConfigError or StoreError with a clear text."""
        cfg = self.config
        self.store = Store(
            cfg.database,
            max_size=cfg.max_store_size,
            sync=cfg.hard_sync,
            min_disk_free=cfg.min_disk_free,
            disk_reserve=cfg.disk_reserve,
            max_queues=cfg.max_queues,
            max_implicit=cfg.max_queues - cfg.max_queues // cfg.limits.implicit_reserved_part,
            verify=True,
        )
        self.store.watch_disk()
        where = self.where = shard_identity(cfg, self.store)  # (WrongShard: the store is another shard's)
        self.store.catalog.name_queue(cfg.queue)  # (configured: it never expires)
        self.store.catalog.configured.add(cfg.queue)  # (made again after a DELETE: explicit too)
        self.store.commit()
        self.broker = Broker(
            self.store,
            ack_timeout_s=cfg.ack_timeout,
            max_deliveries=cfg.max_deliveries,
            limits=cfg.limits,
            implicit_ttl_s=cfg.implicit_queue_ttl,
        )
        self._commits = Commits(self.store, self.broker, cfg.commit_interval)
        # Leases are loaded even with the API off, so that messages a group held go back when it expires.
        self.leases = Leases(self.broker, timeout_s=cfg.lease_timeout, limits=cfg.limits)
        if cfg.curve_secret_key:
            from pzq.curve import CurveServer

            self.curve = CurveServer(self.ctx, cfg.curve_secret_key, cfg.curve_clients)
        self.permissions = permissions_for(cfg, self.curve)  # (before the bind: the native handshake checks them)
        owned = self._sockets = Sockets(self.ctx, self.curve, cfg.unauthenticated_roles)
        self.admin = Admin(self.broker, self.store, store_limit=cfg.max_store_size, gateways=self._gateway_stats)
        self.admin.attach(lambda: self.endpoints, lambda: self._commits.last_ms, cfg, where)
        self.admin.drop_queue = self._drop_queue  # (DELETE: its leases go too, as MQKS delete_queue's)
        self._chores = Chores(self.broker, self.leases, self.admin, cfg.limits, self._each_second)
        connections = ConnectionLimit(
            connection_limit(cfg.max_connections), cfg.max_partial_input, cfg.max_message_size, cfg.limits
        )
        self.endpoints = gateway_endpoints(
            cfg, self.broker, self.leases, self.store, owned, connections, self._drop_queue, self.permissions, where
        )
        self.admin.routing = mqks_routing(self.endpoints)
        self.endpoints.append(MonitorEndpoint(cfg, self.admin, owned, self.permissions))
        self.endpoints.append(ConnectionWatch(owned, connections))
        if cfg.metrics_dsn:
            from pzq.metrics import Metrics  # (prometheus-client: only when metrics are asked for)

            self.metrics = self._commits.metrics = Metrics(cfg.metrics_dsn)
        for endpoint in self.endpoints:
            endpoint.alarm = self.alarm
        self._register()
        if cfg.user:
            drop_privileges(cfg.user, cfg.database)
        log_start(cfg, owned.open_roles, connections.limit, curve=self.curve is not None)
        log.info("%s", self.permissions.describe())
        if cfg.http_dsn:  # (after the bind, as the user the server runs as: a monitor client like any other)
            keyed = self.curve is not None and "monitor" not in cfg.unauthenticated_roles
            self.console = ConsoleChild(
                cfg, curve=self.curve if keyed else None, command=self._console_command, limits=cfg.limits
            )
            self.console.start()

    def _register(self) -> None:
        """(Re)build the poller from every endpoint's sockets (a revocation may replace some)."""
        self.poller = zmq.Poller()
        for endpoint in self.endpoints:
            for sock in endpoint.sockets:
                self.poller.register(sock, zmq.POLLIN)
        self.poller.register(self._wake_r, zmq.POLLIN)
        self._task_list = self._chores.tasks(self.endpoints)

    def stop(self) -> None:
        """Ask the loop to stop after the current turn; safe from another thread or a signal handler."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # the pipe is full (a wake-up is pending), or the loop saw the flag and closed it
            pass

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.stop())
        signal.signal(signal.SIGHUP, lambda signum, frame: self.request_reload())

    def close(self) -> None:
        if self.console is not None:  # first: its stop waits for the child (the console holds nothing to save)
            self.console.stop()
            self.console = None
        self._sockets.close()
        if self.curve is not None:
            self.curve.close()
            self.curve = None
        if (where := getattr(self, "where", None)) is not None:  # (the etcd thread's lease revoked: gone at once)
            where.stop()
        if (store := getattr(self, "store", None)) is not None:
            store.close()  # (a second close does nothing)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.notifier.close()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def run(self) -> None:
        """Serve until ``stop()``. The commit of the turn in progress always completes.

        A turn that fails on a bug (not on input: input errors are answered inside the turn) is
        rolled back like a store failure and the loop goes on; a run of MAX_FAILED_TURNS failing turns
        in a row means something is broken for good, and the server exits for its supervisor to
        restart it.
        """
        collector = self.collector = Collector(self.config.gc_whole_interval, self.config.limits.gc_whole_most_s)
        collector.start(time.monotonic())
        try:
            self._serve(collector)
        finally:
            collector.stop()
        self.notifier.stopping()
        self.broker.events.flush()  # (the events of the last interval are not lost on a stop)
        log.info("pzq stopping: %d messages stored, %d commits", self.broker.stats()["messages"], self.store.syncs)

    def _serve(self, collector: Collector) -> None:
        """The loop of ``run``: turns until ``stop()``, the collector told after each."""
        failed = 0
        self.notifier.ready(f"serving {len(self._sockets.owned)} sockets from {self.config.database}")
        while not self._stopping:
            if self._reload_requested:
                try:
                    self._reload()
                except Exception:  # noqa: BLE001 - a reload must never stop the server
                    log.exception("SIGHUP: reload failed; the server goes on with its settings")
            try:
                self._turn(self._poll_timeout_ms())
                collector.turn_ends(time.monotonic())  # (the turn's end, not its Now: what the turn took counts)
                failed = 0
            except SyncLost as exc:  # (what waited for that commit is never sent: start again from the disk)
                log.critical("%s; stopping: a restart starts again from what is on disk", exc)
                self.notifier.notify("STATUS=a commit or sync failed with answers waiting; exiting", "ERRNO=5")
                raise
            except Exception:  # noqa: BLE001 - keep serving other clients; logged with its traceback
                failed += 1
                log.exception("unexpected error in the event loop (%d in a row); rolled back", failed)
                self._recover()
                for endpoint in self.endpoints:
                    endpoint.rolled_back()
                if failed >= MAX_FAILED_TURNS:
                    self.notifier.notify("STATUS=too many failing turns in a row; exiting", "ERRNO=5")
                    raise
        self._commits.finish(self.endpoints)  # (the last turn's answers: synced and sent before the sockets close)
        for endpoint in self.endpoints:
            endpoint.flush(Now.read())  # (after the last turn: its own moment)

    # -- the loop ---------------------------------------------------------------------------------

    def _poll_timeout_ms(self) -> int:
        if self._commits.holding:  # (output waits for the next commit's sync: the next turn at once)
            return 0
        return self._wake_ms()

    def _idle(self) -> bool:
        """Nothing to do before the next wake-up: no socket ready, no work left for the next turn."""
        return self._wake_ms() > 0 and not self.poller.poll(0)

    def _wake_ms(self) -> int:
        # (_behind: the last turn's budget ran out before its work did, whatever is left goes on at once)
        if self.leases.pending or draining() or self._behind or self.broker.dropping:
            return 0  # the next share at once: acknowledged runs to delete or expired ones to return, or
            # the rest of an oversized message to drain
        now = time.monotonic()  # (between turns, not the last turn's Now: the wait is measured from here)
        wake = min(self._chores.next_tick, now + self.config.reaper_frequency)
        for deadline in (self.broker.next_deadline(), self.broker.next_sweep()):
            if deadline is not None:
                wake = min(wake, deadline)
        due = self._commits.due_at()
        if due is not None:
            wake = min(wake, due)
        for endpoint in self.endpoints:
            due = endpoint.wake_at(now)
            if due is not None:
                wake = min(wake, due)
        if self.notifier.watchdog_s:
            wake = min(wake, self._next_watchdog)
        return max(0, int((wake - now) * 1000 + 0.999))

    def _each_second(self, now: Now) -> None:
        """The tick's part that is the server's: the metrics' figures, the console's process."""
        if self.metrics is not None:
            oldest = self.admin.oldest  # (the head messages' ages, read by its tick)
            stats, per_queue = self.stats(), self.broker.queue_counts()
            self.metrics.update(stats, oldest, per_queue)
        if self.console is not None:
            self.console.check(now.mono)  # (one waitpid(WNOHANG); a restart when its wait is over)

    def _turn(self, timeout_ms: int) -> None:
        """One turn. Its work before the commit draws on one ``TurnBudget`` (a clock deadline and the
        bytes it may let in), shared by every endpoint and periodic task: readers stop between requests
        once it is spent, and the tasks not reached wait for the next turn, which polls without waiting
        and begins with the first of them (round-robin), so that no flood on one endpoint starves the
        others' reads or the deliveries."""
        for endpoint in self.endpoints:
            endpoint.before_poll(self.poller)
        ready = dict(self.poller.poll(timeout_ms))
        now = Now.read()  # (one value for every endpoint, gateway and chore of the turn: pzq/clock.py)
        if self.collector is not None:  # (a turn's length is from here: its work, not its wait)
            self.collector.turn_began = now.mono
        if self._wake_r in ready:
            drain_fd(self._wake_r)
        self.store.watch_disk()  # one statvfs: producers are refused before the filesystem fills
        self._measure_memory()
        produced = self.broker.counters.produced
        self.store.turn_begins()
        limits = self.config.limits
        budget = self._chores.budget = TurnBudget.start(
            limits.turn_budget_s, limits.turn_write_bytes, limits.turn_records
        )
        for endpoint in self.endpoints:
            endpoint.budget = budget
        self.leases.turn_records = TurnRecords(budget)  # (an ACK_UPTO deletes within the turn's records)
        self.turns += 1
        try:
            self.broker.turn_begins()  # (acks a rolled-back turn took back are done again first)
            tasks = self._task_list
            first, self._first_task, self._behind = self._first_task % len(tasks), 0, False
            for i in range(len(tasks)):
                if budget.spent():  # the rest (from this task on) goes first next turn
                    self._first_task, self._behind = (first + i) % len(tasks), True
                    break
                tasks[(first + i) % len(tasks)](ready, now)
            if not self._behind and budget.spent():  # every task ran, the last (a reader cut short) spent it:
                # the rotation goes on where it stopped, or that task got the next turn too (an eMQP hop a turn more)
                self._first_task, self._behind = first, True
            elif first:  # (a turn begun mid-rotation read after the works: what it read gets a turn at once)
                self._behind = True
            # New messages are made durable at once, whether or not their protocol acks them.
            wrote = self._commits.commit_if_due(
                now.mono, waiting=self.broker.counters.produced != produced or any(e.waiting() for e in self.endpoints)
            )
        except StoreError as exc:
            if isinstance(exc, SyncLost):  # (a commit or sync failed with a meta page not on disk)
                raise
            self._store_failures.error("store failure; this turn was rolled back: %s", exc)
            self._recover(whole=False)
            for endpoint in self.endpoints:
                endpoint.rolled_back()
            wrote = False
        # (after a rolled-back turn too: what earlier turns hold must not wait for a commit that fails)
        self._commits.end_turn(self.endpoints, wrote, self._idle)
        for endpoint in self.endpoints:
            endpoint.flush(now)
        if self._sockets.pending:
            self._sockets.bind_pending()
        if self.notifier.watchdog_s and now.mono >= self._next_watchdog:  # a loop that hangs stops pinging
            self.notifier.watchdog()
            self._next_watchdog = now.mono + self.notifier.watchdog_s / 2

    def _measure_memory(self) -> None:
        """The memory bound: add up what every endpoint holds; while the alarm is raised, the broker
        refuses every producer (see pzq/endpoints/memory.py)."""
        parts: dict[str, int] = {}
        for endpoint in self.endpoints:
            parts.update(endpoint.memory())
        parts["deliveries"] = delivered = self.broker.delivery_bytes()
        self.broker.refusing = self.alarm.reason if self.alarm.measure(parts) else None
        # (deliveries grow only under the ceiling, and not even one past the high-water mark)
        self.broker.bank(
            others=self.alarm.total + self.alarm.unconfirmed - delivered,
            ceiling=self.alarm.ceiling,
            high_water=self.alarm.high_water,
        )

    def _recover(self, whole: bool = True) -> None:
        """Start over from what is on disk: uncommitted writes are dropped. After a bug (``whole``),
        as a restart would: whatever was in flight is ready again (at-least-once). After a failed
        commit, only the turn's own work is undone (see Broker.rolled_back)."""
        self.store.abort()
        if whole:
            self.broker.reset()
        else:
            self.broker.rolled_back()
        self.leases.load()
        self._commits.dirty_since = None
        for endpoint in self.endpoints:
            endpoint.recover()

    def _drop_queue(self, queue: str) -> int:
        """Delete a queue for good (MQKS delete_queue): its leases, its deliveries, its messages."""
        self.leases.drop_queue(queue)
        return self.broker.drop_queue(queue)

    def stats(self) -> dict:
        """Every figure the monitor reports, the six PZQ fields first."""
        return self.admin.stats()

    def _gateway_stats(self) -> dict:
        stats = {e.name: stats for e in self.endpoints if (stats := e.stats()) is not None}
        stats["memory"] = {**self.alarm.stats(), **self.broker.memory_stats()}
        stats["permissions"] = self.permissions.stats()
        if self.collector is not None:
            stats["gc"] = self.collector.stats()
        if (registry := self.where.stats()) is not None:
            stats["registry"] = registry
        return stats
