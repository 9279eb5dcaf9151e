"""What a code-search hit shows: its definition line (and its classes' for a method) first,
whatever the budget, then the docstring's start and the matched lines; gaps marked."""

from __future__ import annotations

from refloop.search.excerpt import GAP, excerpt, owner_lines, signature_lines

SOURCE = '''import os


class Outer:
    """Holds things."""

    class Store:
        """A store of records."""

        @staticmethod
        @cached
        def load_all(
            path: str,
            limit: int = 10,
        ) -> list[str]:
            """Read every record of the file at path.

            More words about reading.
            """
''' + "".join(f"            step_{n} = compute({n})\n" for n in range(80)) + '''\
            marker = "the line the query matched"
            return [marker]
'''
LINES = SOURCE.splitlines()
START = LINES.index("        @staticmethod") + 1
END = len(LINES)


def _shown(text: str) -> list[int]:
    return [int(line.split("\t", 1)[0]) for line in text.splitlines() if line != GAP]


def test_a_long_method_shows_its_classes_signature_docstring_and_the_match_within_budget():
    matched = LINES.index('            marker = "the line the query matched"') + 1
    text = excerpt(LINES, START, END, "Outer.Store.load_all",
                   '            marker = "the line the query matched"', budget=700)
    shown = _shown(text)
    outer, store = owner_lines(LINES, START, "Outer.Store.load_all")
    assert LINES[outer - 1] == "class Outer:" and LINES[store - 1] == "    class Store:"
    signature = signature_lines(LINES, START, END)
    assert LINES[signature[-1] - 1] == "        ) -> list[str]:"  # through the colon
    assert shown[:2] == [outer, store] and set(signature) <= set(shown)
    assert START + 6 in shown  # the docstring's first line
    assert matched in shown
    assert len(text) <= 700 + 100 and GAP in text.splitlines()
    assert text.splitlines()[0] == f"{outer}\tclass Outer:"


def test_the_definition_line_is_shown_even_when_the_budget_is_tiny():
    text = excerpt(LINES, START, END, "Outer.Store.load_all", "", budget=10)
    assert f"{START + 2}\t        def load_all(" in text.splitlines()


def test_a_short_definition_is_shown_whole_and_numbered():
    lines = ["def add(a, b):", '    """Sum."""', "", "    return a + b"]
    assert excerpt(lines, 1, 4, "add", "", budget=1_000) == \
        '1\tdef add(a, b):\n2\t    """Sum."""\n3\t\n4\t    return a + b'


def test_a_module_window_shows_its_lines_and_overlong_lines_are_cut():
    lines = ["x = 1", "y = '" + "z" * 500 + "'"]
    text = excerpt(lines, 1, 2, "", "", budget=1_000)
    assert text.startswith("1\tx = 1\n2\ty = 'zzz") and len(text.splitlines()[1]) < 220
