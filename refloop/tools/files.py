"""Read-only tools and write_file (every path opened with no link followed)."""

from __future__ import annotations

import time

from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import ToolError
from refloop.contract.tool_catalog import GlobArgs, GrepArgs, PathArgs, ReadFileArgs, WriteFileArgs
from refloop.tools.base import ToolContext, tool
from refloop.tools.patterns import compile_regex, glob_match, path_glob
from refloop.tools.sandbox import (
    SKIPPED_DIRS,
    Walk,
    check_path_text,
    is_file,
    kind,
    line_count,
    list_entries,
    numbered,
    read_text,
    relative,
    resolve,
    shown,
    truncate_bytes,
    write_text,
)

MAX_MATCHES = 200
# The time one grep may take over a large tree (checked between files). No pattern can
# backtrack: RE2 matches in time linear in the text (refloop.tools.patterns).
GREP_BUDGET_S = 5.0



# An empty listing is an answer, not an anomaly.
@tool("list_dir")
async def list_dir(ctx: ToolContext, args: PathArgs) -> ToolResult:
    path = resolve(ctx.workspace, args.path)
    entries = [f"{shown(name)}/" if folder else shown(name)
               for name, folder in list_entries(path, args.path) if name not in SKIPPED_DIRS]
    return ToolResult(ok=True, output="\n".join(entries) or "(empty)",
                      data={"count": len(entries)})


@tool("read_file")
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


@tool("glob_file_search")
async def glob_file_search(ctx: ToolContext, args: GlobArgs) -> ToolResult:
    check_path_text(args.pattern)
    if args.pattern.startswith("/") or ".." in args.pattern.split("/"):
        raise ToolError("E_PATH_ESCAPE: glob patterns are relative to the workspace")
    pattern = "/".join(part for part in args.pattern.split("/") if part not in ("", "."))
    matches = []
    walk = Walk(ctx.workspace)
    for path in walk:
        rel = shown(relative(ctx.workspace, path))  # matched as shown: RE2 takes UTF-8 only
        if glob_match(pattern, rel) and is_file(path):
            matches.append(rel)
    first = matches[:MAX_MATCHES]
    more = f"\n[... {len(matches) - MAX_MATCHES} more ...]" if len(matches) > MAX_MATCHES else ""
    return ToolResult(ok=True, output=("\n".join(first) + more or "(no matches)") + walk.note(),
                      data={"count": len(matches)})


@tool("grep")
async def grep(ctx: ToolContext, args: GrepArgs) -> ToolResult:
    compiled = compile_regex(args.pattern)
    wanted = path_glob(args.glob) if args.glob else None
    start = resolve(ctx.workspace, args.path)
    found = kind(start)
    if found not in ("file", "dir"):
        raise ToolError(f"E_NOT_FOUND: '{args.path}' is not a file or directory")
    walk = Walk(start)
    candidates = [start] if found == "file" else walk
    deadline = time.monotonic() + GREP_BUDGET_S
    hits: list[str] = []
    for path in candidates:
        rel = relative(ctx.workspace, path)
        if wanted is not None and not wanted(shown(rel)):
            continue
        try:
            text = read_text(path, rel)
        except ToolError:  # binary, linked, too large or gone: not searched
            continue
        if time.monotonic() > deadline:
            raise ToolError(f"E_TIMEOUT: the search took over {GREP_BUDGET_S:g}s (stopped at "
                            f"{shown(rel)}); narrow the path or the glob")
        for number, line in enumerate(text.splitlines(), start=1):
            if compiled.search(line):  # RE2: linear in the line, whatever the pattern
                found_line = shown(line.rstrip(), keep="\t")
                hits.append(f"{shown(rel)}:{number}: {found_line}")
        if len(hits) > MAX_MATCHES:
            break
    more = f"\n[... more than {MAX_MATCHES} matches ...]" if len(hits) > MAX_MATCHES else ""
    output = ("\n".join(hits[:MAX_MATCHES]) + more or "(no matches)") + walk.note()
    return ToolResult(ok=True, output=truncate_bytes(output, ctx.settings.refloop_max_output_bytes),
                      data={"count": len(hits)})


@tool("write_file")
async def write_file(ctx: ToolContext, args: WriteFileArgs) -> ToolResult:
    limit = ctx.settings.refloop_max_write_bytes
    size = len(args.content.encode("utf-8", errors="surrogatepass"))
    if size > limit:
        raise ToolError(f"E_TOO_LARGE: the content is {size} bytes; the limit is {limit} "
                        "(REFLOOP_MAX_WRITE_BYTES)")
    path = resolve(ctx.workspace, args.path)
    found = kind(path)
    if found == "dir":
        raise ToolError(f"E_IS_DIR: '{args.path}' is a directory")
    existed = found is not None
    before = line_count(read_text(path, args.path, limit)) if existed else 0
    ctx.snapshot(path)
    write_text(path, args.content, args.path, limit)
    after = line_count(args.content)
    rel = relative(ctx.workspace, path)
    return ToolResult(
        ok=True,
        output=f"wrote {rel} ({after} lines, {len(args.content.encode())} bytes)",
        data={"file_path": rel, "edit_kind": "write" if existed else "create",
              "start_line": 1, "end_line": after, "lines_before": before, "lines_after": after},
    )
