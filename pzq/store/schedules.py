"""eMQP recurring jobs (SCHEDULE), kept across restarts: the ``schedules`` table.

    schedules   schedule id (utf-8) -> msgpack {"queue": str, "headers": str, "interval": int seconds
                                                (0 with "cron"), "cron": str | absent, "payload": str,
                                                "remaining": int runs (-1 = for ever), "next_us": int, ...}

The id is eventmq's hash of the job (``protocols.emqp.schedule_id``), so an UNSCHEDULE of the same
job finds it. Extra fields a later pzq adds are kept as they are.
"""

from __future__ import annotations

import msgpack

from pzq.store.layout import U64_MAX, whole
from pzq.store.side_table import SideTable

MAX_INTERVAL_S = 999_999_999  # what a SCHEDULE may ask for (nine digits)
MAX_TIME_US = 1 << 62  # next_us and each run's next one must stay in msgpack's and the loop's range
_FIELDS = (("queue", str), ("headers", str), ("interval", int), ("payload", str), ("remaining", int), ("next_us", int))


class Schedules(SideTable[str, dict]):
    NAME = "schedules"

    def key(self, k: str) -> bytes:
        return k.encode()

    def pack(self, v: dict) -> bytes:
        return msgpack.packb(v)

    def unpack(self, key: bytes, value: bytes) -> tuple[str, dict]:
        record = msgpack.unpackb(value)
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

    def all(self) -> dict[str, dict]:
        """Every readable schedule (they are few: read whole at start-up)."""
        return dict(self.items())
