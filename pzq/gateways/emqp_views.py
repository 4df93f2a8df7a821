"""What the web console and the monitor show of eMQP: its workers, schedules and scheduler daemons, and
the workers of a queue (the gateway's ``clients`` and ``queue_consumers``), each list bounded by ``limit``."""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Callable, Hashable, Mapping

from pzq.gateways.emqp_workers import Worker
from pzq.logs import peer_label


def queue_consumers(
    workers: Mapping[bytes, Worker], held: Callable[[Hashable], int], queue: str, limit: int
) -> tuple[list[dict], int]:
    """The workers serving ``queue`` (``limit`` at most; ``held`` counts a holder's jobs) and how many."""
    mine = [w for w in workers.values() if any(name == queue for _, name in w.queues)]
    return [
        {"protocol": "emqp", "client": peer_label(w.identity), "connected_us": w.connected_us, "held": held(w.consumer)}
        for w in mine[:limit]
    ], len(mine)


def tables(
    workers: Mapping[bytes, Worker],
    held: Callable[[Hashable], int],
    schedules: Mapping[str, dict],
    schedulers: Mapping[bytes, float],
    now: float,
    limit: int,
    offset: int = 0,
) -> list[dict]:
    """The console's tables of workers, schedules and scheduler daemons (each from the ``offset``-th)."""
    rows = [
        [
            peer_label(w.identity),
            ", ".join(f"{name} ({weight})" for weight, name in w.queues)[:200],
            w.slots,
            "yes" if w.draining else "no",
            round(now - w.last_seen, 1),
            held(w.consumer),
            w.connected_us,
        ]
        for w in itertools.islice(workers.values(), offset, offset + limit)
    ]
    timing = [
        [
            key,
            t.get("queue", ""),
            f"cron {t['cron']}" if t.get("cron") else f"every {t.get('interval', 0)} s",
            "forever" if t.get("remaining", -1) < 0 else t.get("remaining"),
            _utc(t.get("next_us", 0)),
        ]
        for key, t in itertools.islice(schedules.items(), offset, offset + limit)
    ]
    daemons = itertools.islice(schedulers.items(), offset, offset + limit)
    heard = [[peer_label(p), round(now - seen, 1)] for p, seen in daemons]
    return [
        {
            "kind": "emqp-workers",
            "title": "Workers",
            "columns": [
                "worker",
                "queues (weight)",
                "free slots",
                "draining",
                "heard, s ago",
                "jobs in flight",
                "connected_us",
            ],
            "rows": rows,
            "total": len(workers),
        },
        {
            "kind": "emqp-schedules",
            "title": "Schedules",
            "columns": ["schedule", "queue", "when", "runs left", "next run"],
            "rows": timing,
            "total": len(schedules),
        },
        {
            "kind": "emqp-schedulers",
            "title": "Scheduler daemons",
            "columns": ["scheduler", "last heard, s ago"],
            "rows": heard,
            "total": len(schedulers),
        },
    ]


def _utc(us: int) -> str:
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if us else "-"
