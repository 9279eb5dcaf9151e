"""Read-only tools and write_file."""

from __future__ import annotations

import fnmatch
import os
import re

from pydantic import BaseModel, Field

from refloop.models import ToolResult
from refloop.tools.base import ToolContext, ToolError, tool
from refloop.tools.sandbox import (
    SKIPPED_DIRS,
    line_count,
    numbered,
    read_text,
    relative,
    resolve,
    truncate_bytes,
    write_text,
)

MAX_MATCHES = 200


class PathArgs(BaseModel):
    path: str = Field(description="path relative to the workspace")


class ReadFileArgs(BaseModel):
    path: str
    start_line: int | None = Field(default=None, ge=1, description="1-based, inclusive")
    end_line: int | None = Field(default=None, ge=1, description="1-based, inclusive")


class GlobArgs(BaseModel):
    pattern: str = Field(description="glob such as **/*.py")


class GrepArgs(BaseModel):
    pattern: str = Field(description="Python regular expression")
    path: str = "."
    glob: str | None = Field(default=None, description="only files matching this glob")


class WriteFileArgs(BaseModel):
    path: str
    content: str


def walk_files(ctx: ToolContext, start):
    for folder, dirs, files in os.walk(start):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            yield os.path.join(folder, name)


@tool("list_dir", PathArgs, "List a directory of the workspace.")
async def list_dir(ctx: ToolContext, args: PathArgs) -> ToolResult:
    path = resolve(ctx.workspace, args.path)
    if not path.is_dir():
        raise ToolError(f"E_NOT_FOUND: '{args.path}' is not a directory")
    entries = sorted(
        f"{p.name}/" if p.is_dir() else p.name
        for p in path.iterdir() if p.name not in SKIPPED_DIRS
    )
    return ToolResult(ok=True, output="\n".join(entries) or "(empty)",
                      data={"count": len(entries)})


@tool("read_file", ReadFileArgs, "Read a text file, optionally a 1-based line range.")
async def read_file(ctx: ToolContext, args: ReadFileArgs) -> ToolResult:
    text = read_text(resolve(ctx.workspace, args.path), args.path)
    lines = text.splitlines()
    start = args.start_line or 1
    end = min(args.end_line or len(lines), len(lines))
    if start > max(end, 1) and lines:
        raise ToolError(f"E_RANGE: start_line {start} is past the end ({len(lines)} lines)")
    body = numbered("\n".join(lines[start - 1 : end]), start)
    output = truncate_bytes(body, ctx.settings.refloop_max_read_bytes)
    return ToolResult(ok=True, output=output or "(empty file)",
                      data={"lines": len(lines), "start_line": start, "end_line": end})


@tool("glob_file_search", GlobArgs, "Find files by glob pattern, e.g. **/*.md.")
async def glob_file_search(ctx: ToolContext, args: GlobArgs) -> ToolResult:
    if args.pattern.startswith("/") or ".." in args.pattern.split("/"):
        raise ToolError("E_PATH_ESCAPE: glob patterns are relative to the workspace")
    matches = []
    for path in sorted(ctx.workspace.glob(args.pattern)):
        rel = relative(ctx.workspace, path)
        if path.is_file() and not SKIPPED_DIRS.intersection(rel.split("/")):
            matches.append(rel)
    shown = matches[:MAX_MATCHES]
    more = f"\n[... {len(matches) - MAX_MATCHES} more ...]" if len(matches) > MAX_MATCHES else ""
    return ToolResult(ok=True, output="\n".join(shown) + more or "(no matches)",
                      data={"count": len(matches)})


@tool("grep", GrepArgs, "Search file contents with a regular expression.")
async def grep(ctx: ToolContext, args: GrepArgs) -> ToolResult:
    try:
        regex = re.compile(args.pattern)
    except re.error as err:
        raise ToolError(f"E_INVALID_ARGS: bad regular expression: {err}") from None
    start = resolve(ctx.workspace, args.path)
    candidates = [str(start)] if start.is_file() else walk_files(ctx, start)
    hits: list[str] = []
    for name in candidates:
        rel = relative(ctx.workspace, resolve(ctx.workspace, name))
        if args.glob and not fnmatch.fnmatch(rel, args.glob):
            continue
        try:
            with open(name, encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    if regex.search(line):
                        hits.append(f"{rel}:{number}: {line.rstrip()}")
        except (UnicodeDecodeError, OSError):
            continue
        if len(hits) > MAX_MATCHES:
            break
    more = f"\n[... more than {MAX_MATCHES} matches ...]" if len(hits) > MAX_MATCHES else ""
    output = "\n".join(hits[:MAX_MATCHES]) + more or "(no matches)"
    return ToolResult(ok=True, output=truncate_bytes(output, ctx.settings.refloop_max_output_bytes),
                      data={"count": len(hits)})


@tool("write_file", WriteFileArgs, "Create or overwrite a text file.", edits=True)
async def write_file(ctx: ToolContext, args: WriteFileArgs) -> ToolResult:
    path = resolve(ctx.workspace, args.path)
    if path.is_dir():
        raise ToolError(f"E_IS_DIR: '{args.path}' is a directory")
    existed = path.is_file()
    before = line_count(read_text(path, args.path)) if existed else 0
    ctx.snapshot(path)
    write_text(path, args.content)
    after = line_count(args.content)
    rel = relative(ctx.workspace, path)
    return ToolResult(
        ok=True,
        output=f"wrote {rel} ({after} lines, {len(args.content.encode())} bytes)",
        data={"file_path": rel, "edit_kind": "write" if existed else "create",
              "start_line": 1, "end_line": after, "lines_before": before, "lines_after": after},
    )
