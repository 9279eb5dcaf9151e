"""What changed between two stored checkpoints of a workspace, for a person to review: each
path added, removed or modified, with a unified diff of text files. Read-only, and bounded
(the objects come from a store any host writes to): so many paths listed, so many bytes
read, so many lines shown."""

from __future__ import annotations

import difflib
from typing import Literal

from pydantic import BaseModel

from refloop.checkpoints.manifest import Entry
from refloop.checkpoints.objects import ObjectStore, content_key
from refloop.checkpoints.snapshot import load_manifest

MAX_FILES = 300  # paths listed; the rest are counted
MAX_FILE_BYTES = 256 * 1024  # a larger side is told by its size, not diffed
MAX_TOTAL_BYTES = 4 * 1024 * 1024  # content read for one diff
MAX_DIFF_LINES = 2_000  # of one file's diff
CONTEXT_LINES = 3


class FileChange(BaseModel):
    path: str
    change: Literal["added", "removed", "modified"]
    kind: str  # file, link or dir: the new side's (the old one's when removed)
    old_size: int | None = None
    new_size: int | None = None
    diff: str | None = None  # a unified diff, for text files within the bounds
    note: str | None = None  # why there is no diff, or what else changed (mode, link)
    added_lines: int = 0
    removed_lines: int = 0


class CheckpointDiff(BaseModel):
    base: str | None  # None: an empty workspace
    checkpoint: str
    files: list[FileChange]
    changed: int  # changed paths in all: more than listed when `truncated`
    truncated: bool


def _same(a: Entry, b: Entry) -> bool:
    return (a.kind, a.mode, a.sha256, a.target) == (b.kind, b.mode, b.sha256, b.target)


def _text(data: bytes | None) -> list[str] | None:
    if data is None or b"\x00" in data:
        return None
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None


class _Contents:
    """File contents read for the diff, within MAX_TOTAL_BYTES, checked against their key."""

    def __init__(self, store: ObjectStore, wanted: list[Entry]) -> None:
        keys: set[str] = set()
        budget = MAX_TOTAL_BYTES
        for entry in wanted:
            if entry.kind == "file" and entry.size <= min(MAX_FILE_BYTES, budget) \
                    and entry.sha256 not in keys:
                keys.add(entry.sha256)
                budget -= entry.size
        self.found = {key: data for key, data in store.get_many(keys).items()
                      if content_key(data) == key} if keys else {}

    def lines(self, entry: Entry | None) -> tuple[list[str] | None, str | None]:
        """(its lines, or why none)."""
        if entry is None:
            return [], None
        if entry.kind != "file":
            return None, None
        if entry.sha256 not in self.found:
            return None, f"not shown: {entry.size:,} bytes"
        lines = _text(self.found[entry.sha256])
        return (lines, None) if lines is not None else (None, "binary file")


def _change(path: str, old: Entry | None, new: Entry | None, contents: _Contents) -> FileChange:
    change = "added" if old is None else "removed" if new is None else "modified"
    side = new or old
    assert side is not None
    out = FileChange(path=path, change=change, kind=side.kind,
                     old_size=old.size if old and old.kind == "file" else None,
                     new_size=new.size if new and new.kind == "file" else None)
    notes = []
    if old and new and old.kind != new.kind:
        notes.append(f"was a {old.kind}, now a {new.kind}")
    elif old and new and old.mode != new.mode:
        notes.append(f"mode {old.mode:o} → {new.mode:o}")
    if side.kind == "link":
        moved = old and new and old.kind == "link" and old.target != new.target
        notes.append(f"link to {old.target} → {new.target}" if moved
                     else f"link to {side.target}")
    before, why_before = contents.lines(old)
    after, why_after = contents.lines(new)
    if before is not None and after is not None and (old is None or new is None
                                                     or old.sha256 != new.sha256):
        lines = list(difflib.unified_diff(before, after, f"a/{path}", f"b/{path}",
                                          n=CONTEXT_LINES, lineterm=""))
        out.added_lines = sum(1 for line in lines[2:] if line.startswith("+"))
        out.removed_lines = sum(1 for line in lines[2:] if line.startswith("-"))
        if len(lines) > MAX_DIFF_LINES:
            lines = [*lines[:MAX_DIFF_LINES], f"… ({len(lines) - MAX_DIFF_LINES} more lines)"]
        out.diff = "\n".join(lines)
    notes.extend(why for why in (why_before, why_after) if why)
    out.note = "; ".join(dict.fromkeys(notes)) or None
    return out


def diff_checkpoints(store: ObjectStore, base: str | None, checkpoint: str) -> CheckpointDiff:
    """What changed from `base` (None: an empty workspace) to `checkpoint`. Raises KeyError
    when an object is not in the store, ValueError (ManifestError) when one is not a
    checkpoint."""
    old = load_manifest(store, base).by_path() if base else {}
    new = load_manifest(store, checkpoint).by_path()
    changed = [path for path in sorted(old.keys() | new.keys())
               if path not in old or path not in new or not _same(old[path], new[path])]
    listed = changed[:MAX_FILES]
    sides = [entry for path in listed for entry in (old.get(path), new.get(path)) if entry]
    contents = _Contents(store, sides)
    return CheckpointDiff(
        base=base, checkpoint=checkpoint, changed=len(changed),
        truncated=len(changed) > len(listed),
        files=[_change(path, old.get(path), new.get(path), contents) for path in listed])
