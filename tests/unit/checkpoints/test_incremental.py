"""A checkpoint that starts from this host's previous walk (stat hints, listings, tree
objects) sees every change a full walk would see: edits that keep size and mtime, names
added, removed or renamed in a directory, a changed `.gitignore`, a directory swapped for a
link out of the workspace, a file swapped for a FIFO. And a stored tree that is hostile
(deep, or naming one directory many times) is refused, not expanded."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from refloop.checkpoints import snapshot
from refloop.checkpoints.manifest import Entry, ManifestError, tree_bytes
from refloop.checkpoints.objects import DirectoryObjectStore, content_key
from refloop.checkpoints.snapshot import load_manifest, take_checkpoint


def take(directory: Path, store, previous=None, **options):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return take_checkpoint(fd, store, previous, **options)
    finally:
        os.close(fd)


def full_and_incremental(directory: Path, store, previous):
    """The same tree checkpointed from nothing and from the previous walk (trusting
    every hint older than that walk)."""
    incremental = take(directory, store, previous, racy_window_ns=0)
    full = take(directory, store)
    return full, incremental


@pytest.fixture
def store(tmp_path: Path) -> DirectoryObjectStore:
    return DirectoryObjectStore(tmp_path / "objects")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    for sub in ("a", "a/b", "c"):
        (ws / sub).mkdir(parents=True)
        for i in range(3):
            (ws / sub / f"f{i}.txt").write_text(f"{sub} {i}\n")
    return ws


def test_an_unchanged_tree_reads_nothing_and_writes_no_tree(workspace, store):
    first = take(workspace, store)
    again = take(workspace, store, first.state, racy_window_ns=0)
    assert again.checkpoint_id == first.checkpoint_id
    assert again.stats.files_read == 0 and again.stats.new_tree_bytes == 0
    assert again.stats.files == first.stats.files == 9


def test_an_edit_that_keeps_size_and_mtime_is_seen(workspace, store):
    path = workspace / "a" / "b" / "f1.txt"
    first = take(workspace, store)
    before = path.stat()
    path.write_text("a/b X\n")  # same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime
    assert path.stat().st_size == before.st_size
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    full, incremental = full_and_incremental(workspace, store, first.state)
    assert incremental.checkpoint_id == full.checkpoint_id != first.checkpoint_id
    assert incremental.manifest.by_path()["a/b/f1.txt"].sha256 == content_key(b"a/b X\n")


def test_within_the_racy_window_an_unchanged_stat_is_not_trusted(workspace, store):
    first = take(workspace, store)
    again = take(workspace, store, first.state)  # all written within 2 s of `first`
    assert again.stats.files_read == 9


@pytest.mark.parametrize("change", ["add", "remove", "rename", "mkdir", "rmdir", "chmod"])
def test_names_added_removed_or_renamed_are_seen(workspace, store, change):
    first = take(workspace, store)
    target = workspace / "a" / "b"
    if change == "add":
        (target / "new.txt").write_text("new\n")
    elif change == "remove":
        (target / "f0.txt").unlink()
    elif change == "rename":
        (target / "f0.txt").rename(target / "g0.txt")
    elif change == "mkdir":
        (target / "empty").mkdir()
    elif change == "rmdir":
        shutil.rmtree(workspace / "c")
    else:
        (target / "f2.txt").chmod(0o700)
    full, incremental = full_and_incremental(workspace, store, first.state)
    assert incremental.checkpoint_id == full.checkpoint_id != first.checkpoint_id
    assert sorted(incremental.manifest.entries) == sorted(full.manifest.entries)


def test_a_changed_gitignore_reclassifies_the_names_below_it(workspace, store):
    (workspace / "a" / ".gitignore").write_text("*.log\n")
    (workspace / "a" / "b" / "run.log").write_text("log\n")
    first = take(workspace, store)
    assert "a/b/run.log" not in first.manifest.by_path()
    (workspace / "a" / ".gitignore").write_text("f1.txt\n")  # edited in place
    full, incremental = full_and_incremental(workspace, store, first.state)
    kept = incremental.manifest.by_path()
    assert "a/b/run.log" in kept and "a/b/f1.txt" not in kept and "a/f1.txt" not in kept
    assert incremental.checkpoint_id == full.checkpoint_id


def test_a_directory_swapped_for_a_link_out_is_kept_as_a_link(tmp_path, workspace, store):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    first = take(workspace, store)
    shutil.rmtree(workspace / "a")
    os.symlink(outside, workspace / "a")
    full, incremental = full_and_incremental(workspace, store, first.state)
    kept = incremental.manifest.by_path()
    assert kept["a"].kind == "link" and not any(p.startswith("a/") for p in kept)
    assert incremental.checkpoint_id == full.checkpoint_id
    for obj in store.root.rglob("*"):
        assert not obj.is_file() or b"TOP SECRET" not in obj.read_bytes()


def test_a_file_swapped_for_a_fifo_is_left_out_without_blocking(workspace, store):
    first = take(workspace, store)
    (workspace / "c" / "f0.txt").unlink()
    os.mkfifo(workspace / "c" / "f0.txt")
    result: list = []
    done = threading.Event()

    def run() -> None:
        result.append(full_and_incremental(workspace, store, first.state))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10), "the checkpoint blocked on a FIFO"
    full, incremental = result[0]
    assert "c/f0.txt" not in incremental.manifest.by_path()
    assert ("c/f0.txt", "special_file") in {(i.path, i.reason)
                                            for i in incremental.manifest.left_out}
    assert incremental.checkpoint_id == full.checkpoint_id


def test_a_missing_subtree_fails_the_load(workspace, store):
    snap = take(workspace, store)
    sub = snap.state.dirs["a/b"].key
    (store.root / sub[:2] / sub[2:]).unlink()
    with pytest.raises(KeyError, match="not in the store"):
        load_manifest(store, snap.checkpoint_id)


def test_a_tree_naming_one_directory_many_times_is_refused_not_expanded(store,
                                                                        monkeypatch):
    monkeypatch.setattr(snapshot, "MAX_MANIFEST_ENTRIES", 10_000)
    leaf = tree_bytes([Entry(f"f{i}", "file", 0o644, 0, content_key(b"")) for i in range(50)],
                      [], 0)
    key = content_key(leaf)
    store.put_many({key: leaf})
    for _level in range(6):  # 50 ** 7 paths if expanded
        body = tree_bytes([Entry(f"d{i}", "dir", 0o755, 0, key) for i in range(50)], [], 0)
        key = content_key(body)
        store.put_many({key: body})
    with pytest.raises(ManifestError, match="more than 10,000 paths"):
        load_manifest(store, key)


@pytest.mark.parametrize("name", ["..", "a/b", ""])
def test_a_tree_row_that_is_not_a_plain_name_is_refused(store, name):
    body = tree_bytes([Entry(name, "file", 0o644, 1, content_key(b"x"))], [], 0)
    store.put_many({content_key(body): body})
    with pytest.raises(ManifestError, match="not a plain name"):
        load_manifest(store, content_key(body))


def test_a_checkpoint_stored_as_one_flat_manifest_still_loads(store):
    """Checkpoints taken before tree objects (version 1) stay restorable."""
    key = content_key(b"x = 1\n")
    body = (b'{"version":1,"entries":[["pkg/mod.py","file",420,6,"' + key.encode()
            + b'",""]],"left_out":[[".git","ignored",0]],"left_out_count":1}')
    store.put_many({key: b"x = 1\n", content_key(body): body})
    manifest = load_manifest(store, content_key(body))
    assert manifest.entries == [Entry("pkg/mod.py", "file", 0o644, 6, key)]
    assert manifest.left_out_count == 1
