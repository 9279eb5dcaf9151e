"""What a workspace checkpoint records: one entry per kept path, and what was left out.

A checkpoint is stored as a tree of objects, one per directory, as git stores a commit's
tree: each holds its directory's rows (name, kind, mode, size, content key; a
subdirectory's key is its own tree object's) as canonical JSON, stored under its sha256.
The checkpoint id is the root directory's key. So a one-file edit stores the file and the
few small tree objects on its path, not a listing of the whole workspace, and two
checkpoints of the same tree (or two identical directories) are the same objects. Content
is stored once per hash however many checkpoints or tasks hold it.

`Manifest` is the flat view a restore works from (every kept path), built from the trees.
Version 1 manifests (one flat JSON listing) are still read. The stat hints that let the
next checkpoint skip unchanged files belong to the host that took it and are never stored.
Rows are tuples, not models: a checkpoint of 10,000 files builds and compares them all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

MANIFEST_VERSION = 1  # one flat listing (read only)
TREE_VERSION = 2  # one object per directory
MAX_LEFT_OUT_LISTED = 1_000
KINDS = ("file", "link", "dir")
LEFT_OUT_REASONS = ("ignored", "too_large", "special_file", "unreadable", "odd_name")
# A stored tree is read bounded: its objects come from any host that shares the store.
MAX_TREE_DEPTH = 256
MAX_MANIFEST_ENTRIES = 2_000_000


class Entry(NamedTuple):
    """A kept path (POSIX, relative to the workspace root). A directory is recorded only
    when it holds nothing kept, so empty directories come back too."""

    path: str
    kind: str  # one of KINDS
    mode: int = 0o644  # permission bits only: set-id and sticky bits are never restored
    size: int = 0
    sha256: str = ""  # a file's content key (a directory's tree key in a tree row)
    target: str = ""  # a link's target, kept as text: a checkpoint never follows a link


class LeftOut(NamedTuple):
    """A path a checkpoint did not keep, and why (a person restoring should know)."""

    path: str
    reason: str  # one of LEFT_OUT_REASONS
    size: int = 0


# (size, inode, mtime_ns, ctime_ns) of a file when it was read: a later checkpoint on the
# same host skips reading a file whose stat is unchanged.
StatHint = tuple[int, int, int, int]


class ManifestError(ValueError):
    """Stored bytes that are not a manifest of this version."""


@dataclass
class Manifest:
    entries: list[Entry] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)  # the first MAX_LEFT_OUT_LISTED
    left_out_count: int = 0
    # Host-local, never stored: the walk this manifest came from (its directories' stat
    # hints and tree objects), so that the next checkpoint on this host reads only what
    # changed. A manifest loaded from the store has none.
    state: Any = None

    def content_keys(self) -> set[str]:
        return {entry.sha256 for entry in self.entries if entry.kind == "file"}

    def by_path(self) -> dict[str, Entry]:
        return {entry.path: entry for entry in self.entries}

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.entries if entry.kind == "file")


class Tree(NamedTuple):
    """One directory's stored object: its rows (an Entry whose path is a name) sorted by
    name, and what it left out."""

    rows: tuple[Entry, ...]
    left_out: tuple[LeftOut, ...]
    left_out_count: int


def tree_bytes(rows: list[Entry] | tuple[Entry, ...], left_out: list[LeftOut],
               left_out_count: int) -> bytes:
    """The canonical bytes of a directory's tree: what is stored, and what its key is the
    hash of. Rows and left-out names come sorted by name (the walk lists in that order)."""
    return json.dumps({"version": TREE_VERSION, "rows": rows,
                       "left_out": left_out[:MAX_LEFT_OUT_LISTED],
                       "left_out_count": left_out_count},
                      separators=(",", ":")).encode()


def _tuple(raw: Any, types: tuple[type, ...], what: str) -> tuple:
    if (not isinstance(raw, list) or len(raw) != len(types)
            or not all(type(value) is kind for value, kind in zip(raw, types, strict=True))):
        raise ManifestError(f"not a manifest {what}: {str(raw)[:80]}")
    return tuple(raw)


def _body(data: bytes) -> dict:
    try:
        body = json.loads(data)
    except ValueError as err:
        raise ManifestError(f"not a manifest: {err}") from None
    if not isinstance(body, dict) or body.get("version") not in (MANIFEST_VERSION,
                                                                  TREE_VERSION):
        raise ManifestError("not a manifest of this version")
    return body


def _count(body: dict, listed: int) -> int:
    count = body.get("left_out_count", listed)
    if type(count) is not int:
        raise ManifestError("a manifest's left-out count is not a number")
    return count


def parse_manifest(data: bytes) -> Manifest | Tree:
    """A stored checkpoint root: a version 1 manifest (one flat listing) or a tree."""
    body = _body(data)
    if body["version"] == TREE_VERSION:
        return _tree(body)
    entries = [Entry(*_tuple(raw, (str, str, int, int, str, str), "entry"))
               for raw in body.get("entries", [])]
    left_out = [LeftOut(*_tuple(raw, (str, str, int), "left-out path"))
                for raw in body.get("left_out", [])]
    if any(entry.kind not in KINDS for entry in entries):
        raise ManifestError("a manifest entry of an unknown kind")
    return Manifest(entries=entries, left_out=left_out,
                    left_out_count=_count(body, len(left_out)))


def parse_tree(data: bytes) -> Tree:
    body = _body(data)
    if body["version"] != TREE_VERSION:
        raise ManifestError("not a tree object")
    return _tree(body)


def _tree(body: dict) -> Tree:
    rows = tuple(Entry(*_tuple(raw, (str, str, int, int, str, str), "entry"))
                 for raw in body.get("rows", []))
    left_out = tuple(LeftOut(*_tuple(raw, (str, str, int), "left-out path"))
                     for raw in body.get("left_out", []))
    for row in rows:
        if row.kind not in KINDS:
            raise ManifestError("a manifest entry of an unknown kind")
        if row.path in ("", ".", "..") or "/" in row.path or "\x00" in row.path:
            raise ManifestError(f"a tree row's name {row.path[:80]!r} is not a plain name")
        if row.kind == "dir" and not _is_key(row.sha256):
            raise ManifestError(f"directory {row.path[:80]!r} names no tree object")
    return Tree(rows, left_out, _count(body, len(left_out)))


def _is_key(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)
