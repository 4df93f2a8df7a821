"""One synchronous write a commit (docs/semantics.md, "One sync a commit"): a commit syncs its data
pages and leaves its meta page for the next commit's sync, and nothing derived from it leaves before
that page is on disk. The power-cut cases are in tests/test_power_cut.py; these check the bookkeeping,
the lone producer, the sharing of syncs under load and a sync that fails."""

from __future__ import annotations

import threading

from test_power_cut import durable_image, produce_until_the_power_goes, shim  # noqa: F401 - shim: the fixture

from pzq.clients import native as client
from pzq.errors import ExitCode
from pzq.store import Store


def test_a_commit_leaves_its_meta_page_to_the_next_and_a_commit_that_wrote_nothing_syncs_nothing(tmp_path):
    store = Store(str(tmp_path / "db"), max_size=64 << 20)
    try:
        assert not store.env._env.flags()["metasync"]
        assert not store.env._env.flags()["writemap"] and not store.env._env.flags()["map_async"]
        store.put_many("default", [[b"a"]], now_us=1)
        store.commit()
        first, syncs = store.committed, store.syncs
        assert store.durable < first, "its meta page waits for the next sync"
        store.commit()  # nothing written
        assert (store.committed, store.durable, store.syncs) == (first, store.durable, syncs)
        store.put_many("default", [[b"b"]], now_us=2)
        store.commit()
        assert store.durable == first, "the second commit's data sync carried the first one's meta page"
        assert store.committed > first
        store.sync()
        assert store.durable == store.committed and store.meta_syncs == 1
        store.sync()  # everything on disk: no sync at all
        assert store.meta_syncs == 1
    finally:
        store.close()


def test_a_lone_producers_ack_waits_neither_for_the_next_message_nor_for_the_commit_interval(make_server):
    srv = make_server(commit_interval=30.0)
    with client.Producer(srv.receive, timeout_s=3) as producer:
        for i in range(5):
            assert producer.produce([b"alone %d" % i]).ok  # (one at a time: no later commit to carry it)
    assert srv.stats()["meta_syncs_total"] >= 5


def test_producers_that_keep_the_server_busy_share_syncs_one_commit_carrying_the_last(make_server):
    srv = make_server()
    errors: list[str] = []

    def produce(n: int) -> None:
        with client.Producer(srv.receive, timeout_s=10) as producer:
            for start in range(0, 2000, 50):
                results = producer.produce_many([[b"p%d-%d" % (n, i)] for i in range(start, start + 50)])
                if not all(r.ok for r in results):
                    errors.append(f"producer {n}: refused")

    before = srv.stats()
    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    after = srv.stats()
    assert errors == [] and after["messages"] == 16_000
    commits = after["syncs"] - before["syncs"]
    own = after["meta_syncs_total"] - before["meta_syncs_total"]
    assert own < commits, f"{own} meta pages synced on their own for {commits} commits: no commit carried one"


def test_a_sync_that_fails_with_acks_waiting_stops_the_server_with_status_7_and_sends_none_of_them(
    process_server,
    shim,  # noqa: F811
    tmp_path,
):
    journal = tmp_path / "journal"
    env = {"LD_PRELOAD": str(shim), "PZQ_POWERCUT_JOURNAL": str(journal), "PZQ_POWERCUT_FAIL_SYNC": "20"}
    srv = process_server(env=env)
    acked, _ = produce_until_the_power_goes(srv)  # (here the server stops by itself, its sync failed)
    assert srv.proc.returncode == ExitCode.SYNC_LOST, srv.log.read_text()[-2000:]
    assert "a restart starts again from what is on disk" in srv.log.read_text()
    # What the failed sync was to carry is not on disk: no ack for it left
    image = tmp_path / "after-the-failure"
    image.mkdir()
    (image / "data.mdb").write_bytes(durable_image(journal))
    assert b"F" in journal.read_bytes(), "the sync failed"
    store = Store(str(image), max_size=64 << 20, verify=True)
    try:
        found = {b"".join(m.frames) for m in store.scan("default", 0, 3000)}
    finally:
        store.close()
    assert acked, "acks flowed before the failure"
    assert acked <= found, f"{len(acked - found)} acks sent for messages the failed sync did not keep"
