"""The code's own limits: shares, chunks and caps that are not settings of `pzq serve`.

One frozen object, reached through ``Config.limits`` (and importable from pzq.config); tests pass small
values (``Limits(max_runs=1)``) instead of patching modules. Each owner reads only its own fields.
Durations are seconds.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Limits:
    """The limits that are not settings of `pzq serve`: shares, chunks and caps the code keeps so that no
    client can make the loop work or hold memory without bound. One frozen object, reached through
    ``Config.limits``; tests pass small values (``Limits(max_runs=1)``) instead of patching modules.
    Each owner reads only its own fields. Durations are seconds."""

    # The loop and every endpoint
    read_batch: int = 4096  # messages read from one socket per turn
    # Bytes one socket's reads may bring into a turn: with 16 MiB messages, a turn of read_batch messages
    # could hold gigabytes. What is left waits in the socket for the next turn (polled level-triggered).
    turn_bytes: int = 8 << 20
    # Replies waiting for one ZeroMQ peer (pzq/endpoints/replies.py)
    backlog_messages: int = 10_000
    backlog_bytes: int = 16 << 20
    reply_stale_s: float = 60.0  # a backlog its peer took nothing of for this long is dropped
    # Raw TCP connections (pzq/endpoints/stream.py)
    stream_backlog_bytes: int = 16 << 20  # unsent replies for a slow reader; past this it is closed
    # The broker
    late_memory: int = 50_000  # deliveries taken back early whose late answers are still recognised
    # Range leases (pzq/leases.py, the API and Spark)
    lease_call_budget_s: float = 0.010  # one lease or fetch call's work
    lease_chunk: int = 1_000  # messages taken between two looks at the clock
    fetch_chunk: int = 1_000
    max_lease: int = 1_000_000  # messages one lease call may take
    max_fetch: int = 10_000  # messages one fetch may return
    lease_work_per_turn: int = 5_000  # acknowledged (or expired) messages handled per turn
    max_runs_per_group: int = 10_000
    max_runs: int = 100_000
    max_groups: int = 100_000
    # The API gateway
    snapshot_max: int = 10_000
    max_dedup_keys: int = 1_000_000  # PRODUCE keys remembered at once
    api_reply_bytes: int = 4 << 20  # a FETCH or SNAPSHOT reply stops growing past this many body bytes
    api_turn_work_s: float = 0.02
    api_replies_unread: int = 8  # replies waiting in one client's pipe
    # The MQKS gateway
    mqks_turn_budget: int = 100  # deliveries per consumer per turn
    mqks_max_events: int = 10_000  # events bound to one queue
    mqks_max_masks: int = 100  # --remove-mask masks in one request
    mqks_max_consumers: int = 1000  # consumers on one connection
    mqks_max_all_consumers: int = 100_000
    mqks_max_bindings: int = 1_000_000  # (queue, event) bindings of every queue together
    mqks_max_unacked_per_conn: int = 10_000
    mqks_put_back_per_turn: int = 2_000
    # The eMQP gateway
    max_schedules: int = 10_000
    max_cron: int = 255  # characters of a cron expression
    emqp_remembered: int = 1024  # dropped workers whose queues are kept
    max_schedulers: int = 100
    # The web console
    console_connection_s: float = 15.0  # a connection's whole life
    console_connections_per_s: int = 100
    # Logs and disk (i26-logsdisk)
    store_failure_log_s: float = 10.0  # a failing commit logs one line at most this often
    # The eMQP scheduler (helper "scheduler", issue 26): a turn runs due schedules in due order up to a
    # share, the rest the next turn; a cron expression is searched at most cron_max_years ahead (8: the
    # longest gap between two 29ths of February), so no SCHEDULE or run searches for decades.
    schedule_runs_per_turn: int = 200
    schedule_turn_s: float = 0.005
    cron_max_years: int = 8
    # Fair shares of the connection pools (slice i26-shares: pzq/endpoints/shares.py)
    connections_reserved_part: int = 4  # this part of --max-connections is split evenly into endpoint reserves
    partial_reserved_part: int = 4  # the same for --max-partial-input among the raw-TCP endpoints
    partial_connection_part: int = 8  # one connection holds at most this part of --max-partial-input,
    partial_slack: int = 64 << 10  # or one message of --max-message-size and this much, if smaller
    # decoders: sizes and counts checked from the frame before anything is built (issue 26)
    emqp_header_bytes: int = 64 << 10  # an eMQP headers frame (eventmq's name a few flags)
    emqp_header_items: int = 64  # comma-separated items in it
    mqks_mask_work: int = 200_000  # event segments one rebind's --remove-mask may split, index and check
    # The turn budget (slice i26-budget; pzq/server/loop.py, TurnBudget in pzq/endpoints/base.py): every
    # turn's work outside the commit (reads and decoding, dispatch, expiry, lease returns, the tick) stops
    # between requests after this long, and the rest goes first next turn
    turn_budget_s: float = 0.010
    # Bytes of messages one turn lets in, all endpoints together: the commit pays for them all. A native
    # message that would take a turn past it is committed in a turn of its own, so that the small messages
    # read before it do not wait for its write (with 16 MiB, a message of --max-message-size's default)
    turn_write_bytes: int = 16 << 20
    # A failed commit (slice i26-send; pzq/broker/state.py): native consumers' acks since the last commit
    # that a rollback undoes are done again, this many at most (older ones: the message is delivered again)
    rollback_acks_kept: int = 10_000


DEFAULT_LIMITS = Limits()
