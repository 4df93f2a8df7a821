"""The monitor's answers without a socket: figures, dead letters, and a REQUEUE that writes inside the
loop's turn and leaves the commit to the loop."""

from __future__ import annotations

import dataclasses
import json

from pzq.admin import Admin
from pzq.admin.writes import UNBOUNDED
from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS
from pzq.protocols import monitor as monitor_proto
from pzq.store import message_id


def admin_on(store) -> Admin:
    return Admin(
        Broker(store, ack_timeout_s=5), store, store_limit=64 << 20, gateways=lambda: {"phpmq": {"connections": 2}}
    )


def ask(text: str) -> monitor_proto.Request:
    return monitor_proto.parse_request([b"peer", b"", text.encode()])


def dead_letter_one(admin: Admin) -> str:
    message = admin.broker.produce("q", [b"poison"], now_us=1)
    admin.broker.store.dead_letters.add(message, "max-deliveries", now_us=2)
    admin.broker.store.commit()
    return message.id


def test_monitor_reports_the_six_pzq_fields_first_then_queues_and_gateways(store):
    admin = admin_on(store)
    admin.broker.produce("q", [b"m"], now_us=1)
    lines = admin.answer(ask("MONITOR")).splitlines()
    assert [line.split(": ")[0] for line in lines[:6]] == list(monitor_proto.PZQ_FIELDS)
    assert lines[0] == "messages: 1"
    assert "queue.q.depth: 1" in lines and "phpmq.connections: 2" in lines


def test_deadletters_lists_what_went_there_and_why(store):
    admin = admin_on(store)
    key = dead_letter_one(admin)
    [letter] = json.loads(admin.answer(ask("DEADLETTERS q")))
    assert (letter["id"], letter["reason"], letter["body"]) == (key, "max-deliveries", ["poison"])


def test_requeue_writes_in_the_turn_and_leaves_the_commit_to_the_loop(store):
    admin = admin_on(store)
    key = dead_letter_one(admin)
    request = ask(f"REQUEUE q {key}")
    assert admin.writes(request) and not admin.writes(ask("MONITOR"))
    syncs = store.syncs
    text, changed = admin.write(request)
    assert changed and json.loads(text)["requeued"] == 1
    assert store.dirty and store.syncs == syncs, "not committed by the monitor"
    assert store.queue("q").count == 1 and store.queue("q").dead_count == 0


def test_requeue_of_an_id_that_is_not_a_dead_letter_changes_nothing(store):
    admin = admin_on(store)
    dead_letter_one(admin)
    text, changed = admin.write(ask(f"REQUEUE q {message_id(store.queue('q').qid, 999)}"))
    assert not changed and json.loads(text)["requeued"] == 0
    text, changed = admin.write(ask("REQUEUE q nope"))
    assert not changed and text.startswith("error: ")
    assert store.queue("q").dead_count == 1


def test_unknown_and_malformed_requests_get_an_error_text(store):
    admin = admin_on(store)
    assert admin.answer(ask("HELLO")).startswith("error: ")
    assert admin.answer(ask("DEADLETTERS")).startswith("error: ")


def test_side_records_skipped_as_unreadable_are_counted_in_the_figures(store):
    from pzq.store.schedules import Schedules

    admin = admin_on(store)
    Schedules(store).put_raw(b"broken", b"\xc1 not msgpack")
    assert Schedules(store).all() == {}
    assert admin.stats()["unreadable_records_total"] == 1


def test_deadletters_lists_bodies_up_to_a_bound_so_big_dead_letters_cannot_stall_the_loop(store):
    # 16 MiB dead letters were all read and rendered in one turn: eight stalled it 5.7 s (500 MB of JSON)
    from pzq.admin import DEAD_LIST_BYTES

    admin = admin_on(store)
    broker = admin.broker
    for i in range(3):  # chunked bodies (store format 4): their chunks count, not only their small records
        upload = broker.begin_big([b"%d" % i, b"z" * (3 << 20)], 1 << 20)
        while not upload.done:
            broker.write_big(upload, 2 << 20)
        broker.produce_big("q", upload, now_us=1)
    for message in broker.take("q", 3, "c", now=Now(0.0, 2)):
        store.dead_letters.add(message, "max-deliveries", now_us=3)
    store.commit()
    letters = json.loads(admin.answer(ask("DEADLETTERS q 10000")))
    assert [letter["body"][0] for letter in letters] == ["0", "1"]  # (past DEAD_LIST_BYTES after the second)
    assert DEAD_LIST_BYTES < 2 * (3 << 20) + 4096
    for i in range(3):
        broker.produce("small", [b"s%d" % i], now_us=4)
    for message in broker.take("small", 3, "c", now=Now(0.0, 5)):
        store.dead_letters.add(message, "max-deliveries", now_us=6)
    store.commit()
    assert len(json.loads(admin.answer(ask("DEADLETTERS small")))) == 3


def test_head_ages_are_read_a_share_of_queues_a_tick_and_every_queue_in_turn(store):
    from pzq.config import Limits

    admin = admin_on(store)
    admin.limits = Limits(admin_heads_per_tick=2)
    for i in range(5):
        store.put_many(f"q{i}", [[b"m"]], now_us=1_000_000)
    store.commit()
    admin.tick(0.0)
    assert len(admin.oldest) == 2
    admin.tick(1.0)
    admin.tick(2.0)
    assert sorted(admin.oldest) == [f"q{i}" for i in range(5)] and min(admin.oldest.values()) > 1e6
    stats = admin.stats()["queues"]
    assert all(stats[f"q{i}"]["oldest_age_s"] > 0 for i in range(5))
    [head] = store.scan("q0", 0, 1)
    store.delete("q0", head.seq)
    store.commit()
    for t in range(3, 6):
        admin.tick(float(t))
    assert "q0" not in admin.oldest and admin.stats()["queues"]["q0"]["oldest_age_s"] == 0.0


def test_a_purge_keeps_what_came_after_it_began_and_stops_when_its_queue_is_deleted(store):
    from pzq.config import Limits

    admin = admin_on(store)
    admin.limits = Limits(admin_purge_share=10)
    store.put_many("q", [[b"old"]] * 25, now_us=1)
    text, changed = admin.write(ask("PURGE q"))
    assert changed and json.loads(text) == {"purged": 10, "more": True} and admin.purging()
    store.put_many("q", [[b"new"]] * 3, now_us=2)  # (produced after the purge began: kept)
    while admin.purging():
        admin.work(UNBOUNDED)
    assert [m.frames for m in store.scan("q", 0, 100)] == [[b"new"]] * 3
    store.put_many("r", [[b"old"]] * 25, now_us=1)
    admin.write(ask("PURGE r"))
    admin.broker.drop_queue("r")
    store.put_many("r", [[b"again"]] * 25, now_us=2)  # (another queue of the same name: untouched)
    admin.work(UNBOUNDED)
    assert not admin.purging() and store.queue("r").count == 25


def test_create_of_a_queue_a_client_request_made_makes_it_explicit_and_says_so(store):
    admin = admin_on(store)
    store.queue("made.by.a.client", implicit=True)
    text, changed = admin.write(ask("CREATE made.by.a.client"))
    assert changed and json.loads(text) == {"created": False, "queue": "made.by.a.client", "was_implicit": True}
    assert store.queue("made.by.a.client", create=False).implicit is False
    assert store.catalog.implicit_count == 0


def test_each_queue_reports_messages_in_and_out_a_second_over_the_last_ten_seconds(store):
    """In: what was stored into the queue (a produce, a dead letter requeued); out: what left it for good
    (acked, dead-lettered, purged); a delivery, a nack and a redelivery are neither."""
    admin = admin_on(store)
    broker = admin.broker
    for i in range(20):
        broker.produce("q", [b"m%d" % i], now_us=1)
    store.commit()
    admin.tick(100.0)
    assert (admin.stats()["queues"]["q"]["in_per_s"], admin.stats()["queues"]["q"]["out_per_s"]) == (0.0, 0.0)
    for i in range(10):
        broker.produce("q", [b"n%d" % i], now_us=2)
    taken = broker.take("q", 6, "c", now=Now(0.0, 3))
    for message in taken[:3]:
        assert broker.ack((message.qid, message.seq), by="c")
    assert broker.nack((taken[3].qid, taken[3].seq), by="c")  # (back to ready: not out)
    store.commit()
    for t in range(101, 111):
        admin.tick(float(t))
    row = admin.stats()["queues"]["q"]
    assert (row["in_per_s"], row["out_per_s"]) == (1.0, 0.3)  # 10 in, 3 acked, over 10 s
    queue = json.loads(admin.answer(ask("QUEUE q")))["figures"]
    assert (queue["in_per_s"], queue["out_per_s"]) == (1.0, 0.3)
    # ten seconds with two dead-lettered then requeued (out, then in again) and a purge
    dead = [dead_letter_one(admin) for _ in range(2)]  # (each produced: 2 in, then dead-lettered: 2 out)
    for letter in dead:
        admin.write(ask(f"REQUEUE q {letter}"))
    store.commit()
    admin.write(ask("PURGE q"))
    store.commit()
    for t in range(111, 121):
        admin.tick(float(t))
    row = admin.stats()["queues"]["q"]
    purged = 20 + 10 + 2 - 3 - 2  # (the ready ones: 3 acked, the 2 in flight stay)
    assert row["depth"] == 2 and row["in_per_s"] == 0.4  # (2 produced, 2 requeued)
    assert row["out_per_s"] == (2 + purged) / 10  # (2 dead-lettered, the purged)
    for t in range(121, 132):
        admin.tick(float(t))
    assert (admin.stats()["queues"]["q"]["in_per_s"], admin.stats()["queues"]["q"]["out_per_s"]) == (0.0, 0.0)


def test_rates_are_kept_for_the_queues_the_store_has_and_no_other(store):
    admin = admin_on(store)
    for i in range(3):
        store.put_many(f"q{i}", [[b"m"]], now_us=1)
    store.commit()
    admin.tick(0.0)
    assert len(admin.rates) == 3
    admin.broker.drop_queue("q1")
    store.commit()
    admin.tick(1.0)
    assert len(admin.rates) == 2 and "q1" not in admin.stats()["queues"]


def test_deleted_queues_rates_and_heads_are_forgotten_a_share_a_tick_never_in_one_walk_of_every_name(store):
    """A walk of every sampled name at the end of each round held one tick 29 ms of CPU at 100,000 queues
    (scripts/admin_tick.py): the names are looked at a share a tick, as the queues are sampled."""
    admin = admin_on(store)
    admin.limits = dataclasses.replace(DEFAULT_LIMITS, admin_heads_per_tick=10)
    for i in range(40):
        store.put_many(f"q{i:02d}", [[b"m"]], now_us=1)
    store.commit()
    for t in range(4):  # (a round: every queue sampled, its head read)
        admin.tick(float(t))
    assert len(admin.rates) == 40 and len(admin.oldest) == 40
    for i in range(0, 40, 2):
        admin.broker.drop_queue(f"q{i:02d}")
    store.commit()
    forgotten = []
    for t in range(4, 12):
        admin.tick(float(t))
        forgotten.append(40 - len(admin.rates))
    assert all(b - a <= 10 for a, b in zip([0, *forgotten], forgotten, strict=False)), forgotten
    assert len(admin.rates) == 20 and sorted(admin.oldest) == [f"q{i:02d}" for i in range(1, 40, 2)]
