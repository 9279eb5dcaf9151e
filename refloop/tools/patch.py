"""apply_patch (unified diff, all-or-nothing) and undo_patch."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import ToolError
from refloop.contract.tool_catalog import PatchArgs, UndoPatchArgs
from refloop.tools.base import ToolContext, tool
from refloop.tools.journal import Journal
from refloop.tools.sandbox import (
    kind,
    line_count,
    read_text,
    relative,
    resolve,
    unlink,
    write_text,
)

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")



@dataclass
class FilePatch:
    old: str | None
    new: str | None
    hunks: list[tuple[int, list[str]]] = field(default_factory=list)


def _strip(name: str) -> str | None:
    name = name.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name[:2] in ("a/", "b/") else name


def parse_patch(text: str) -> list[FilePatch]:
    files: list[FilePatch] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        header = index + 1 < len(lines) and lines[index + 1].startswith("+++ ")
        if line.startswith("--- ") and header:
            files.append(FilePatch(_strip(line[4:]), _strip(lines[index + 1][4:])))
            index += 2
            continue
        match = _HUNK.match(line)
        if match:
            if not files:
                raise ToolError("E_PATCH: hunk before any ---/+++ file header")
            body = []
            index += 1
            while index < len(lines) and not lines[index].startswith(("@@", "--- ")):
                if lines[index].startswith(("+", "-", " ")) or lines[index] == "":
                    body.append(lines[index] if lines[index] else " ")
                index += 1
            files[-1].hunks.append((int(match.group(1)), body))
            continue
        index += 1
    if not files:
        raise ToolError("E_PATCH: no file headers (--- / +++) found in the patch")
    return files


def apply_hunks(original: list[str], hunks: list[tuple[int, list[str]]], name: str) -> list[str]:
    result, cursor = list(original), 0
    offset = 0
    for number, (start, body) in enumerate(hunks, start=1):
        old = [line[1:] for line in body if line[0] in (" ", "-")]
        new = [line[1:] for line in body if line[0] in (" ", "+")]
        expected = max(start - 1 + offset, 0)
        position = _find(result, old, expected, cursor)
        if position is None:
            raise ToolError(f"E_PATCH: hunk {number} of {name} does not match the file")
        result[position : position + len(old)] = new
        offset += len(new) - len(old)
        cursor = position + len(new)
    return result


def _find(lines: list[str], block: list[str], expected: int, cursor: int) -> int | None:
    if not block:
        return min(expected, len(lines))
    candidates = sorted(range(cursor, len(lines) - len(block) + 1),
                        key=lambda at: abs(at - expected))
    return next((at for at in candidates if lines[at : at + len(block)] == block), None)


@tool("apply_patch")
async def apply_patch(ctx: ToolContext, args: PatchArgs) -> ToolResult:
    planned: list[tuple[Path, str | None, int]] = []
    for file_patch in parse_patch(args.patch):
        name = file_patch.new or file_patch.old
        path = resolve(ctx.workspace, name)
        limit = ctx.settings.refloop_max_write_bytes
        before = read_text(path, name, limit).splitlines() if file_patch.old else []
        if file_patch.old is None and kind(path) is not None:
            raise ToolError(f"E_PATCH: {name} already exists but the patch creates it")
        after = apply_hunks(before, file_patch.hunks, name)
        content = None if file_patch.new is None else "\n".join(after) + "\n"
        if content is not None and len(content.encode("utf-8", "surrogatepass")) > limit:
            raise ToolError(f"E_TOO_LARGE: the patched {name} would be larger than {limit} "
                            "bytes (REFLOOP_MAX_WRITE_BYTES)")
        planned.append((path, content, len(before)))
    # Everything matched: now write, journaling each pre-image first.
    files = []
    for path, content, _ in planned:
        ctx.snapshot(path)
        if content is None:
            unlink(path, relative(ctx.workspace, path))
        else:
            write_text(path, content, relative(ctx.workspace, path),
                       ctx.settings.refloop_max_write_bytes)
        files.append(relative(ctx.workspace, path))
    first_path, first_content, first_before = planned[0]
    return ToolResult(
        ok=True,
        output=f"patch {ctx.call_id} applied to {', '.join(files)}",
        data={"file_path": files[0], "edit_kind": "patch", "patch_id": ctx.call_id,
              "files": files, "lines_before": first_before,
              "lines_after": line_count(first_content or "")},
    )


# An undo restores content that was reviewed when it was written.
@tool("undo_patch")
async def undo_patch(ctx: ToolContext, args: UndoPatchArgs) -> ToolResult:
    journal = Journal.for_call(ctx)
    patches = [e for e in journal.entries() if e["tool"] == "apply_patch" and not e["undone"]]
    if args.patch_id:
        patches = [e for e in patches if e["call_id"] == args.patch_id]
    if not patches:
        target = f"patch {args.patch_id}" if args.patch_id else "applied patch"
        raise ToolError(f"E_NO_HISTORY: no {target} to undo")
    entry = patches[0]
    for key in entry["pre_images"]:
        ctx.snapshot(resolve(ctx.workspace, key))
    restored = journal.restore(entry)
    entry["undone"] = True
    journal.save(entry)
    return ToolResult(ok=True, output=f"patch {entry['call_id']} undone: {', '.join(restored)}",
                      data={"file_path": restored[0] if restored else "", "edit_kind": "undo",
                            "patch_id": entry["call_id"], "files": restored})
