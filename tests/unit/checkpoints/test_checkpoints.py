"""Workspace checkpoints: taken with no link followed, each content stored once, restored
exactly, and hostile trees (links out, FIFOs, odd names, bad manifests) refused or left
out, never followed."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from refloop.checkpoints.manifest import (
    Entry,
    Manifest,
    ManifestError,
    parse_manifest,
    tree_bytes,
)
from refloop.checkpoints.objects import DirectoryObjectStore, content_key
from refloop.checkpoints.restore import (
    BadManifest,
    NotUnderRoots,
    make_directory_under,
    restore_checkpoint,
)
from refloop.checkpoints.snapshot import load_manifest, take_checkpoint


@contextmanager
def opened(directory: Path) -> Iterator[int]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def checkpoint(directory: Path, store: DirectoryObjectStore, previous: Manifest | None = None,
               **limits):
    with opened(directory) as fd:
        return take_checkpoint(fd, store, previous, **limits)


def restore(directory: Path, store: DirectoryObjectStore, manifest: Manifest):
    with opened(directory) as fd:
        return restore_checkpoint(fd, store, manifest)


def tree(directory: Path) -> dict[str, object]:
    """Everything under `directory` as a person would compare it (no link followed)."""
    found: dict[str, object] = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = "dir"
        else:
            found[rel] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return found


def stored_objects(store: DirectoryObjectStore) -> list[Path]:
    return [path for path in store.root.rglob("*") if path.is_file()]


def read_object(store: DirectoryObjectStore, key: str) -> bytes:
    return (store.root / key[:2] / key[2:]).read_bytes()


@pytest.fixture
def store(tmp_path: Path) -> DirectoryObjectStore:
    return DirectoryObjectStore(tmp_path / "objects")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "empty").mkdir()
    (ws / "README.md").write_text("hello\n")
    (ws / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    os.symlink("README.md", ws / "readme-link")
    return ws


def test_a_restore_puts_back_every_kept_path_and_removes_what_came_later(workspace, store):
    before = tree(workspace)
    first = checkpoint(workspace, store)

    (workspace / "README.md").write_text("changed\n")
    (workspace / "src" / "pkg" / "mod.py").unlink()
    (workspace / "src" / "pkg" / "new.py").write_text("later\n")
    (workspace / "empty").rmdir()
    (workspace / "run.sh").chmod(0o644)
    (workspace / "later-dir" / "deep").mkdir(parents=True)
    (workspace / "later-dir" / "deep" / "f").write_text("x")
    os.unlink(workspace / "readme-link")
    os.symlink("elsewhere", workspace / "readme-link")

    stats = restore(workspace, store, load_manifest(store, first.checkpoint_id))

    assert tree(workspace) == before
    assert stats.removed >= 2 and stats.written >= 3
    assert checkpoint(workspace, store).checkpoint_id == first.checkpoint_id


def test_each_content_is_stored_once_whatever_holds_it(tmp_path, store):
    for name in ("a", "b"):
        ws = tmp_path / name
        ws.mkdir()
        (ws / "same.txt").write_text("shared content\n")
        (ws / "copy.txt").write_text("shared content\n")
        (ws / f"own-{name}.txt").write_text(f"only in {name}\n")
        checkpoint(ws, store)
    contents = {content_key(b"shared content\n"), content_key(b"only in a\n"),
                content_key(b"only in b\n")}
    objects = {path.parent.name + path.name for path in stored_objects(store)}
    assert contents <= objects
    assert len(objects) == len(contents) + 2  # plus the two manifests (one tree each)


def test_a_checkpoint_after_one_edit_reads_and_stores_only_that_file(workspace, store):
    first = checkpoint(workspace, store)
    (workspace / "src" / "pkg" / "mod.py").write_text("x = 2\n")

    second = checkpoint(workspace, store, previous=first.manifest, racy_window_ns=0)

    assert second.stats.files_read == 1
    assert second.stats.new_objects == 1 and second.stats.new_bytes == len(b"x = 2\n")
    assert second.checkpoint_id != first.checkpoint_id
    # Besides the file: the tree objects of the three directories on its path, no more.
    changed = {d.key for d in second.state.dirs.values()} - {
        d.key for d in first.state.dirs.values()}
    assert len(changed) == 3
    assert second.stats.new_tree_bytes == sum(
        len(read_object(store, key)) for key in changed) < 1024
    assert load_manifest(store, second.checkpoint_id).by_path() == second.manifest.by_path()


def test_a_file_changed_within_the_clock_tick_is_read_again(workspace, store):
    first = checkpoint(workspace, store)  # files were written just now: inside the window
    second = checkpoint(workspace, store, previous=first.manifest)
    assert second.stats.files_read == first.stats.files_read


def test_a_stored_manifest_carries_no_host_hints_and_is_keyed_by_its_hash(workspace, store):
    snap = checkpoint(workspace, store)
    stored = (store.root / snap.checkpoint_id[:2] / snap.checkpoint_id[2:]).read_bytes()
    assert content_key(stored) == snap.checkpoint_id
    assert b"hints" not in stored and str(os.stat(workspace / "README.md").st_ino).encode() \
        not in stored
    loaded = load_manifest(store, snap.checkpoint_id)
    assert sorted(loaded.entries) == sorted(snap.manifest.entries) and loaded.state is None


def test_a_link_out_of_the_workspace_is_kept_as_a_link_never_read(tmp_path, workspace, store):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "also-secret").write_text("OUTSIDE DIR\n")
    os.symlink(secret, workspace / "leak")
    os.symlink(tmp_path / "outside", workspace / "leak-dir")

    snap = checkpoint(workspace, store)

    entries = snap.manifest.by_path()
    assert entries["leak"].kind == "link" and entries["leak"].target == str(secret)
    assert entries["leak-dir"].kind == "link"
    assert not any(path.startswith("leak-dir/") for path in entries)
    for obj in stored_objects(store):
        data = obj.read_bytes()
        assert b"TOP SECRET" not in data and b"OUTSIDE DIR" not in data


def test_a_fifo_is_left_out_and_never_blocks_the_walk(workspace, store):
    os.mkfifo(workspace / "pipe")
    done = threading.Event()
    result: list = []

    def run() -> None:
        result.append(checkpoint(workspace, store))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10), "the checkpoint blocked on a FIFO"
    snap = result[0]
    assert "pipe" not in snap.manifest.by_path()
    assert {(item.path, item.reason) for item in snap.manifest.left_out} >= {
        ("pipe", "special_file")}


def test_ignored_paths_large_files_and_odd_names_are_left_out_with_a_reason(workspace,
                                                                              store):
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    (workspace / "node_modules" / "x").mkdir(parents=True)
    (workspace / ".gitignore").write_text("*.log\nbuild/\n")
    (workspace / "app.log").write_text("noise")
    (workspace / "build").mkdir()
    (workspace / "build" / "out.bin").write_bytes(b"\0" * 10)
    (workspace / "src" / ".gitignore").write_text("generated.py\n")
    (workspace / "src" / "generated.py").write_text("g")
    (workspace / "generated.py").write_text("kept: the rule is src's only")
    (workspace / "big.bin").write_bytes(b"x" * 2048)
    os.close(os.open(os.path.join(os.fsencode(workspace), b"bad-\xff-name"),
                     os.O_CREAT | os.O_WRONLY))

    snap = checkpoint(workspace, store, max_file_bytes=1024)

    kept = snap.manifest.by_path()
    reasons = {item.path: item.reason for item in snap.manifest.left_out}
    assert reasons[".git"] == "ignored" and reasons["node_modules"] == "ignored"
    assert reasons["app.log"] == "ignored" and reasons["build"] == "ignored"
    assert reasons["src/generated.py"] == "ignored"
    assert reasons["big.bin"] == "too_large"
    assert reasons["bad-\\xff-name"] == "odd_name"
    assert "generated.py" in kept and ".gitignore" in kept
    assert snap.manifest.left_out_count == len(snap.manifest.left_out)


def test_a_restore_leaves_ignored_paths_alone(workspace, store):
    (workspace / ".git").mkdir()
    (workspace / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    snap = checkpoint(workspace, store)
    (workspace / ".git" / "HEAD").write_text("ref: refs/heads/later\n")
    restore(workspace, store, snap.manifest)
    assert (workspace / ".git" / "HEAD").read_text() == "ref: refs/heads/later\n"


def test_a_restore_never_writes_through_a_link(tmp_path, workspace, store):
    snap = checkpoint(workspace, store)
    outside = tmp_path / "outside"
    outside.mkdir()
    # Later, `src` became a link to a directory outside, and README.md a link to a file.
    import shutil
    shutil.rmtree(workspace / "src")
    os.symlink(outside, workspace / "src")
    (outside / "victim.txt").write_text("untouched\n")
    (workspace / "README.md").unlink()
    os.symlink(outside / "victim.txt", workspace / "README.md")

    restore(workspace, store, snap.manifest)

    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "untouched\n"
    assert (workspace / "src").is_dir() and not (workspace / "src").is_symlink()
    assert (workspace / "src" / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert (workspace / "README.md").read_text() == "hello\n"


@pytest.mark.parametrize("bad", ["../escape.txt", "/etc/passwd", "a/../../b", "a//b", "."])
def test_a_manifest_with_a_path_out_of_the_workspace_restores_nothing(tmp_path, store, bad):
    ws = tmp_path / "target"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")
    key = content_key(b"evil\n")
    store.put_many({key: b"evil\n"})
    manifest = Manifest(entries=[Entry(path=bad, kind="file", size=5, sha256=key)])
    with pytest.raises(BadManifest):
        restore(ws, store, manifest)
    assert tree(ws) == {"keep.txt": (b"kept\n", 0o644)}
    assert not (tmp_path / "escape.txt").exists()


def test_a_manifest_that_does_not_match_its_id_is_refused(workspace, store):
    snap = checkpoint(workspace, store)
    root = snap.state.dirs[""].tree
    store.put_many({"f" * 64: tree_bytes(root.rows[:1], [], 0)})
    with pytest.raises(ValueError, match="does not match"):
        load_manifest(store, "f" * 64)


@pytest.mark.parametrize("stored", [
    b"\xff\xfe not json", b"[]", b'{"version": 99}',
    b'{"version": 1, "entries": [["a", "file", "0644", 1, "k", ""]]}',
    b'{"version": 1, "entries": [["a", "device", 420, 1, "k", ""]]}',
    b'{"version": 1, "entries": [], "left_out_count": "many"}',
])
def test_stored_bytes_that_are_not_a_manifest_are_refused_clearly(stored):
    with pytest.raises(ManifestError):
        parse_manifest(stored)


def test_a_missing_object_fails_the_restore_before_anything_changes(workspace, store):
    snap = checkpoint(workspace, store)
    (workspace / "README.md").write_text("current\n")
    (workspace / "later.txt").write_text("a later file\n")
    for obj in stored_objects(store):
        if obj.parent.name + obj.name == content_key(b"hello\n"):
            obj.unlink()
    with pytest.raises(KeyError, match="not in the store"):
        restore(workspace, store, snap.manifest)
    assert (workspace / "README.md").read_text() == "current\n"
    assert (workspace / "later.txt").read_text() == "a later file\n"


def test_a_directory_to_restore_into_is_made_only_under_the_roots(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    make_directory_under(str(root / "a" / "b" / "ws"), [root])
    assert (root / "a" / "b" / "ws").is_dir()
    with pytest.raises(NotUnderRoots, match="none of this host's workspace roots"):
        make_directory_under(str(tmp_path / "elsewhere" / "ws"), [root])
    with pytest.raises(NotUnderRoots):
        make_directory_under(str(root / ".." / "escape"), [root])
    assert not (tmp_path / "escape").exists()


def test_a_directory_to_restore_into_is_never_made_through_a_link(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "link")
    with pytest.raises(NotUnderRoots, match="not a directory"):
        make_directory_under(str(root / "link" / "ws"), [root])
    assert list(outside.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker hands entries to an owner")
def test_a_root_workers_restore_leaves_files_to_the_workspaces_owner(workspace, store,
                                                                      tmp_path):
    """A root worker's commands run as the workspace's owner: what a restore writes must
    stay theirs to change."""
    snap = checkpoint(workspace, store)
    target = tmp_path / "owned"
    target.mkdir()
    os.chown(target, 65534, 65534)
    restore(target, store, snap.manifest)
    for path in [target / "README.md", target / "src", target / "src" / "pkg" / "mod.py",
                 target / "readme-link"]:
        assert os.lstat(path).st_uid == 65534, path
