"""Definitions: tree-sitter and the `ast` fallback agree; a regex elsewhere."""

from __future__ import annotations

import pytest

from refloop.search import symbols as code_symbols
from refloop.search.symbols import definitions

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


def test_unparseable_python_has_no_definitions():
    broken = "def broken(:\n    pass\n" * 3
    assert code_symbols._ast_definitions(broken) == []


def test_other_languages_use_a_definition_regex():
    js = "\n".join(["export async function loadUser(id) {", "  return fetch(id);", "}"])
    assert [(d.name, d.kind) for d in definitions("app.js", js)] == [("loadUser", "function")]
