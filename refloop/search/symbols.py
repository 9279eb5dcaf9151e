"""Code structure for the repo map and the semantic index: definitions per file, and the
workspace's source files.

Python is parsed with tree-sitter when the `semantic` extra is installed, else with the
standard `ast` module (same definitions either way). Other languages get their symbols
from a definition regex. The semantic index's chunks are `refloop.search.chunks`.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from refloop.runtime.nofollow import open_regular

CODE_SUFFIXES = frozenset({
    ".py", ".pyi", ".js", ".jsx", ".ts", ".tsx", ".go", ".rs", ".java", ".kt", ".c", ".h",
    ".cc", ".cpp", ".hpp", ".cs", ".rb", ".php", ".swift", ".scala", ".sh",
})
# Indexed for semantic search beside code; not part of the repo map.
TEXT_SUFFIXES = frozenset({".md", ".rst", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".ini"})

# Besides hidden folders (.git, .venv, the tools' .refloop journal).
VENDORED_DIRS = frozenset({"__pycache__", "node_modules", "venv", "site-packages"})

_DEFINITION = re.compile(
    r"^\s*(?:export\s+)?(?:default\s+)?(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:static\s+)?"
    r"(?P<kind>class|def|function|func|fn|struct|interface|trait|enum|module)\s+"
    r"(?P<name>[A-Za-z_]\w*)"
)


@dataclass(frozen=True)
class Definition:
    """A class or function: 1-based inclusive lines, methods as children."""

    name: str
    kind: str  # "class" or "function"
    start_line: int
    end_line: int
    children: tuple[Definition, ...] = field(default=())

    def walk(self, prefix: str = "") -> Iterator[tuple[str, Definition]]:
        qualified = f"{prefix}{self.name}"
        yield qualified, self
        for child in self.children:
            yield from child.walk(f"{qualified}.")


def iter_sources(root: Path, suffixes: frozenset[str], max_bytes: int
                 ) -> Iterator[tuple[str, Path]]:
    """(relative posix path, absolute path) of the workspace's source files, sorted;
    hidden and vendored folders and files over `max_bytes` are left out."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in VENDORED_DIRS and not d.startswith("."))
        for name in sorted(files):
            path = Path(folder, name)
            if path.suffix not in suffixes or not _utf8(str(path)):
                continue  # a name that is not UTF-8 could not be stored or shown
            try:  # links, FIFOs, sockets and devices are never read (a FIFO would block)
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
                    continue
            except OSError:
                continue
            yield path.relative_to(root).as_posix(), path


# Nothing the index or the repo map reads is larger (a source file, not a data dump).
MAX_SOURCE_BYTES = 64 * 1024 * 1024


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_source_bytes(path: Path, max_bytes: int = MAX_SOURCE_BYTES) -> bytes | None:
    """The file's bytes, or None for links (on any component of its path: a parent swapped
    for a link mid-index reads nothing), FIFOs and devices (never waited on), files with
    more than one hard link (a repository's link may name a file outside it)."""
    return open_regular(str(path), max_bytes)


def read_source(path: Path) -> str | None:
    """The file's text, or None for binary files and everything `read_source_bytes`
    refuses."""
    data = read_source_bytes(path)
    try:
        return data.decode("utf-8") if data is not None else None
    except UnicodeDecodeError:
        return None


# ---------------------------------------------------------------- definitions


def definitions(path: str, text: str) -> list[Definition]:
    """Top-level definitions with their nested ones; [] when the file cannot be parsed."""
    if path.endswith((".py", ".pyi")):
        parser = _tree_sitter_python()
        if parser is not None:
            return _ts_definitions(parser.parse(text.encode("utf-8")).root_node)
        return _ast_definitions(text)
    return _regex_definitions(text)


@functools.cache
def _tree_sitter_python():
    try:
        import tree_sitter
        import tree_sitter_python
    except ImportError:
        return None
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_python.language()))


_TS_KINDS = {"class_definition": "class", "function_definition": "function"}


def _ts_definitions(node) -> list[Definition]:
    found = []
    for child in node.children:
        target, start = child, child.start_point[0]
        if child.type == "decorated_definition":
            target = child.child_by_field_name("definition") or child
        kind = _TS_KINDS.get(target.type)
        if kind is None:
            continue
        name = target.child_by_field_name("name")
        body = target.child_by_field_name("body")
        found.append(Definition(
            name=name.text.decode("utf-8") if name is not None else "?",
            kind=kind,
            start_line=start + 1,
            end_line=child.end_point[0] + 1,
            children=tuple(_ts_definitions(body)) if body is not None else (),
        ))
    return found


def _ast_definitions(text: str) -> list[Definition]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    return _ast_body(tree.body)


def _ast_body(body: list[ast.stmt]) -> list[Definition]:
    found = []
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found.append(Definition(
                name=node.name,
                kind="class" if isinstance(node, ast.ClassDef) else "function",
                start_line=start,
                end_line=node.end_lineno or node.lineno,
                children=tuple(_ast_body(node.body)),
            ))
    return found


def _regex_definitions(text: str) -> list[Definition]:
    """Definition lines only (no extent): enough for a repo map of other languages."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = _DEFINITION.match(line)
        if match:
            kind = "function" if match["kind"] in {"def", "function", "func", "fn"} else "class"
            found.append(Definition(match["name"], kind, number, number))
    return found
