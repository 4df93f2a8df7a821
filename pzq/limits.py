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
    # Raw reads (up to 8 KiB each) libzmq keeps for one raw-TCP connection until a turn reads them: 512 KiB
    # a connection (was 1,000, 8 MiB: 100 connections sending as fast as TCP lets them held 842 MiB; the
    # store's rate is the same at 64, `pzq bench --protocol phpmq`: the rest waits in TCP)
    stream_pipe_reads: int = 64
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
    snapshot_max: int = 2_500  # messages in one SNAPSHOT reply: ~3.5 us each, so ~9 ms (i26c-api; was 10,000, 35 ms)
    max_dedup_keys: int = 1_000_000  # PRODUCE keys remembered at once
    api_reply_bytes: int = 1 << 20  # a FETCH or SNAPSHOT reply stops growing past this many body bytes (~2.5 ms)
    api_turn_work_s: float = 0.02
    # Replies waiting in one client's pipe (its SNDHWM): a lock-step client needs one, a resend two; each may
    # be api_reply_bytes and one message, so the pipe holds at most three of them (with libzmq's encoder)
    api_replies_unread: int = 2
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
    # Event segments one rebind's --remove-mask may split, index and check (about 0.4 us each on one
    # core): one request stays far under the turn budget (slice i26-shares; it was 200,000, 60 ms a line)
    mqks_mask_work: int = 10_000
    # Bytes of one consume or rebind line (10,000 events of 25 bytes): a longer one is refused before it
    # is parsed, which costs about 10 ms a MiB (more events go in with --add, in several requests)
    mqks_bind_line_bytes: int = 256 << 10
    # The turn budget (slice i26-budget; pzq/server/loop.py, TurnBudget in pzq/endpoints/base.py): every
    # turn's work outside the commit (reads and decoding, dispatch, expiry, lease returns, the tick) stops
    # between requests after this long, and the rest goes first next turn. (3 ms since slice i26c-turn, was
    # 10: the commit and the flush come on top of it, and a request through eMQP waits for three turns or
    # more; `pzq bench` native throughput measured the same with 10, 5 and 3 ms)
    turn_budget_s: float = 0.003
    # Bytes of messages one turn lets in, all endpoints together: the commit pays for them all. A native
    # message that would take a turn past it is held and written in turns of its own: in chunks of
    # body_chunk_bytes (pzq/store/bodies.py) past that size, this many bytes a turn, so no commit carries
    # much more than this (2 MiB since slice i26e-chunks: was 16, one 16 MiB commit held every client
    # 25-60 ms; 2 MiB commits in 4-8 ms on the development disk)
    turn_write_bytes: int = 2 << 20
    # Queues made by clients' requests (slice i26-queues; pzq/broker/implicit.py): this part of --max-queues
    # is kept for explicit (configured) queues; one client (a connection, or a CURVE key) has at most this
    # part of --max-queues made by its requests alive at once; the expiry sweep looks at this many a turn
    implicit_reserved_part: int = 10
    implicit_connection_part: int = 100
    implicit_sweep_per_turn: int = 256
    # Fair shares of the pools clients make things in (slice i26-shares; ClientShares below): eMQP
    # schedules (max_schedules, per CURVE key or frontend peer), API consumer groups (max_groups, per CURVE
    # key or peer) and MQKS bindings (mqks_max_bindings, per connection). A client holds at most this part
    # of a pool, and this part of it is kept for clients that hold none yet.
    share_part: int = 8
    share_reserve_part: int = 8
    # One memory bound (slice i26-mem: pzq/endpoints/memory.py). Unread reply bytes one peer may hold before
    # its requests for big replies (API SNAPSHOT, FETCH) are refused: a lock-step client holds at most
    # one reply; the API endpoint raises it to two of its biggest replies
    memory_peer_share: int = 12 << 20
    # Big replies are made while the total stays under --memory-low-water and this much more; none past it
    # (``ERR busy``), so that slow readers of big replies never raise the alarm that closes the server to
    # every producer
    memory_reply_reserve: int = 0
    memory_peers_tracked: int = 10_000  # peers whose pipe estimate one socket remembers
    # The byte account of deliveries (pzq/broker/accounts.py): bodies handed to one payer (a connection,
    # a worker, a batched consumer) and not known to be gone (acked, or its connection closed), past which
    # it is handed nothing more; one that holds nothing may always have one message
    delivery_share: int = 16 << 20
    # Past the memory bound's high-water mark (the alarm, raised by what pzq cannot refuse), consumers go
    # on draining: a payer that holds nothing still gets one message while everything counted stays under
    # the high-water mark and this much more
    delivery_alarm_slack: int = 64 << 20
    # A failed commit (slice i26-send; pzq/broker/state.py): native consumers' acks since the last commit
    # that a rollback undoes are done again, this many at most (older ones: the message is delivered again)
    rollback_acks_kept: int = 10_000
    # Incoming pipes bounded by bytes (slice i26b-big): libzmq bounds a pipe in messages (RCVHWM), so a
    # producer pipelining 60 messages of 16 MiB parked 960 MiB in its pipe under RCVHWM 1000. Each
    # receiving pipe now holds about this many bytes of its largest messages (see pipe_messages), and at
    # least pipe_in_floor messages so that a producer's next message is already there when a turn reads.
    # 128 MiB since r10-house (was 64): 127 messages under the default 1 MiB --max-message-size, so that
    # a legacy producer's window of 100 is in its pipe (63 deep: 40 messages a commit; 127: 53, as
    # db15207's 1,000 deep; scripts/hotpath_profile.py, noisy shared machine)
    pipe_in_bytes: int = 128 << 20
    pipe_in_floor: int = 4
    # Native messages held for turns of their own (pzq/endpoints/native.py, big ones and what their
    # producers sent after them): past this many bytes in all reading stops, and a producer that holds one
    # already is answered "busy" past a quarter of it
    held_in_bytes: int = 64 << 20
    # r10-house (issue 39): libzmq cuts off, without a word, a peer whose frame is past its socket's
    # MAXMSGSIZE. The receiving sockets with a "too large" answer (native, API) read frames up to this size
    # even when --max-message-size is smaller (1 MiB by default, was 16 MiB), so that a message over the
    # limit, up to the old default, is read and answered: a client upgraded past is told, never cut off.
    # Their RCVHWM is sized by --max-message-size (pipe_messages), not by this: refused messages a client
    # pipelines are read and answered at once, never held (docs/limits.md, "Memory bound")
    frame_answered: int = 16 << 20
    # The length of a whole turn (slice i26c-turn; TurnBudget in pzq/endpoints/base.py): records one turn
    # may touch, all its work together (a request served counts one; a delivery, an ack, a return or an
    # expiry each counts one), so that the commit and the flush that follow it (neither of which the
    # budget's clock sees) stay bounded; and the records one run of work (a dispatch, an expiry) handles
    # between two looks at the budget
    turn_records: int = 1_000
    turn_chunk: int = 128
    # Stale seqs (of messages taken back, then acked late) one take passes over in a queue's heap of
    # returned messages before it stops (the rest the next take): each costs a store lookup
    take_skips: int = 512
    # What survives a full garbage collection is frozen, so the next walks only what is new; everything is
    # walked (cyclic garbage among frozen objects freed) every --gc-whole-interval, unless that walk is
    # estimated (frozen objects x the least a walk measured one to cost) past this: then it is put off and logged
    # (pzq/server/collector.py; r10-mqks: 880,000 MQKS bindings had made it 200-260 ms, a few ms since)
    gc_whole_most_s: float = 0.025

    # API fairness (slice i26c-api, pzq/endpoints/api.py): requests read and not yet carried out, per
    # client connection; past either share its further requests are answered ERR busy (nothing done, the
    # client asks again). And the messages of one PRODUCE, refused from the list's header before decoding:
    # ~4 us each on the loop, so 2,000 fit a turn's ~10 ms (the Spark sink sends 1,000).
    api_pending_per_peer: int = 16
    api_pending_peer_bytes: int = 2 << 20
    api_max_produce: int = 2_000
    # r10-phpmq-big (issue 39): the bytes of a PRODUCE's arguments frame holding more than one message (a
    # turn's commit holds them all; one message may be bigger: it is written a part per turn). Refused from
    # the frame's size and the list's header; pzq's clients cut their messages into PRODUCEs by bytes
    api_produce_bytes: int = 2 << 20

    # MQKS fairness between connections (slice i26c-mqks; pzq/gateways/mqks.py, pzq/endpoints/stream.py):
    # lines read but not served count against the connection's share of --max-partial-input; one that
    # holds this part of its share has no room: libzmq's fair queue hands it to the endpoint at most once
    # more a turn (the rest waits in its pipe and TCP), while connections with room are read on
    partial_read_ahead_part: int = 2

    # Big bodies in chunks (slice i26e-chunks; pzq/store/bodies.py): a native message held for turns of its
    # own is written in chunks of this many bytes, turn_write_bytes a turn, when it is bigger than one chunk
    body_chunk_bytes: int = 1 << 20

    # Batched native consumers (slice i27-consume; pzq/gateways/native_consume.py, docs/native-batch.md):
    # what one consumer may hold and be granted together (held deliveries + credit), the messages of one
    # DELIVER and the bytes of one (past them the batch is cut; a bigger message goes alone), keys in one
    # ACK or NACK, consumers at once (a HELLO past it evicts the oldest that holds nothing and has no
    # credit, else is refused), and how long one may stay silent holding nothing before it is forgotten
    consume_max_credit: int = 1_000
    consume_max_batch: int = 100
    consume_batch_bytes: int = 1 << 20
    consume_max_keys: int = 1_000
    consume_max_consumers: int = 256
    consume_idle_s: float = 60.0

    # i27-produce: batched native producers (PZQ-BATCH/1, pzq/gateways/native_batches.py, docs/native-batch.md).
    # A batch is stored in one call and never split across turns, so it holds at most a turn's records
    # (turn_records) and bytes (turn_write_bytes: the server's cap is the smaller of the two byte limits);
    # its frames together are bounded too (a frame of empty bins is cheap to send and costly to decode).
    # Batch ids remembered for resends: past this many the oldest goes early.
    batch_max_messages: int = 1_000
    batch_max_bytes: int = 2 << 20
    batch_max_frames: int = 4_096
    batch_dedup_ids: int = 100_000

    # r7-legacy-rx (pzq/endpoints/native.py): a producer that filled its receive pipe (RCVHWM, see
    # pipe_messages) has more of its window coming: a turn whose reading ran the pipe dry waits this long
    # at most for libzmq's I/O thread to refill it, again while each wait brings more, so that a commit
    # carries the window's messages rather than a pipe's depth of them
    refill_wait_s: float = 60e-6

    # r7-ops1 (issue 29, logs an operator can read; pzq/logs.py EventTally): per-message events (a message
    # dead-lettered, with its reason) are counted per queue and logged as one INFO line per queue this
    # often, for at most event_log_queues queues (the others summed in one more line)
    event_log_s: float = 10.0
    event_log_queues: int = 20

    # r8-proc (issue 28; pzq/server/console_child.py): the web console is a child process of `pzq serve`.
    # One that dies is started again after console_restart_first_s, the wait doubling up to
    # console_restart_most_s, back to the first once a child has lived console_restart_reset_s; a stop
    # waits console_stop_s after SIGTERM, then SIGKILLs it. The console asks pzq for STATS every
    # console_poll_s, however many browsers watch (its --poll-interval). It runs at this much lower CPU
    # priority (nice), so that the broker's turns come first when both want a core
    console_nice: int = 5  # (where SCHED_IDLE is not to be had, or console_sched_idle is off)
    console_sched_idle: bool = True  # the console runs under SCHED_IDLE: only on CPU time nobody else wants
    console_restart_first_s: float = 1.0
    console_restart_most_s: float = 30.0
    console_restart_reset_s: float = 60.0
    console_stop_s: float = 5.0
    console_poll_s: float = 1.0

    # r8-admin (issue 28, the monitor's admin requests; pzq/admin/): rows one QUEUE, PEEK, DEAD or CLIENTS
    # answer lists at most (and dead letters one REQUEUE/DELETEDEAD ... all moves), the body bytes each
    # PEEK/DEAD row shows, ready messages a PURGE walks per turn (a big queue is purged over turns),
    # records a PEEK walks past in flight before it answers with what it found, and the time the
    # monitor's reads may take after a turn's commit (the rest wait for the next turn); the queues whose head
    # age (STATS oldest_age_s, the metrics') one once-a-second tick reads (the others in the next ticks)
    admin_rows: int = 1_000
    admin_head_bytes: int = 1_024
    admin_purge_share: int = 5_000
    admin_skip_walk: int = 4_096
    admin_read_s: float = 0.005
    admin_heads_per_tick: int = 1_000
    # r10-monitor (issue 39; pzq/admin/figures.py, pzq/endpoints/monitor.py): STATS and MONITOR are built
    # over turns, this long a turn (9,000 queues of 255-byte names: 29 ms at once); unread monitor answers
    # in all (their pipes, an answer sent to many clients once, and backlogs), of which this part is kept
    # for clients that hold none (20 DEALERs pipelining STATS unread had 1,124 MiB and raised the alarm)
    admin_figures_s: float = 0.002
    monitor_answers_bytes: int = 64 << 20
    monitor_answers_reserve_part: int = 4

    # r10-emqp (issue 39; pzq/endpoints/stuck.py): a peer that reads nothing while pzq has bytes for it (an
    # eMQP subscriber or worker whose TCP connection had none of the bytes waiting for it acknowledged) is
    # cut off after stuck_reader_s; each connection is looked at once every stuck_check_s, and at most
    # stuck_checks_per_turn of them a turn (a look is two system calls)
    stuck_reader_s: float = 5.0
    stuck_check_s: float = 1.0
    stuck_checks_per_turn: int = 64

    def frame_bytes(self, max_message_size: int) -> int:
        """The largest frame a receiving socket with a "too large" answer reads (its MAXMSGSIZE less the
        envelope): ``max_message_size``, or ``frame_answered`` if bigger."""
        return max(max_message_size, self.frame_answered)

    # r10-native (issue 39; pzq/gateways/native_pool.py, pzq/endpoints/native_send.py): the legacy send
    # socket's consumers cannot be told apart, so its deliveries' bodies form one pool in the byte account;
    # its pipes hold at most this many deliveries (SNDHWM: half the pool of the largest message, at least
    # native_send_pipe_floor: a small delivery costs ~15 % more server CPU at 16 than at 1,000, ~50 % at 4);
    # a connection whose TCP stream has not moved for native_send_stall_s while data waits for it is cut;
    # epochs of the pool are closed and checked this often while stale copies wait for their release
    native_send_pool: int = 64 << 20
    native_send_pipe_floor: int = 16
    native_send_stall_s: float = 10.0
    native_send_check_s: float = 1.0

    def send_pipe_messages(self, message_size: int) -> int:
        """The native send socket's SNDHWM: what half of ``native_send_pool`` holds of messages of
        ``message_size`` bytes, at least ``native_send_pipe_floor`` and at most 1,000."""
        return max(self.native_send_pipe_floor, min(1000, self.native_send_pool // 2 // max(message_size, 1)))

    def pipe_messages(self, message_size: int, cap: int) -> int:
        """The RCVHWM of a pipe whose messages may be ``message_size`` bytes: what ``pipe_in_bytes`` holds
        of them, at least ``pipe_in_floor`` and at most ``cap`` messages."""
        return max(self.pipe_in_floor, min(cap, self.pipe_in_bytes // max(message_size, 1)))


DEFAULT_LIMITS = Limits()


class ClientShares:
    """What each client holds of one pool that every client draws on (eMQP schedules, API consumer
    groups, MQKS bindings), so that no client takes it all (slice i26-shares).

    A client (a CURVE key where there is one, else a connection: a ZeroMQ peer's routing identity or a
    raw-TCP connection) holds at most ``limit // Limits.share_part``; and the last
    ``limit // Limits.share_reserve_part`` of the pool is kept for clients that hold none yet, so that
    however many clients filled it, another can still begin. Counts are in memory: what was made before
    a restart belongs to no one (the pool's own limit still counts it). The caller refuses with its
    protocol's error and counts nothing else; ``refused_total`` counts the refusals."""

    def __init__(self, limit: int, limits: Limits):
        self.limit = limit
        self.share = max(1, limit // limits.share_part)
        self.reserve = limit // limits.share_reserve_part
        self.held: dict[object, int] = {}
        self.refused_total = 0

    def refusal(self, client: object, total: int, more: int = 1) -> str | None:
        """Why ``client`` may not take ``more`` of the pool, of which ``total`` is taken; None if it may.
        A refusal is counted."""
        held = self.held.get(client, 0)
        reason = None
        if held + more > self.share:
            reason = f"one client may hold {self.share} (it holds {held})"
        elif held and total + more > self.limit - self.reserve:
            reason = f"the last {self.reserve} of {self.limit} are kept for clients that hold none yet"
        if reason is not None:
            self.refused_total += 1
        return reason

    def add(self, client: object, count: int = 1) -> None:
        """``client`` took ``count`` (or gave back, if negative: never below nothing)."""
        held = max(0, self.held.get(client, 0) + count)
        if held:
            self.held[client] = held
        else:
            self.held.pop(client, None)

    def forget(self, client: object) -> None:
        """The client is gone (a closed connection): what it made stays, counted by the pool alone."""
        self.held.pop(client, None)
