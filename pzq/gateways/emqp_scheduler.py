"""eMQP recurring jobs (SCHEDULE and UNSCHEDULE): pzq runs them itself, by an interval or a cron
expression, and each run enqueues a REQUEST into the schedule's queue.

The loop keeps each schedule's timing only; its payload stays in the store (store/schedules.py) until
a run: up to ``Limits.max_schedules`` payloads of up to --max-message-size each must not be held in memory.
The payload is written once, at SCHEDULE; a run writes only the schedule's small run record.
Times are wall-clock microseconds (schedules outlive restarts); after a pause longer than an interval,
a schedule runs once, then on time.

Bounded work: due schedules come from a heap of (next_us, id), and a turn runs them in due order up to
``Limits.schedule_runs_per_turn`` runs or ``schedule_turn_s``, leaving the rest to the next turn. A cron
expression is checked before croniter searches it (its fields' characters, then whether its days of
the month ever occur in its months) and croniter searches at most ``cron_max_years`` ahead: an
expression that names no time is refused at SCHEDULE at a bounded cost, never searched for decades.
"""

from __future__ import annotations

import datetime
import heapq
import logging
import re
import time
import zoneinfo
from collections.abc import Callable

import croniter

from pzq.config import DEFAULT_LIMITS, ClientShares, Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways.contract import BrokerSurface
from pzq.gateways.tally import Tally
from pzq.protocols import emqp
from pzq.store.schedules import Schedules

log = logging.getLogger("pzq.emqp")

# croniter's shortcuts, and the characters of its fields: digits, names (jan, mon), L, W, R, H(a-b), ?
ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
FIELD = re.compile(r"[0-9A-Za-z*?/,#()-]+")
MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # the most days of each month (29 Feb: leap years)
DAY, MONTH, WEEKDAY = 2, 3, 4  # indices of croniter's expanded fields
_CRON_ERRORS = (ValueError, KeyError, TypeError, OverflowError, IndexError)  # croniter's are ValueErrors


class Scheduler:
    """Every schedule of the server: added, removed, run when due."""

    def __init__(
        self,
        broker: BrokerSurface,
        table: Schedules,
        cron_timezone: str,
        new_id: Callable[[], str],
        *,
        limits: Limits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``table`` is the store's table of schedules; ``limits`` gives max_schedules, max_cron,
        cron_max_years and each turn's share of runs; ``clock`` times that share."""
        self.broker = broker
        self.table = table
        self.limits = limits
        self.clock = clock
        self.cron_tz = zoneinfo.ZoneInfo(cron_timezone)
        self.new_id = new_id  # the msgid of each REQUEST a run makes
        self.timing: Tally[str, dict] = Tally(_queue_of)  # id -> its record without the payload
        # (next_us, id) of every schedule; an entry whose time is no longer its schedule's is stale and
        # skipped when met (rebuilt when stale ones outnumber the schedules)
        self._heap: list[tuple[int, str]] = []
        self._crons: dict[str, croniter.croniter] = {}  # id -> its parsed expression (parsing costs 4 runs)
        # Each client's share of max_schedules (its CURVE key, else its frontend peer), and who made each
        self.shares = ClientShares(limits.max_schedules, limits)
        self._maker: dict[str, object] = {}
        self.reload()

    def reload(self) -> None:
        """Read the schedules as they are on disk: at start-up and after a rolled-back turn."""
        self.timing = Tally(_queue_of, {key: _without_payload(record) for key, record in self.table.all().items()})
        self._crons.clear()
        for key in [k for k in self._maker if k not in self.timing]:  # (made in a rolled-back turn)
            self._release(key)
        self._rebuild()

    def _release(self, key: str) -> None:
        """The schedule is gone: it no longer counts against its maker's share."""
        maker = self._maker.pop(key, None)
        if maker is not None:
            self.shares.add(maker, -1)

    def _rebuild(self) -> None:
        self._heap = [(record["next_us"], key) for key, record in self.timing.items()]
        heapq.heapify(self._heap)

    def _push(self, key: str, next_us: int) -> None:
        heapq.heappush(self._heap, (next_us, key))
        if len(self._heap) > 2 * len(self.timing) + 64:  # (a client re-sending one SCHEDULE for ever)
            self._rebuild()

    def add(
        self,
        queue: str,
        headers_text: str,
        interval_text: str,
        payload: str,
        cron: str,
        now_us: int,
        client: object = None,
    ) -> str:
        """Store a schedule (replacing one of the same job); its id. Raises ProtocolError for a bad
        one, StoreFull when there is no room for it."""
        headers = emqp.parse_headers(headers_text)
        runs = emqp.header_int(headers, "run_count")
        interval = (
            int(interval_text) if interval_text.isascii() and interval_text.isdigit() and len(interval_text) <= 9 else 0
        )
        if not queue or len(queue.encode()) > 255:
            raise ProtocolError("bad-queue", "queue names are 1 to 255 bytes")
        first_cron = 0
        parsed = None
        if cron:  # (eventmq sends interval -1 with it)
            interval = 0
            parsed = self.parse_cron(cron)
            first_cron = self._next(parsed, cron, now_us)
        elif interval <= 0:
            raise ProtocolError(
                "bad-schedule",
                "a schedule needs an interval (whole seconds > 0) or a cron "
                f"expression, got interval {interval_text[:20]!r}",
            )
        key = emqp.schedule_id(payload)
        most = self.limits.max_schedules
        if key not in self.timing and len(self.timing) >= most:
            raise ProtocolError("too-many-schedules", f"at most {most} schedules")
        if key not in self.timing and client is not None:
            reason = self.shares.refusal(client, len(self.timing))
            if reason is not None:
                raise ProtocolError("too-many-schedules", f"no more schedules for this client: {reason}")
        # Haste (eventmq's default): the first run is now; with nohaste, after one interval (or at the
        # first cron time).
        if "nohaste" not in headers:
            first = now_us
        else:
            first = first_cron if cron else now_us + interval * 1_000_000
        job_headers = ",".join(
            h for h in headers_text.split(",") if h and h.split(":")[0] not in ("nohaste", "run_count")
        )
        record = {
            "queue": queue,
            "headers": job_headers,
            "interval": interval,
            "payload": payload,
            "remaining": runs or -1,
            "next_us": first,
        }
        if cron:
            record["cron"] = cron
        self.table.put(key, record)
        if key not in self.timing and client is not None:
            self._maker[key] = client
            self.shares.add(client)
        self.timing[key] = _without_payload(record)
        self._crons.pop(key, None)
        if parsed is not None:
            self._crons[key] = parsed
        self._push(key, first)
        log.info(
            "eMQP schedule %s: %r %s into %r",
            key,
            payload[:60],
            f"at cron {cron!r} ({self.cron_tz.key})" if cron else f"every {interval} s",
            queue,
        )
        return key

    def remove(self, payload: str) -> bool:
        """UNSCHEDULE: remove the schedule of the same job; False if there is none."""
        key = emqp.schedule_id(payload)
        if self.timing.pop(key, None) is None:
            return False
        self.table.delete(key)
        self._release(key)
        self._crons.pop(key, None)  # (its heap entry is stale now: skipped when met)
        log.info("eMQP schedule %s removed", key)
        return True

    def parse_cron(self, expression: str) -> croniter.croniter:
        """``expression`` parsed by croniter, searching at most ``cron_max_years`` ahead; ProtocolError
        if it is not a cron expression or if its days of the month never occur in its months (checked
        on a table, before any search: such an expression would make croniter search for years)."""
        most = self.limits.max_cron
        if len(expression) > most:
            raise ProtocolError("bad-cron", f"a cron expression of at most {most} characters")
        fields = expression.split()
        if not (expression.strip() in ALIASES or 5 <= len(fields) <= 7 and all(map(FIELD.fullmatch, fields))):
            raise ProtocolError("bad-cron", f"cron {expression[:60]!r}: not 5 to 7 fields of cron's characters")
        start = datetime.datetime.fromtimestamp(0, self.cron_tz)
        try:
            parsed = croniter.croniter(expression, start, max_years_between_matches=self.limits.cron_max_years)
        except _CRON_ERRORS as exc:
            raise ProtocolError("bad-cron", f"cron {expression[:60]!r}: {exc}") from None
        if not _days_occur(parsed):
            raise ProtocolError(
                "bad-cron", f"cron {expression[:60]!r} names no date: those days never occur in its months"
            )
        return parsed

    def cron_next(self, expression: str, after_us: int) -> int:
        """The first time (µs) strictly after ``after_us`` that cron ``expression`` names, read in the
        configured time zone; ProtocolError if it is not a cron expression or names no time within
        ``cron_max_years``."""
        return self._next(self.parse_cron(expression), expression, after_us)

    def _next(self, parsed: croniter.croniter, expression: str, after_us: int) -> int:
        try:
            start = datetime.datetime.fromtimestamp(after_us / 1e6, self.cron_tz)
            return int(parsed.get_next(float, start_time=start) * 1e6)
        except _CRON_ERRORS as exc:
            years = self.limits.cron_max_years
            raise ProtocolError(
                "bad-cron", f"cron {expression[:60]!r} names no time within {years} years: {exc}"
            ) from None

    def run(self, now_us: int) -> int:
        """Enqueue a REQUEST for the schedules that are due, in due order, up to this turn's share
        (``schedule_runs_per_turn`` runs or ``schedule_turn_s``; at least one); returns how many ran.
        The rest stay due: ``next_us`` says so and the next turn runs them."""
        share = max(1, self.limits.schedule_runs_per_turn)
        deadline = self.clock() + self.limits.schedule_turn_s
        ran = 0
        while self._heap and self._heap[0][0] <= now_us:
            due_us, key = heapq.heappop(self._heap)
            record = self.timing.get(key)
            if record is None or record["next_us"] != due_us:
                continue  # stale: removed, replaced or already run
            if ran >= share or (ran and self.clock() >= deadline):
                heapq.heappush(self._heap, (due_us, key))  # (this turn's share is spent)
                break
            self._run_one(key, record, now_us)
            ran += 1
        return ran

    def _run_one(self, key: str, record: dict, now_us: int) -> None:
        payload = self.table.payload(key)
        if payload is None:  # damaged or gone from the store: it cannot run
            del self.timing[key]
            self._release(key)
            self._crons.pop(key, None)
            return
        try:
            self.broker.produce(
                record["queue"],
                [payload.encode()],
                now_us=now_us,
                meta={"msgid": self.new_id(), "headers": record["headers"]},
            )
        except StoreFull:
            log.warning("eMQP schedule %s could not run: queue full; trying at its next interval", key)
        if record.get("cron"):
            try:
                parsed = self._crons.get(key) or self.parse_cron(record["cron"])
                self._crons[key] = parsed
                record["next_us"] = self._next(parsed, record["cron"], max(record["next_us"], now_us))
            except ProtocolError as exc:  # (a time zone change may leave no next time)
                log.warning("eMQP schedule %s has no next run and is removed: %s", key, exc.detail)
                record["remaining"] = 1
        else:
            step = record["interval"] * 1_000_000
            record["next_us"] = max(record["next_us"] + step, now_us + step)
        if record["remaining"] > 0:
            record["remaining"] -= 1
        if record["remaining"] == 0:
            del self.timing[key]
            self._release(key)
            self._crons.pop(key, None)
            self.table.delete(key)
        else:
            self.table.ran(key, record["next_us"], record["remaining"])
            self._push(key, record["next_us"])

    def next_us(self) -> int | None:
        """When the next schedule is due (a time already past while due ones wait for a turn's share)."""
        while self._heap:
            due_us, key = self._heap[0]
            record = self.timing.get(key)
            if record is not None and record["next_us"] == due_us:
                return due_us
            heapq.heappop(self._heap)  # (stale)
        return None


def _days_occur(parsed: croniter.croniter) -> bool:
    """Whether the days of the month that ``parsed`` names can occur in one of its months (29 Feb
    counts): a necessary condition of croniter finding a time, read on tables. Days named with plain
    weekdays are not checked (cron runs on either), nor 'W' days (left to croniter's bounded search);
    with an n-th weekday ('1#5'), croniter wants both, and the n-th falls on days 7n-6 to 7n."""
    days, months, weekdays = parsed.expanded[DAY], parsed.expanded[MONTH], parsed.expanded[WEEKDAY]
    nth = parsed.nth_weekday_of_month
    if days[0] == "*" or (weekdays[0] != "*" and not nth) or parsed.nearest_weekday:
        return True
    longest = max(MONTH_DAYS[m - 1] for m in (range(1, 13) if months[0] == "*" else months))
    named = {day for day in days if day != "l"} | (set(range(28, 32)) if "l" in days else set())
    named = {day for day in named if day <= longest}
    if nth:
        windows = [range(22, 32) if n == "l" else range(7 * n - 6, 7 * n + 1) for ns in nth.values() for n in ns]
        named = {day for day in named if any(day in window for window in windows)}
    return bool(named)


def _without_payload(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "payload"}


def _queue_of(record: dict) -> tuple[str]:
    """The queue a schedule's runs go to (its queue is in use while it is scheduled)."""
    return (record["queue"],)
