"""Taking a checkpoint: walk the workspace with no link followed, hash what changed, store
each new content once, then the tree objects of the directories that changed.

Every directory is opened from its parent's descriptor with O_NOFOLLOW and O_DIRECTORY,
every file the same way, non-blocking, and read only if it is still a regular file: a
link, a FIFO or a swap during the walk is never followed, read or stored.

The cost of a checkpoint after a small change is one lstat per kept file and one open per
directory, nothing more. The host keeps its last walk of each workspace (`WalkState`): per
directory its stat, its classified listing and its tree object; per file its stat hint
(size, inode, mtime, ctime) and row. A file whose hint is unchanged is not read again; a
directory whose own stat is unchanged has the same names (adding, removing or renaming an
entry moves its mtime and ctime), so it is not listed, sorted or matched against ignore
rules again; a directory none of whose rows changed keeps its tree object as it was. What
was changed within `RACY_WINDOW_NS` of the previous walk (by mtime or ctime: ctime cannot
be set back by a user) is not trusted, because a second change within one timestamp tick
leaves the same stat: it is read or listed again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from pathspec import GitIgnoreSpec

from refloop.checkpoints.ignore import IgnoreRules, parse_gitignore
from refloop.checkpoints.manifest import (
    MAX_LEFT_OUT_LISTED,
    MAX_MANIFEST_ENTRIES,
    MAX_TREE_DEPTH,
    Entry,
    LeftOut,
    Manifest,
    ManifestError,
    StatHint,
    Tree,
    parse_manifest,
    parse_tree,
    tree_bytes,
)
from refloop.checkpoints.objects import ObjectStore, content_key

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
# Content held in memory before it is written to the store.
UPLOAD_BATCH_BYTES = 32 * 1024 * 1024
# A file or directory changed this close to the previous checkpoint may have changed
# again within the same timestamp tick (2 s on the coarsest filesystems), so its stat is
# not trusted.
RACY_WINDOW_NS = 2_000_000_000
READ_CHUNK = 1024 * 1024
MAX_GITIGNORE_READ = 64 * 1024

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# How a listed name is handled by the next walk that reuses the listing.
_STAT = 0  # lstat it (a file, link, special file, or a left-out file)
_SUBDIR = 1  # open and walk it
_FIXED = 2  # an ignored directory or an odd name: the same while the listing is


class CheckpointTooSlow(TimeoutError):
    """The walk passed its deadline: nothing is kept of it but contents already stored
    (content-addressed, so the next checkpoint reuses them)."""


@dataclass
class SnapshotStats:
    files: int = 0
    files_read: int = 0
    new_objects: int = 0  # file contents this checkpoint added to the store
    new_bytes: int = 0
    new_tree_bytes: int = 0  # tree objects this checkpoint added to the store
    seconds: float = 0.0


@dataclass(eq=False)
class _Dir:
    """One directory as the last walk left it (host-local, never stored)."""

    ident: tuple[int, int, int, int]  # dev, inode, mtime, ctime of the directory
    mode: int
    rules_key: tuple  # the ignore rules its children were classified under
    has_gitignore: bool  # a `.gitignore` is listed
    gitignore: tuple[StatHint, str, GitIgnoreSpec | None] | None  # stat, digest, spec
    names: tuple[tuple[str, int], ...]  # every child, sorted, with how to revisit it
    stat_names: tuple[str, ...]  # ... those to lstat
    subdir_names: tuple[str, ...]  # ... and those to walk
    hints: dict[str, StatHint]  # the stat of each non-directory child when last seen
    rows: dict[str, Entry | LeftOut]  # ... and its row
    tree: Tree
    key: str  # the tree object's key
    files: int  # kept files (not below subdirectories)


@dataclass(eq=False)
class WalkState:
    """A host's last walk of one workspace: what lets the next checkpoint skip the
    unchanged."""

    taken_ns: int
    dirs: dict[str, _Dir]  # by path ("" the root)

    @property
    def root_key(self) -> str:
        return self.dirs[""].key

    @property
    def left_out_count(self) -> int:
        return sum(d.tree.left_out_count for d in self.dirs.values())


@dataclass(eq=False)
class Snapshot:
    checkpoint_id: str
    state: WalkState
    stats: SnapshotStats = field(default_factory=SnapshotStats)

    @cached_property
    def manifest(self) -> Manifest:
        """The flat view (every kept path), built on first use: a checkpoint after an
        edit needs none of it."""
        trees = {d.key: d.tree for d in self.state.dirs.values()}
        manifest = flatten(trees, self.checkpoint_id)
        manifest.state = self.state
        return manifest


_NO_TREE = Tree((), (), 0)


@lru_cache(maxsize=64)  # compiled rules by content (at most 64 KiB each)
def _gitignore_spec(data: bytes) -> GitIgnoreSpec | None:
    return parse_gitignore(data)


class _Walk:
    def __init__(self, store: ObjectStore, previous: WalkState | None,
                 max_file_bytes: int, racy_window_ns: int,
                 deadline: float | None = None) -> None:
        self.store = store
        self.deadline = deadline
        self.max_file_bytes = max_file_bytes
        self.old = previous.dirs if previous is not None else {}
        self.trust_before = (previous.taken_ns - racy_window_ns) if previous else 0
        self.dirs: dict[str, _Dir] = {}
        self.pending: dict[str, bytes] = {}
        self.pending_bytes = 0
        self.trees: dict[str, bytes] = {}  # tree objects to store, deepest first
        self.stats = SnapshotStats()

    def _in_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise CheckpointTooSlow("the checkpoint was not done in the time it had")

    def _trusted(self, mtime_ns: int, ctime_ns: int) -> bool:
        return (mtime_ns if mtime_ns > ctime_ns else ctime_ns) < self.trust_before

    # One directory

    def directory(self, fd: int, prefix: str, info: os.stat_result,
                  rules: IgnoreRules) -> _Dir:
        self._in_time()
        ident = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
        old = self.old.get(prefix)
        listing: dict[str, os.DirEntry] | None = None
        if (old is None or old.ident != ident
                or not self._trusted(info.st_mtime_ns, info.st_ctime_ns)):
            listing = self._list(fd)
            has_gitignore = ".gitignore" in listing
        else:
            has_gitignore = old.has_gitignore
        gitignore = self._gitignore(fd, old) if has_gitignore else None
        if gitignore is not None:
            rules = rules.below(prefix, gitignore[2], gitignore[1])
        rules_changed = old is not None and old.rules_key != rules.key
        if listing is None and not rules_changed:
            return self._revisit(fd, prefix, old, rules, gitignore)  # type: ignore[arg-type]
        if listing is None:
            listing = self._list(fd)  # the rules changed: classify every name again
        names = tuple(self._classify(prefix, name, entry, rules)
                      for name, entry in sorted(listing.items()))
        stat_names = tuple(name for name, how in names if how == _STAT)
        subdir_names = tuple(name for name, how in names if how == _SUBDIR)
        old_hints = old.hints if old is not None and not rules_changed else {}
        old_rows = old.rows if old is not None else {}
        hints: dict[str, StatHint] = {}
        rows: dict[str, Entry | LeftOut] = {}
        for name, how in names:
            entry = listing[name]
            if how == _FIXED:
                rows[name] = self._fixed(name)
                continue
            path = f"{prefix}/{name}" if prefix else name
            row: Entry | LeftOut | None
            if how == _SUBDIR:
                row = self.subdirectory(fd, name, path, entry, rules)
                if row is not None:
                    rows[name] = row
                continue
            try:
                now = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed during the walk
            hint = (now.st_size, now.st_ino, now.st_mtime_ns, now.st_ctime_ns)
            if old_hints.get(name) == hint and self._trusted(hint[2], hint[3]):
                row = old_rows[name]
            else:
                row = self.child(fd, name, path, now, rules)
            if row is not None:
                rows[name] = row
                if row[1] != "dir":  # a directory is walked each time
                    hints[name] = hint
        return self._finish(prefix, _Dir(
            ident=ident, mode=stat.S_IMODE(info.st_mode) & 0o777, rules_key=rules.key,
            has_gitignore=has_gitignore, gitignore=gitignore, names=names,
            stat_names=stat_names, subdir_names=subdir_names, hints=hints, rows=rows,
            tree=_NO_TREE, key="", files=0), old)

    def _revisit(self, fd: int, prefix: str, old: _Dir, rules: IgnoreRules,
                 gitignore: tuple[StatHint, str, GitIgnoreSpec | None] | None) -> _Dir:
        """A directory with the same names under the same rules as last time: only its
        children's stats and its subdirectories can differ. The fast path of a
        checkpoint after a small change: one lstat per name, nothing built when nothing
        changed."""
        trust_before = self.trust_before
        old_hints, old_rows = old.hints, old.rows
        lstat = os.lstat
        changes: dict[str, tuple[StatHint | None, Entry | LeftOut | None]] = {}
        known = old_hints.get
        for name in old.stat_names:
            try:
                now = lstat(name, dir_fd=fd)
            except FileNotFoundError:
                changes[name] = (None, None)  # removed during the walk
                continue
            hint = (now.st_size, now.st_ino, now.st_mtime_ns, now.st_ctime_ns)
            if hint[2] < trust_before and hint[3] < trust_before and known(name) == hint:
                continue
            row = self.child(fd, name, f"{prefix}/{name}" if prefix else name, now, rules)
            if row is None or row[1] == "dir":
                changes[name] = (None, row)
            elif row != old_rows.get(name) or hint != known(name):
                changes[name] = (hint, row)
        for name in old.subdir_names:
            row = self.subdirectory(fd, name, f"{prefix}/{name}" if prefix else name, None,
                                    rules)
            if row != old_rows.get(name):
                changes[name] = (None, row)
        if not changes and gitignore is old.gitignore:
            self.dirs[prefix] = old
            self.stats.files += old.files
            return old
        hints, rows = dict(old_hints), dict(old_rows)
        for name, (hint, row) in changes.items():
            if hint is None:
                hints.pop(name, None)
            else:
                hints[name] = hint
            if row is None:
                rows.pop(name, None)
            else:
                rows[name] = row
        return self._finish(prefix, dataclasses.replace(
            old, gitignore=gitignore, hints=hints, rows=rows), old)

    def _finish(self, prefix: str, state: _Dir, old: _Dir | None) -> _Dir:
        """The directory's tree object from its rows: the previous one when they are the
        same, else a new object to store."""
        kept: list[Entry] = []
        left: list[LeftOut] = []
        rows = state.rows
        for name, _how in state.names:
            row = rows.get(name)
            if row is None:
                continue
            if type(row) is Entry:
                kept.append(row)
            else:
                left.append(row)  # type: ignore[arg-type]
        tree = Tree(tuple(kept), tuple(left[:MAX_LEFT_OUT_LISTED]), len(left))
        if old is not None and old.tree == tree:
            state.tree, state.key = old.tree, old.key
        else:
            body = tree_bytes(tree.rows, left, len(left))
            state.tree, state.key = tree, content_key(body)
            self.trees[state.key] = body
        state.files = sum(1 for row in kept if row.kind == "file")
        self.stats.files += state.files
        self.dirs[prefix] = state
        return state

    def _list(self, fd: int) -> dict[str, os.DirEntry]:
        with os.scandir(fd) as listing:
            return {entry.name: entry for entry in listing}

    def _classify(self, prefix: str, name: str, entry: os.DirEntry,
                  rules: IgnoreRules) -> tuple[str, int]:
        if not _plain_name(name):
            return name, _FIXED
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            return name, _STAT
        if not is_dir:
            return name, _STAT
        path = f"{prefix}/{name}" if prefix else name
        return name, (_FIXED if rules.ignores(path, name, True) else _SUBDIR)

    def _fixed(self, name: str) -> LeftOut:
        if not _plain_name(name):
            return LeftOut(_shown(name), "odd_name")
        return LeftOut(name, "ignored", 0)

    def subdirectory(self, dir_fd: int, name: str, path: str, seen: os.DirEntry | None,
                     rules: IgnoreRules) -> Entry | LeftOut | None:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None  # removed during the walk
        except OSError:
            return LeftOut(name, "unreadable")  # swapped for a link, or no permission
        try:
            info = os.fstat(fd)
            if seen is not None:
                was = seen.stat(follow_symlinks=False)
                if (info.st_dev, info.st_ino) != (was.st_dev, was.st_ino):
                    return LeftOut(name, "unreadable")  # swapped during the walk
            state = self.directory(fd, path, info, rules)
        finally:
            os.close(fd)
        return Entry(name, "dir", state.mode, 0, state.key)

    def child(self, dir_fd: int, name: str, path: str, info: os.stat_result,
              rules: IgnoreRules) -> Entry | LeftOut | None:
        """A non-directory name (or one that became a directory since it was listed)."""
        mode = info.st_mode
        if not _plain_name(name):
            return LeftOut(_shown(name), "odd_name")
        is_dir = stat.S_ISDIR(mode)
        if rules.ignores(path, name, is_dir):
            return LeftOut(name, "ignored", 0 if is_dir else info.st_size)
        if is_dir:
            return self.subdirectory(dir_fd, name, path, None, rules)
        if stat.S_ISLNK(mode):
            try:
                target = os.readlink(name, dir_fd=dir_fd)
            except OSError:
                return None
            return Entry(name, "link", 0o777, 0, "", target)
        if not stat.S_ISREG(mode):
            return LeftOut(name, "special_file")
        if info.st_size > self.max_file_bytes:
            return LeftOut(name, "too_large", info.st_size)
        self._in_time()
        data = self._read(dir_fd, name, info)
        if data is None:
            return LeftOut(name, "unreadable")
        key = content_key(data)
        if key not in self.pending:
            self.pending[key] = data
            self.pending_bytes += len(data)
            if self.pending_bytes >= UPLOAD_BATCH_BYTES:
                self.flush()
        return Entry(name, "file", stat.S_IMODE(mode) & 0o777, len(data), key)

    def _read(self, dir_fd: int, name: str, seen: os.stat_result) -> bytes | None:
        """The file's bytes, if it is still the regular file the walk saw."""
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or now.st_ino != seen.st_ino:
                return None
            self.stats.files_read += 1
            chunks = []
            remaining = self.max_file_bytes + 1
            while remaining > 0:
                chunk = os.read(fd, min(READ_CHUNK, remaining))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
            return data if len(data) <= self.max_file_bytes else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def _gitignore(self, dir_fd: int,
                   old: _Dir | None) -> tuple[StatHint, str, GitIgnoreSpec | None] | None:
        """This directory's `.gitignore` (its stat, digest and rules), read again only
        when its stat changed."""
        try:
            now = os.stat(".gitignore", dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(now.st_mode):
            return None
        hint = (now.st_size, now.st_ino, now.st_mtime_ns, now.st_ctime_ns)
        if (old is not None and old.gitignore is not None and old.gitignore[0] == hint
                and self._trusted(now.st_mtime_ns, now.st_ctime_ns)):
            return old.gitignore
        try:
            fd = os.open(".gitignore", _FILE_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.read(fd, MAX_GITIGNORE_READ)
        finally:
            os.close(fd)
        return hint, hashlib.sha256(data).hexdigest(), _gitignore_spec(data)

    def flush(self) -> None:
        """Store the pending file contents (those the store lacks)."""
        if not self.pending:
            return
        new = self.store.missing(self.pending)
        self.store.put_many({key: self.pending[key] for key in new})
        self._count(new, {})
        self.pending.clear()
        self.pending_bytes = 0

    def finish(self, root_key: str) -> None:
        """Store what is left: contents, then trees, the root last, with one question to
        the store about which it lacks (a stored root always has all it names)."""
        trees = self.trees
        new = self.store.missing([*self.pending, *trees])
        objects = {key: self.pending[key] for key in self.pending if key in new}
        objects.update((key, trees[key]) for key in trees if key in new and key != root_key)
        if root_key in new:
            objects[root_key] = trees[root_key]  # last
        self.store.put_many(objects)
        self._count(new, {key: body for key, body in trees.items() if key in new})
        self.pending.clear()

    def _count(self, new: Iterable[str], trees: dict[str, bytes]) -> None:
        for key in new:
            if key in self.pending:
                self.stats.new_objects += 1
                self.stats.new_bytes += len(self.pending[key])
        for body in trees.values():
            self.stats.new_tree_bytes += len(body)


def _plain_name(name: str) -> bool:
    """A name that round-trips through UTF-8 (the manifest is JSON)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(path: str) -> str:
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def take_checkpoint(root_fd: int, store: ObjectStore,
                    previous: Manifest | WalkState | None = None,
                    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                    racy_window_ns: int = RACY_WINDOW_NS,
                    deadline: float | None = None) -> Snapshot:
    """Checkpoint the directory open at `root_fd` (the caller opened and pinned it).
    `previous`: this host's last checkpoint of the same directory, whose stat hints let
    this one skip what did not change. `deadline` (`time.monotonic()`): past it, the walk
    stops with CheckpointTooSlow (checked before each directory and each file read)."""
    started = time.perf_counter()
    taken_ns = time.time_ns()
    if isinstance(previous, Manifest):
        previous = previous.state
    walk = _Walk(store, previous, max_file_bytes, racy_window_ns, deadline)
    root = walk.directory(root_fd, "", os.fstat(root_fd), IgnoreRules())
    walk.finish(root.key)
    walk.stats.seconds = time.perf_counter() - started
    return Snapshot(checkpoint_id=root.key, state=WalkState(taken_ns, walk.dirs),
                    stats=walk.stats)


def flatten(trees: dict[str, Tree], root_key: str) -> Manifest:
    """Every kept path of the tree under `root_key`, bounded (a stored tree may be
    hostile: deep, or naming one directory many times)."""
    entries: list[Entry] = []
    left_out: list[LeftOut] = []
    count = 0
    stack: list[tuple[str, str, int]] = [(root_key, "", 0)]
    while stack:
        key, prefix, depth = stack.pop()
        tree = trees[key]
        if depth > MAX_TREE_DEPTH:
            raise ManifestError(f"a checkpoint deeper than {MAX_TREE_DEPTH} directories")
        base = f"{prefix}/" if prefix else ""
        count += tree.left_out_count
        for item in tree.left_out:
            if len(left_out) < MAX_LEFT_OUT_LISTED:
                left_out.append(LeftOut(base + item.path, item.reason, item.size))
        below = []
        for row in tree.rows:
            path = base + row.path
            if row.kind == "dir":
                if not trees[row.sha256].rows:
                    entries.append(Entry(path, "dir", row.mode))
                below.append((row.sha256, path, depth + 1))
            else:
                entries.append(row._replace(path=path))
        if len(entries) > MAX_MANIFEST_ENTRIES:
            raise ManifestError(f"a checkpoint of more than {MAX_MANIFEST_ENTRIES:,} paths")
        stack.extend(reversed(below))
    return Manifest(entries=entries, left_out=left_out, left_out_count=count)


def _verified(store: ObjectStore, keys: set[str]) -> dict[str, bytes]:
    found = store.get_many(keys)
    for key, data in found.items():
        if content_key(data) != key:
            raise ValueError(f"checkpoint {key} does not match its manifest")
    return found


def load_manifest(store: ObjectStore, checkpoint_id: str) -> Manifest:
    """A stored checkpoint's flat manifest: its root tree, then each level's trees in one
    read from the store (a version 1 manifest is one object)."""
    root = parse_manifest(_verified(store, {checkpoint_id})[checkpoint_id])
    if isinstance(root, Manifest):
        return root
    trees = {checkpoint_id: root}
    level = {row.sha256 for row in trees[checkpoint_id].rows if row.kind == "dir"}
    depth = 0
    while level:
        depth += 1
        if depth > MAX_TREE_DEPTH:
            raise ManifestError(f"a checkpoint deeper than {MAX_TREE_DEPTH} directories")
        found = _verified(store, level - trees.keys())
        for key, body in found.items():
            trees[key] = parse_tree(body)
        level = {row.sha256 for key in found for row in trees[key].rows
                 if row.kind == "dir"} - trees.keys()
    return flatten(trees, checkpoint_id)
