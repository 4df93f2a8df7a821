"""The store's own files are never opened through a symbolic link that someone planted in the store
directory: the reserve file's link is replaced (its target untouched), a linked data or lock file is
refused with one clear line."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from pzq.errors import StoreError
from pzq.store import Store

MB = 1 << 20


def outside_file(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"someone else's file")
    return target


def test_a_reserve_link_planted_in_the_store_is_replaced_and_its_target_untouched(tmp_path, make_server, caplog):
    store_dir = tmp_path / "db"
    store_dir.mkdir(mode=0o700)
    target = outside_file(tmp_path)
    os.symlink(target, store_dir / "reserve")
    with caplog.at_level(logging.WARNING, logger="pzq.store"):
        srv = make_server(disk_reserve=MB)
    srv.stop()
    assert target.read_bytes() == b"someone else's file", "the link's target was written through"
    reserve = os.lstat(store_dir / "reserve")
    assert stat.S_ISREG(reserve.st_mode) and reserve.st_size == MB, "the server made its own reserve file"
    assert any("not a regular file" in r.getMessage() for r in caplog.records)


def test_a_reserve_of_its_own_is_kept_as_it_is(tmp_path, make_server):
    srv = make_server(disk_reserve=MB)
    srv.stop()
    before = os.lstat(tmp_path / "db" / "reserve")
    srv = make_server(disk_reserve=MB)
    srv.stop()
    after = os.lstat(tmp_path / "db" / "reserve")
    assert (after.st_ino, after.st_size) == (before.st_ino, MB)


@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb"])
def test_a_store_whose_data_or_lock_file_is_a_link_is_refused(tmp_path, name):
    store_dir = tmp_path / "db"
    Store(store_dir, max_size=MB).close()
    target = outside_file(tmp_path)
    os.unlink(store_dir / name)
    os.symlink(target, store_dir / name)
    with pytest.raises(StoreError, match="is a symbolic link"):
        Store(store_dir, max_size=MB)
    assert target.read_bytes() == b"someone else's file"
