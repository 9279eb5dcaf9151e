"""Definitions and chunks: tree-sitter and the `ast` fallback agree; windows elsewhere."""

from __future__ import annotations

import pytest

from refloop import code_symbols
from refloop.code_symbols import MAX_CHUNK_LINES, chunk_file, definitions

SOURCE = '''"""Module doc."""
import os

CONSTANT = 1


@decorator
def top(a, b):
    return a + b


class Store:
    def get(self, key):
        return key

    async def put(self, key, value):
        pass


def tail():
    pass
'''


def _flat(defs):
    return [(name, d.kind, d.start_line, d.end_line) for top in defs for name, d in top.walk()]


def test_python_definitions_with_methods_and_decorators():
    assert _flat(definitions("m.py", SOURCE)) == [
        ("top", "function", 7, 9),  # starts at its decorator
        ("Store", "class", 12, 17),
        ("Store.get", "function", 13, 14),
        ("Store.put", "function", 16, 17),
        ("tail", "function", 20, 21),
    ]


def test_tree_sitter_and_ast_agree():
    if code_symbols._tree_sitter_python() is None:
        pytest.skip("tree-sitter is part of the semantic extra")
    tree = code_symbols._tree_sitter_python().parse(SOURCE.encode())
    assert _flat(code_symbols._ts_definitions(tree.root_node)) == _flat(
        code_symbols._ast_definitions(SOURCE))


def test_unparseable_python_has_no_definitions_but_still_chunks():
    broken = "def broken(:\n    pass\n" * 3
    assert code_symbols._ast_definitions(broken) == []
    chunks = chunk_file("b.py", broken)
    assert chunks and chunks[0].start_line == 1


def test_chunks_follow_definitions_and_cover_module_code():
    chunks = chunk_file("m.py", SOURCE)
    by_symbol = {c.symbol: (c.start_line, c.end_line) for c in chunks}
    assert by_symbol["top"] == (7, 9)
    assert by_symbol["Store"] == (12, 17)  # a short class stays whole
    assert by_symbol["tail"] == (20, 21)
    module = [c for c in chunks if c.symbol is None]
    assert module[0].start_line == 1 and "CONSTANT = 1" in module[0].text


def test_a_long_class_is_split_into_its_methods():
    methods = "".join(f"    def m{i}(self):\n" + "        x = 1\n" * 8 + "\n" for i in range(12))
    source = "class Big:\n    '''doc'''\n\n" + methods
    chunks = chunk_file("big.py", source)
    symbols = [c.symbol for c in chunks]
    assert "Big" in symbols and "Big.m0" in symbols and "Big.m11" in symbols
    assert all(c.end_line - c.start_line < MAX_CHUNK_LINES for c in chunks)


def test_other_languages_use_line_windows_and_a_definition_regex():
    js = "\n".join(["export async function loadUser(id) {", "  return fetch(id);", "}"]
                   + [f"// line {n}" for n in range(100)])
    chunks = chunk_file("app.js", js)
    assert len(chunks) > 1 and chunks[1].start_line < chunks[0].end_line  # overlapping
    assert all(c.symbol is None for c in chunks)
    assert [(d.name, d.kind) for d in definitions("app.js", js)] == [("loadUser", "function")]


def test_blank_files_have_no_chunks():
    assert chunk_file("e.py", "") == []
    assert chunk_file("e.txt", "\n\n  \n") == []
