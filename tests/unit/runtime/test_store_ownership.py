"""The queue watch's plain parts: which pollers are of another store, and when to look."""

from __future__ import annotations

from itertools import islice

from refloop.worker.ownership import STORE_TAG, foreign_pollers, look_delays, worker_identity


def test_only_pollers_announcing_another_store_are_foreign():
    mine, other = worker_identity("aa11"), worker_identity("bb22", host="h2")
    assert foreign_pollers([mine, other, "123@stock-worker"], "aa11") == [other]
    assert foreign_pollers([mine], "aa11") == []
    assert f"@h2 {STORE_TAG}bb22" in other


def test_looks_come_soon_after_start_then_settle_to_the_slow_watch():
    # A worker that joins a few seconds after this one is seen at the next early look,
    # not a minute later; the watch then costs one look a minute.
    assert list(islice(look_delays(2.0, 60.0), 8)) == [2, 4, 8, 16, 32, 60, 60, 60]
    assert list(islice(look_delays(5.0, 3.0), 3)) == [5, 3, 3]
