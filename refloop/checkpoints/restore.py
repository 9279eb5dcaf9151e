"""Putting a directory back to a checkpoint: every kept path as it was, nothing kept that
came later.

The directory is read the way a checkpoint reads it (no link followed; ignored paths such
as `.git` and build output are left as they are), then brought to the manifest: paths it
does not hold are removed, changed files are written whole to a new name and renamed over
the old one (a rename replaces a link, it never writes through one), and every directory
on the way is opened from its parent with O_NOFOLLOW; a link or file where a directory must
be is removed first. Special files (FIFOs, sockets) are left where they are.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from refloop.checkpoints.manifest import Entry, Manifest
from refloop.checkpoints.objects import ObjectStore
from refloop.checkpoints.snapshot import DEFAULT_MAX_FILE_BYTES, WalkState, take_checkpoint
from refloop.tools.sandbox import take_directory_owner

# Content fetched from the store at once, at most (bytes, by the manifest's sizes).
FETCH_BATCH_BYTES = 64 * 1024 * 1024

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class BadManifest(ValueError):
    """A manifest path that is not a plain relative path: nothing is restored."""


class NotUnderRoots(ValueError):
    """A directory to restore into that this host may not make."""


@dataclass
class RestoreStats:
    written: int = 0
    removed: int = 0
    unchanged: int = 0
    seconds: float = 0.0


class _ForgetfulStore:
    """Reading the directory's current state stores nothing."""

    def missing(self, keys: Iterable[str]) -> set[str]:
        return set()

    def put_many(self, objects: dict[str, bytes]) -> None:
        pass

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        raise KeyError("nothing is stored while reading the current state")


def check_paths(manifest: Manifest) -> None:
    for entry in manifest.entries:
        parts = entry.path.split("/")
        if (not entry.path or entry.path.startswith("/") or "\x00" in entry.path
                or any(part in ("", ".", "..") for part in parts)):
            raise BadManifest(f"checkpoint path {entry.path!r} is not a plain relative path")


def _parents(path: str) -> Iterator[str]:
    parts = path.split("/")
    for depth in range(1, len(parts)):
        yield "/".join(parts[:depth])


class _Tree:
    """Directory descriptors under the root, opened (and made) without following links."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.fds: dict[str, int] = {"": root_fd}

    def close(self) -> None:
        for path, fd in self.fds.items():
            if path:
                os.close(fd)

    def directory(self, path: str, create: bool = True) -> int:
        if path in self.fds:
            return self.fds[path]
        parent_path, _, name = path.rpartition("/")
        parent = self.directory(parent_path, create)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o755, dir_fd=parent)
            take_directory_owner(parent, name)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except (NotADirectoryError, OSError) as err:
            if not create or isinstance(err, PermissionError):
                raise
            os.unlink(name, dir_fd=parent)  # a link or a file where a directory must be
            os.mkdir(name, 0o755, dir_fd=parent)
            take_directory_owner(parent, name)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        self.fds[path] = fd
        return fd

    def remove(self, path: str) -> None:
        parent_path, _, name = path.rpartition("/")
        parent = self.directory(parent_path, create=False)
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            self.forget(path)
            shutil.rmtree(name, dir_fd=parent)
        else:
            os.unlink(name, dir_fd=parent)

    def forget(self, path: str) -> None:
        for held in [p for p in self.fds if p == path or p.startswith(f"{path}/")]:
            os.close(self.fds.pop(held))

    def place(self, entry: Entry, data: bytes | None) -> None:
        """Write a file or link whole under a new name, then rename it into place."""
        parent_path, _, name = entry.path.rpartition("/")
        parent = self.directory(parent_path)
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                self.remove(entry.path)
        except FileNotFoundError:
            pass
        partial = f".refloop-restore-{os.getpid()}-{name}"[:255]
        if entry.kind == "link":
            os.symlink(entry.target, partial, dir_fd=parent)
        else:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=parent)
            try:
                view = memoryview(data or b"")
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, entry.mode & 0o777)
            finally:
                os.close(fd)
        take_directory_owner(parent, partial)  # a root worker's commands may run as its owner
        os.replace(partial, name, src_dir_fd=parent, dst_dir_fd=parent)


def _same(current: Entry | None, wanted: Entry) -> bool:
    if current is None or current.kind != wanted.kind:
        return False
    if wanted.kind == "file":
        return current.sha256 == wanted.sha256 and current.mode == wanted.mode
    if wanted.kind == "link":
        return current.target == wanted.target
    return True


def _fetch_batches(entries: list[Entry]) -> Iterator[list[Entry]]:
    batch: list[Entry] = []
    size = 0
    for entry in entries:
        batch.append(entry)
        size += entry.size
        if size >= FETCH_BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def make_directory_under(path: str, roots: list[Path]) -> None:
    """Make the directory `path` (and its missing parents) under one of `roots`, each
    component made and opened from its parent with no link followed. Refused: a path under
    no root, or one through a link."""
    target = Path(os.path.normpath(os.path.abspath(path)))
    root = next((r for r in roots if target == r or r in target.parents), None)
    if root is None:
        raise NotUnderRoots(f"{target} is under none of this host's workspace roots "
                            f"({', '.join(map(str, roots)) or 'none'})")
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in target.relative_to(root).parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
                take_directory_owner(fd, name)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                raise NotUnderRoots(f"{target}: '{name}' on the way is not a directory "
                                    f"(a link or a file): {err.strerror}") from None
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def restore_checkpoint(root_fd: int, store: ObjectStore, manifest: Manifest,
                       previous: WalkState | None = None) -> RestoreStats:
    """Bring the directory open at `root_fd` to `manifest`. `previous`: this host's last
    walk of the directory, so that reading its current state reads only what changed."""
    check_paths(manifest)
    absent = store.missing(manifest.content_keys())
    if absent:  # found out before anything changes, not half-way
        raise KeyError(f"{len(absent)} checkpoint objects are not in the store "
                       f"(first: {sorted(absent)[0]})")
    started = time.perf_counter()
    stats = RestoreStats()
    current = take_checkpoint(root_fd, _ForgetfulStore(), previous,
                              max_file_bytes=DEFAULT_MAX_FILE_BYTES).manifest.by_path()
    wanted = manifest.by_path()
    wanted_dirs = {parent for path in wanted for parent in _parents(path)}
    wanted_dirs.update(path for path, entry in wanted.items() if entry.kind == "dir")
    tree = _Tree(root_fd)
    try:
        # Later paths first, deepest first, so a directory is empty when its turn comes.
        for path in sorted(current, key=lambda p: p.count("/"), reverse=True):
            entry = wanted.get(path)
            if entry is None and path not in wanted_dirs:
                tree.remove(path)
                stats.removed += 1
        to_write = []
        for path, entry in sorted(wanted.items()):
            if _same(current.get(path), entry):
                stats.unchanged += 1
            elif entry.kind == "dir":
                tree.directory(path)
            else:
                to_write.append(entry)
        for batch in _fetch_batches(to_write):
            contents = store.get_many({e.sha256 for e in batch if e.kind == "file"})
            for entry in batch:
                tree.place(entry, contents.get(entry.sha256))
                stats.written += 1
        _remove_emptied_directories(tree, current, wanted_dirs)
    finally:
        tree.close()
    stats.seconds = time.perf_counter() - started
    return stats


def _remove_emptied_directories(tree: _Tree, current: dict[str, Entry],
                                wanted_dirs: set[str]) -> None:
    """Directories that only later paths needed, when nothing else is left in them."""
    held = {parent for path in current for parent in _parents(path)}
    for path in sorted(held - wanted_dirs, key=lambda p: p.count("/"), reverse=True):
        parent_path, _, name = path.rpartition("/")
        tree.forget(path)
        with contextlib.suppress(OSError):  # it holds ignored or special files: left as is
            os.rmdir(name, dir_fd=tree.directory(parent_path, create=False))


class NotFresh(ValueError):
    """A fork's workspace already holds files of its own."""


def refuse_unless_fresh(root_fd: int, manifest: Manifest) -> None:
    """A fork's new workspace must be new or empty; a retried restore finds only what the
    checkpoint itself holds, which is allowed."""
    mine = {entry.path.split("/", 1)[0] for entry in manifest.entries}
    foreign = sorted(name for name in os.listdir(root_fd) if name not in mine)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise NotFresh(f"the workspace is not empty ({shown}): a fork goes to a new or "
                       "empty directory")
