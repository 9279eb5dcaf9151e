"""Checkpoint objects in the shared database (real PostgreSQL): a checkpoint taken on one
host is restored from the database alone on another, each content stored once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select

from refloop.checkpoints.objects import CheckpointObjectRecord, DatabaseObjectStore, content_key
from refloop.checkpoints.restore import restore_checkpoint
from refloop.checkpoints.snapshot import load_manifest, take_checkpoint
from tests.constants import TEST_DATABASE_URL


@pytest.fixture(scope="module")
def store() -> DatabaseObjectStore:
    return DatabaseObjectStore(create_engine(TEST_DATABASE_URL))


def on(directory: Path, action, *args):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return action(fd, *args)
    finally:
        os.close(fd)


def count(store: DatabaseObjectStore, keys: set[str]) -> int:
    with store.engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(CheckpointObjectRecord).where(
            CheckpointObjectRecord.key.in_(keys))).scalar_one()  # type: ignore[attr-defined]


def test_a_checkpoint_is_restored_on_an_empty_disk_from_the_database_alone(tmp_path, store):
    host_a = tmp_path / "a"
    (host_a / "pkg").mkdir(parents=True)
    unique = os.urandom(8).hex()  # other runs share the database
    (host_a / "pkg" / "mod.py").write_text(f"value = '{unique}'\n")
    (host_a / "data.bin").write_bytes(bytes(range(256)) * 100)
    snap = on(host_a, take_checkpoint, store)

    host_b = tmp_path / "b"  # another host: none of a's disk, only the shared database
    host_b.mkdir()
    reader = DatabaseObjectStore(create_engine(TEST_DATABASE_URL))
    on(host_b, restore_checkpoint, reader, load_manifest(reader, snap.checkpoint_id))

    assert (host_b / "pkg" / "mod.py").read_text() == f"value = '{unique}'\n"
    assert (host_b / "data.bin").read_bytes() == bytes(range(256)) * 100


def test_the_same_content_from_two_tasks_is_one_row(tmp_path, store):
    content = f"shared {os.urandom(8).hex()}\n".encode()
    for name in ("one", "two"):
        ws = tmp_path / name
        ws.mkdir()
        (ws / f"{name}.txt").write_bytes(content)
        snap = on(ws, take_checkpoint, store)
        assert snap.stats.new_objects == (1 if name == "one" else 0)
    assert count(store, {content_key(content)}) == 1


def test_missing_and_get_in_batches_larger_than_one_statement(store):
    objects = {content_key(data): data for data in
               (f"object {i} {os.urandom(4).hex()}".encode() for i in range(1_200))}
    assert store.missing(objects) == set(objects)
    store.put_many(objects)
    store.put_many(objects)  # a retried activity: no error, no second row
    assert store.missing(objects) == set()
    assert store.get_many(objects) == objects
    with pytest.raises(KeyError, match="not in the store"):
        store.get_many(["0" * 64])
