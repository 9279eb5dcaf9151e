"""json_edit_tool: view, set, add and remove values by a small JSONPath subset."""

from __future__ import annotations

import json
import re
from typing import Any

from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import ToolError
from refloop.contract.tool_catalog import JsonEditArgs
from refloop.tools.base import ToolContext, tool
from refloop.tools.sandbox import line_count, read_text, relative, resolve, write_text

# Deeper documents (or values) are refused: Python's json recursion has a hard floor.
MAX_JSON_DEPTH = 100
_TOKEN = re.compile(r"\.([A-Za-z_][\w-]*)|\[(-?\d+)\]|\[(['\"])(.*?)\3\]|\[(-)\]")



def parse_path(path: str) -> list[str | int]:
    """`$.a.b[0]['c d'][-]` -> ["a", "b", 0, "c d", "-"]; "-" appends (add only)."""
    if not path.startswith("$"):
        raise ToolError(f"E_JSON_PATH: '{path}' must start with $")
    parts: list[str | int] = []
    position = 1
    while position < len(path):
        match = _TOKEN.match(path, position)
        if not match:
            raise ToolError(f"E_JSON_PATH: cannot parse '{path}' at '{path[position:]}'")
        key, index, _, quoted, append = match.groups()
        parts.append(key if key is not None else int(index) if index is not None
                     else quoted if quoted is not None else append)
        position = match.end()
    return parts


def depth(value: Any) -> int:
    """Nesting depth, iteratively (no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level > MAX_JSON_DEPTH:
                return level
            stack.extend((child, level + 1)
                         for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_depth(value: Any, what: str) -> None:
    if depth(value) > MAX_JSON_DEPTH:
        raise ToolError(f"E_JSON_DEPTH: {what} nests deeper than {MAX_JSON_DEPTH} levels")


def walk(doc: Any, parts: list[str | int], path: str) -> Any:
    for part in parts:
        try:
            doc = doc[part]
        except (KeyError, IndexError, TypeError):
            raise ToolError(f"E_JSON_PATH: '{path}' does not exist") from None
    return doc


@tool("json_edit_tool")
async def json_edit_tool(ctx: ToolContext, args: JsonEditArgs) -> ToolResult:
    path = resolve(ctx.workspace, args.file_path)
    text = read_text(path, args.file_path, ctx.settings.refloop_max_write_bytes)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ToolError(f"E_INVALID_JSON: {args.file_path}: {err}") from None
    except RecursionError:
        raise ToolError(f"E_JSON_DEPTH: {args.file_path} nests too deeply") from None
    check_depth(doc, args.file_path)
    check_depth(args.value, "the value")
    json_path = args.json_path or "$"
    parts = parse_path(json_path)
    if len(parts) > MAX_JSON_DEPTH:
        raise ToolError(f"E_JSON_PATH: '{json_path[:100]}' is deeper than {MAX_JSON_DEPTH}")
    if args.operation == "view":
        return ToolResult(ok=True, output=json.dumps(walk(doc, parts, json_path), indent=2,
                                                     ensure_ascii=False))
    if not parts:
        if args.operation != "set":
            raise ToolError("E_JSON_PATH: add/remove need a path below $")
        doc = args.value
    else:
        parent = walk(doc, parts[:-1], json_path)
        last = parts[-1]
        apply_change(parent, last, args.operation, args.value, json_path)
    check_depth(doc, "the result")
    updated = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    ctx.snapshot(path)
    write_text(path, updated, args.file_path, ctx.settings.refloop_max_write_bytes)
    rel = relative(ctx.workspace, path)
    return ToolResult(
        ok=True, output=f"{args.operation} {json_path} in {rel}",
        data={"file_path": rel, "edit_kind": args.operation, "json_path": json_path,
              "value": args.value, "lines_before": line_count(text),
              "lines_after": line_count(updated)},
    )


def apply_change(parent: Any, last: str | int, operation: str, value: Any, path: str) -> None:
    if isinstance(parent, list):
        if last == "-":
            if operation != "add":
                raise ToolError("E_JSON_PATH: '[-]' only appends with add")
            parent.append(value)
            return
        if not isinstance(last, int):
            raise ToolError(f"E_JSON_PATH: '{path}' indexes an array with a key")
        if operation == "add":
            if not -len(parent) - 1 < last <= len(parent):
                raise ToolError(f"E_JSON_PATH: index {last} is out of range")
            parent.insert(last, value)
        elif not -len(parent) <= last < len(parent):
            raise ToolError(f"E_JSON_PATH: '{path}' does not exist")
        elif operation == "set":
            parent[last] = value
        else:
            del parent[last]
        return
    if not isinstance(parent, dict) or not isinstance(last, str):
        raise ToolError(f"E_JSON_PATH: '{path}' does not address an object member")
    if operation == "add" and last in parent:
        raise ToolError(f"E_JSON_PATH: '{path}' already exists; use set")
    if operation in ("set", "remove") and last not in parent:
        raise ToolError(f"E_JSON_PATH: '{path}' does not exist")
    if operation == "remove":
        del parent[last]
    else:
        parent[last] = value
