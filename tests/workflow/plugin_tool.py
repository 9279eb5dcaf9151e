"""A tool added from outside refloop/tools, in one module: importing it registers it. It
declares only its kind; approval, review, windowing and retries follow from that."""

from __future__ import annotations

from pydantic import BaseModel

from refloop.contract.activity_io import ToolResult
from refloop.tools.base import ToolContext, tool
from refloop.tools.sandbox import kind, line_count, read_text, relative, resolve, write_text

NAME = "append_text"


class AppendArgs(BaseModel):
    path: str
    text: str


@tool(NAME, AppendArgs, "Append text to a file of the workspace.", kind="write", edits=True)
async def append_text(ctx: ToolContext, args: AppendArgs) -> ToolResult:
    limit = ctx.settings.refloop_max_write_bytes
    path = resolve(ctx.workspace, args.path)
    before = read_text(path, args.path, limit) if kind(path) == "file" else ""
    ctx.snapshot(path)
    write_text(path, before + args.text, args.path, limit)
    rel = relative(ctx.workspace, path)
    after = line_count(before + args.text)
    # The whole file as the output: long, so how it is cut shows.
    return ToolResult(ok=True, output=before + args.text,
                      data={"file_path": rel, "edit_kind": "insert",
                            "start_line": line_count(before) + 1, "end_line": after})
