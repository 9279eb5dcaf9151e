"""str_replace_based_edit_tool, with trae-agent's commands and outputs."""

from __future__ import annotations

from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import ToolError
from refloop.contract.tool_catalog import EditArgs
from refloop.tools.base import ToolContext, tool
from refloop.tools.journal import Journal
from refloop.tools.sandbox import (
    SKIPPED_DIRS,
    kind,
    line_count,
    list_entries,
    numbered,
    read_text,
    relative,
    resolve,
    truncate_bytes,
    write_text,
)

SNIPPET_CONTEXT = 4



def edited(ctx: ToolContext, rel: str, text: str, start: int, end: int, kind: str,
           before: int) -> ToolResult:
    """trae-agent style success output: a numbered snippet around the change."""
    lines = text.splitlines()
    first = max(1, start - SNIPPET_CONTEXT)
    last = min(len(lines), end + SNIPPET_CONTEXT)
    snippet = numbered("\n".join(lines[first - 1 : last]), first)
    return ToolResult(
        ok=True,
        output=f"The file {rel} has been edited. Here's the result of running `cat -n` on a "
        f"snippet of {rel}:\n{snippet}\nReview the changes and make sure they are as expected.",
        data={"file_path": rel, "edit_kind": kind, "start_line": start, "end_line": end,
              "lines_before": before, "lines_after": len(lines)},
    )


def view(ctx: ToolContext, args: EditArgs) -> ToolResult:
    path = resolve(ctx.workspace, args.path)
    if kind(path) == "dir":
        entries = []
        for name, folder in list_entries(path, args.path):
            if name in SKIPPED_DIRS:
                continue
            entries.append(f"{name}/" if folder else name)
            if folder:
                entries += [f"{name}/{child}/" if sub else f"{name}/{child}"
                            for child, sub in list_entries(path / name, f"{args.path}/{name}")
                            if child not in SKIPPED_DIRS]
        return ToolResult(ok=True, output="\n".join(sorted(entries)) or "(empty)")
    text = read_text(path, args.path)
    start, end = 1, line_count(text)
    if args.view_range:
        start, end = args.view_range[0], args.view_range[1]
        end = line_count(text) if end == -1 else end
        if not 1 <= start <= max(end, 1) or end > line_count(text):
            raise ToolError(
                f"E_RANGE: view_range {args.view_range} is outside 1..{line_count(text)}"
            )
    body = numbered("\n".join(text.splitlines()[start - 1 : end]), start)
    return ToolResult(ok=True, output=truncate_bytes(body, ctx.settings.refloop_max_read_bytes))


def create(ctx: ToolContext, args: EditArgs) -> ToolResult:
    if args.file_text is None:
        raise ToolError("E_INVALID_ARGS: create needs file_text")
    path = resolve(ctx.workspace, args.path)
    if kind(path) is not None:
        raise ToolError(f"E_EXISTS: '{args.path}' already exists; use str_replace to change it")
    ctx.snapshot(path)
    write_text(path, args.file_text, args.path, ctx.settings.refloop_max_write_bytes)
    rel = relative(ctx.workspace, path)
    count = line_count(args.file_text)
    return ToolResult(
        ok=True, output=f"File created successfully at: {rel}",
        data={"file_path": rel, "edit_kind": "create", "start_line": 1, "end_line": count,
              "lines_before": 0, "lines_after": count},
    )


def str_replace(ctx: ToolContext, args: EditArgs) -> ToolResult:
    if not args.old_str:
        raise ToolError("E_INVALID_ARGS: str_replace needs a non-empty old_str")
    path = resolve(ctx.workspace, args.path)
    text = read_text(path, args.path, ctx.settings.refloop_max_write_bytes)
    occurrences = text.count(args.old_str)
    if occurrences != 1:
        where = "did not appear" if occurrences == 0 else f"appeared {occurrences} times"
        raise ToolError(
            f"E_NOT_UNIQUE: old_str {where} in {args.path}; it must appear exactly once"
        )
    new_str = args.new_str or ""
    start = text[: text.index(args.old_str)].count("\n") + 1
    updated = text.replace(args.old_str, new_str, 1)
    ctx.snapshot(path)
    write_text(path, updated, args.path, ctx.settings.refloop_max_write_bytes)
    end = start + max(new_str.count("\n"), 0)
    return edited(ctx, relative(ctx.workspace, path), updated, start, end, "str_replace",
                  line_count(text))


def insert(ctx: ToolContext, args: EditArgs) -> ToolResult:
    if args.insert_line is None or args.new_str is None:
        raise ToolError("E_INVALID_ARGS: insert needs insert_line and new_str")
    path = resolve(ctx.workspace, args.path)
    text = read_text(path, args.path, ctx.settings.refloop_max_write_bytes)
    lines = text.splitlines()
    if args.insert_line > len(lines):
        raise ToolError(f"E_RANGE: insert_line {args.insert_line} is past the end ({len(lines)})")
    new_lines = args.new_str.splitlines() or [""]
    updated_lines = lines[: args.insert_line] + new_lines + lines[args.insert_line :]
    updated = "\n".join(updated_lines) + "\n"
    ctx.snapshot(path)
    write_text(path, updated, args.path, ctx.settings.refloop_max_write_bytes)
    start = args.insert_line + 1
    return edited(ctx, relative(ctx.workspace, path), updated, start,
                  start + len(new_lines) - 1, "insert", len(lines))


def undo_edit(ctx: ToolContext, args: EditArgs) -> ToolResult:
    path = resolve(ctx.workspace, args.path)
    rel = relative(ctx.workspace, path)
    journal = Journal.for_call(ctx)
    for entry in journal.entries():
        if rel in entry["pre_images"] and not entry["undone"] and entry["call_id"] != ctx.call_id:
            ctx.snapshot(path)
            journal.restore(entry, only=rel)
            entry["undone"] = True
            journal.save(entry)
            text = read_text(path, args.path) if kind(path) is not None else ""
            return ToolResult(
                ok=True, output=f"Last edit to {rel} undone.\n{numbered(text)}",
                data={"file_path": rel, "edit_kind": "undo", "undone_call": entry["call_id"],
                      "lines_after": line_count(text)},
            )
    raise ToolError(f"E_NO_HISTORY: no edit of {rel} to undo")


COMMANDS = {"view": view, "create": create, "str_replace": str_replace, "insert": insert,
            "undo_edit": undo_edit}


@tool("str_replace_based_edit_tool")
async def str_replace_based_edit_tool(ctx: ToolContext, args: EditArgs) -> ToolResult:
    return COMMANDS[args.command](ctx, args)
