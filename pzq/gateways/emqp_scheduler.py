"""eMQP recurring jobs (SCHEDULE and UNSCHEDULE): pzq runs them itself, by an interval or a cron
expression, and each run enqueues a REQUEST into the schedule's queue.

The loop keeps each schedule's timing only; its payload stays in the store (store/schedules.py) until
a run: up to ``Limits.max_schedules`` payloads of up to --max-message-size each must not be held in memory.
Times are wall-clock microseconds (schedules outlive restarts); after a pause longer than an interval,
a schedule runs once, then on time.
"""

from __future__ import annotations

import datetime
import logging
import zoneinfo
from collections.abc import Callable

import croniter

from pzq.broker import Broker
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.protocols import emqp
from pzq.store.schedules import Schedules

log = logging.getLogger("pzq.emqp")


class Scheduler:
    """Every schedule of the server: added, removed, run when due."""

    def __init__(
        self,
        broker: Broker,
        table: Schedules,
        cron_timezone: str,
        new_id: Callable[[], str],
        *,
        limits: Limits = DEFAULT_LIMITS,
    ):
        """``table`` is the store's table of schedules; ``limits`` gives max_schedules and max_cron."""
        self.broker = broker
        self.table = table
        self.limits = limits
        self.cron_tz = zoneinfo.ZoneInfo(cron_timezone)
        self.new_id = new_id  # the msgid of each REQUEST a run makes
        self.timing: dict[str, dict] = {}  # id -> its record without the payload
        self._next_due: int | None = None
        self.reload()

    def reload(self) -> None:
        """Read the schedules as they are on disk: at start-up and after a rolled-back turn."""
        self.timing = {key: _without_payload(record) for key, record in self.table.all().items()}
        self._next_due = None

    def add(self, queue: str, headers_text: str, interval_text: str, payload: str, cron: str, now_us: int) -> str:
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
        if cron:  # (eventmq sends interval -1 with it)
            interval = 0
            first_cron = self.cron_next(cron, now_us)
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
        self.timing[key] = _without_payload(record)
        self._next_due = None
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
        self._next_due = None
        log.info("eMQP schedule %s removed", key)
        return True

    def cron_next(self, expression: str, after_us: int) -> int:
        """The first time (µs) strictly after ``after_us`` that cron ``expression`` names, read in the
        configured time zone; ProtocolError if it is not a cron expression or names no time at all."""
        if len(expression) > self.limits.max_cron:
            raise ProtocolError("bad-cron", f"a cron expression of at most {self.limits.max_cron} characters")
        try:
            start = datetime.datetime.fromtimestamp(after_us / 1e6, self.cron_tz)
            return int(croniter.croniter(expression, start).get_next(float) * 1e6)
        except (ValueError, KeyError, TypeError, OverflowError, IndexError) as exc:  # croniter's errors are ValueErrors
            raise ProtocolError("bad-cron", f"cron {expression[:60]!r}: {exc}") from None

    def run(self, now_us: int) -> int:
        """Enqueue a REQUEST for every schedule that is due; returns how many ran."""
        due = self.next_us()
        if due is None or due > now_us:
            return 0
        self._next_due = None
        ran = 0
        for key, record in list(self.timing.items()):
            if record["next_us"] > now_us:
                continue
            stored = self.table.get(key)
            if stored is None:  # damaged or gone from the store: it cannot run
                del self.timing[key]
                continue
            payload = stored["payload"]
            try:
                self.broker.produce(
                    record["queue"],
                    [payload.encode()],
                    now_us=now_us,
                    meta={"msgid": self.new_id(), "headers": record["headers"]},
                )
            except StoreFull:
                log.warning("eMQP schedule %s could not run: queue full; trying at its next interval", key)
            ran += 1
            if record.get("cron"):
                try:
                    record["next_us"] = self.cron_next(record["cron"], max(record["next_us"], now_us))
                except ProtocolError as exc:  # (a time zone change may leave no next time)
                    log.warning("eMQP schedule %s has no next run and is removed: %s", key, exc.detail)
                    record["remaining"] = 1
            else:
                step = record["interval"] * 1_000_000
                record["next_us"] = max(record["next_us"] + step, now_us + step)
            if record["remaining"] > 0:
                record["remaining"] -= 1
            if record["remaining"] == 0:
                del self.timing[key]  # (the cache is already reset above)
                self.table.delete(key)
            else:
                self.table.put(key, {**record, "payload": payload})
        return ran

    def next_us(self) -> int | None:
        """When the next schedule is due (cached: computed again only after schedules change or run)."""
        if self._next_due is None and self.timing:
            self._next_due = min(r["next_us"] for r in self.timing.values())
        return self._next_due


def _without_payload(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "payload"}
