"""eMQP recurring jobs (SCHEDULE), kept across restarts: the ``schedules`` table.

    schedules   schedule id (utf-8)        -> msgpack {"queue": str, "headers": str, "interval": int seconds
                                                      (0 with "cron"), "cron": str | absent, "payload": str,
                                                      "remaining": int runs (-1 = for ever), "next_us": int, ...}
                b"\\x00" + schedule id      -> msgpack [next_us, remaining]: the moving part (format 2)

The id is eventmq's hash of the job (``protocols.emqp.schedule_id``), so an UNSCHEDULE of the same
job finds it. Extra fields a later pzq adds are kept as they are.

The whole record (with its payload, up to --max-message-size) is written once, at SCHEDULE; each run
writes only its small run record, which overrides the whole record's next_us and remaining. A store
of format 1 has no run records: its schedules run from their whole records as they are. (Store format
2: a format-1 pzq would read the whole record's first next_us and remaining and run spent runs again.)
Schedule ids are hex digests and never start with NUL, so run records sort apart, before them.
"""

from __future__ import annotations

import msgpack

from pzq.store.layout import U64_MAX, UNREADABLE, whole
from pzq.store.side_table import SideTable

MAX_INTERVAL_S = 999_999_999  # what a SCHEDULE may ask for (nine digits)
MAX_TIME_US = 1 << 62  # next_us and each run's next one must stay in msgpack's and the loop's range
RUN = b"\x00"  # the prefix of run records' keys
_FIELDS = (("queue", str), ("headers", str), ("interval", int), ("payload", str), ("remaining", int), ("next_us", int))


class Schedules(SideTable[str, dict]):
    NAME = "schedules"

    def key(self, k: str) -> bytes:
        return k.encode()

    def pack(self, v: dict) -> bytes:
        return msgpack.packb(v)

    def unpack(self, key: bytes, value: bytes) -> tuple[str, dict]:
        """A whole record, or (for a run record) ``("\\x00" + id, {"next_us", "remaining"})``."""
        record = msgpack.unpackb(value)
        if key.startswith(RUN):
            next_us, remaining = record
            return key.decode(), {
                "next_us": whole(next_us, "schedule next_us", 0, MAX_TIME_US),
                "remaining": whole(remaining, "schedule remaining", -1, U64_MAX),
            }
        for name, kind in _FIELDS:
            if not isinstance(record[name], kind):
                raise TypeError(f"schedule field {name} is not {kind.__name__}")
        cron = record.get("cron")
        if cron is not None and not isinstance(cron, str):
            raise TypeError("schedule field cron is not str")
        if not 1 <= len(record["queue"].encode()) <= 255:  # (a run would fail every turn)
            raise ValueError(f"schedule queue {record['queue'][:40]!r} is not 1 to 255 bytes")
        whole(record["interval"], "schedule interval", 0, MAX_INTERVAL_S)
        whole(record["next_us"], "schedule next_us", 0, MAX_TIME_US)
        whole(record["remaining"], "schedule remaining", -1, U64_MAX)
        if record["interval"] == 0 and not cron:  # (a cron schedule keeps interval 0)
            raise ValueError("schedule interval is not positive")
        return key.decode(), record

    def put(self, k: str, v: dict) -> None:
        """Store the whole record of ``k`` (a new or replaced SCHEDULE: its run record, if any, goes)."""
        super().put(k, v)
        self.delete_raw(RUN + self.key(k))

    def ran(self, k: str, next_us: int, remaining: int) -> None:
        """A run of ``k``: its next time and the runs left, in its small run record. Never refused for
        room (at most one ~60-byte record per schedule, and a schedule's next run must not fail)."""
        key = RUN + self.key(k)
        self._env.do(self._env.write().put, key, msgpack.packb([next_us, remaining]), db=self._db)
        self.store.side_changed(self.NAME)

    def payload(self, k: str) -> str | None:
        """The payload of ``k`` (its whole record read alone); None when there is none or it is damaged."""
        record = super().get(k)
        return None if record is None else record["payload"]

    def get(self, k: str) -> dict | None:
        """The record of ``k`` with its run record's next_us and remaining; None if there is none."""
        record = super().get(k)
        if record is None:
            return None
        raw = self.get_raw(RUN + self.key(k))
        if raw is not None:
            try:
                record.update(self.unpack(RUN + self.key(k), raw)[1])
            except UNREADABLE:  # (a damaged run record: the schedule runs from its whole record)
                pass
        return record

    def delete(self, k: str) -> bool:
        """Remove the schedule ``k`` (its whole record and its run record); False if there was none."""
        found = self.delete_raw(RUN + self.key(k))
        return self.delete_raw(self.key(k)) or found

    def items(self, prefix: bytes = b"") -> list[tuple[str, dict]]:
        """Every readable schedule, in key order, each with its run record applied; damaged records are
        skipped, logged and counted (SideTable.items)."""
        runs: dict[str, dict] = {}
        out = []
        for key, record in super().items(prefix):
            if key.startswith(RUN.decode()):
                runs[key[1:]] = record
            else:
                out.append((key, record))
        return [(key, {**record, **runs.get(key, {})}) for key, record in out]

    def all(self) -> dict[str, dict]:
        """Every readable schedule (they are few: read whole at start-up)."""
        return dict(self.items())
