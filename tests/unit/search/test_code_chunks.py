"""Chunks sized to a token window, mapped to whole definitions; identifier terms; fusion
and merging per definition. Pure functions: a word count stands in for the tokenizer."""

from __future__ import annotations

from refloop.search import chunks as chunking
from refloop.search.chunks import (
    WINDOW_LINES,
    approx_tokens,
    chunk_source,
    identifier_terms,
    split_identifier,
)
from refloop.search.fusion import (
    NAME_TEXT_WEIGHT,
    TEXT_WEIGHT,
    fuse_by_definition,
    fuse_scores,
    merge_by_definition,
    text_weight,
)

SOURCE = '''"""Storage helpers."""
import sys

DEFAULT_LIMIT = 1


@register
def top(a, b):
    """Add two numbers."""
    return a + b


class Store:
    """A key-value store."""

    limit = 10

    def get(self, key):
        return key

    async def put(self, key, value):
        pass


def tail():
    pass
'''


def words(texts: list[str]) -> list[int]:
    return [len(text.split()) for text in texts]


def _by_symbol(chunks):
    found = {}
    for chunk in chunks:
        found.setdefault(chunk.symbol, []).append(chunk)
    return found


def test_each_definition_is_a_unit_with_its_whole_range_and_symbol_path():
    chunks = _by_symbol(chunk_source("pkg/m.py", SOURCE))
    top, top_doc = chunks["top"]
    assert (top.start_line, top.end_line, top.part) == (7, 10, "whole")  # from its decorator
    assert top.header == "pkg/m.py :: def top(a, b) | top"
    assert top.document.startswith("pkg/m.py :: def top(a, b) | top\n@register")
    # a documented definition also embeds its prose alone
    assert (top_doc.part, top_doc.text) == ("summary", "def top(a, b)\nAdd two numbers.")
    assert (top_doc.start_line, top_doc.end_line) == (7, 10)
    [get] = chunks["Store.get"]
    assert (get.start_line, get.end_line) == (18, 19)
    assert get.header == "pkg/m.py :: class Store :: def get(self, key) | store get"
    store = chunks["Store"][0]
    assert (store.start_line, store.end_line) == (13, 22)
    # the class's own text: header, docstring, attributes and member signatures only
    assert "limit = 10" in store.text and "def get(self, key):" in store.text
    assert "return key" not in store.text
    assert chunks["Store.put"][0].header.endswith(":: async def put(self, key, value) | store put")
    module = chunks[""]
    assert module[0].start_line == 1 and "DEFAULT_LIMIT = 1" in module[0].text
    assert all(c.part == "window" and c.header == "pkg/m.py" for c in module)


def test_a_long_function_is_a_summary_plus_code_windows_all_with_its_range(monkeypatch):
    body = "".join(f"    step_{n} = compute(step_{n - 1}, factor={n})\n" for n in range(1, 80))
    source = 'def long_one(x):\n    """Crunch numbers\n    in many steps."""\n' + body
    monkeypatch.setattr(chunking, "BODY_WINDOWS", 2)  # the rest: full text only
    chunks = chunk_source("calc.py", source, words, window=64)
    assert {(c.start_line, c.end_line, c.symbol) for c in chunks} == {(1, 82, "long_one")}
    assert [c.part for c in chunks] == ["summary", "body", "body"]
    assert chunks[0].text == "def long_one(x)\nCrunch numbers\nin many steps."
    assert chunks[0].header == "calc.py :: def long_one(x) | long one"
    # a body window's header names its definition without the parameters
    assert all(c.header == "calc.py :: def long_one | long one" for c in chunks[1:])
    assert all(sum(words([c.document])) <= 64 - 2 for c in chunks)
    # the first window is the code after the docstring; the rest is full-text only
    assert chunks[1].text.startswith("    step_1 = ")
    embedded = "\n".join(c.text for c in chunks[1:])
    assert all((f"step_{n} =" in embedded) != (f"step_{n} =" in chunks[0].rest)
               for n in range(1, 80))
    assert chunks[0].rest.startswith('def long_one(x):\n    """Crunch numbers')


def test_a_long_definition_s_windows_share_no_line_and_every_one_can_be_embedded(
        monkeypatch):
    # Short lines: the token budget never binds, the line cap does.
    body = "".join(f"    total += item_{n}\n" for n in range(1, 15))
    source = "def add_up(items):\n    total = 0\n" + body + "    return total\n"
    monkeypatch.setattr(chunking, "BODY_WINDOWS", None)
    chunks = chunk_source("sums.py", source, words)
    summary, *windows = chunks
    assert (summary.part, summary.text, summary.rest) == ("summary", "def add_up(items)",
                                                          "def add_up(items):")
    assert all(c.part == "body" and (c.start_line, c.end_line) == (1, 17) for c in windows)
    texts = [c.text.splitlines() for c in windows]
    assert all(len(t) <= WINDOW_LINES for t in texts) and len(texts[0]) == WINDOW_LINES
    assert sum(texts, []) == source.splitlines()[1:]  # each body line once, in order
    # one line more than fits is enough to leave the single chunk
    short = "def f(x):\n" + "".join(f"    x += {n}\n" for n in range(WINDOW_LINES - 1))
    assert [c.part for c in chunk_source("f.py", short, words)] == ["whole"]
    longer = short + "    return x\n"
    assert [c.part for c in chunk_source("f.py", longer, words)][0] == "summary"


def test_a_long_signature_is_cut_in_the_header_and_kept_whole_for_the_full_text_side():
    params = ", ".join(f"option_{n}: Annotated[int, Doc('the option {n}')] = {n}"
                       for n in range(12))
    source = f"def configure({params}):\n" + "".join(f"    use({n})\n" for n in range(9))
    summary, body = chunk_source("app.py", source, words)[:2]
    signature = summary.header.split(" :: ")[1].split(" | ")[0]
    assert len(signature) == chunking.HEADER_SIGNATURE_CHARS
    assert signature.startswith("def configure(option_0: Annotated[int")
    assert "option_11" in summary.rest and "option_11" not in summary.document
    assert body.text.startswith("    use(0)")
    assert body.header == "app.py :: def configure | configure"


def test_every_chunk_fits_the_window_even_an_overlong_line():
    source = "x = [" + ", ".join(str(n) for n in range(3000)) + "]\n" + SOURCE
    chunks = chunk_source("big.py", source, approx_tokens, window=128)
    assert chunks and all(approx_tokens([c.document])[0] <= 128 - 2 for c in chunks)


def test_other_files_and_unparseable_python_are_line_windows():
    text = "\n".join(f"line {n} of the guide" for n in range(400))
    chunks = chunk_source("docs/guide.md", text, words, window=64)
    assert len(chunks) > 5 and all(c.part == "window" and c.symbol == "" for c in chunks)
    assert chunks[1].start_line <= chunks[0].end_line  # overlapping
    assert chunks[-1].end_line == 400
    broken = chunk_source("b.py", "def broken(:\n    pass\n" * 3)
    assert broken and broken[0].part == "window" and broken[0].start_line == 1


def test_blank_files_have_no_chunks():
    assert chunk_source("e.py", "") == []
    assert chunk_source("e.txt", "\n\n  \n") == []


def test_identifiers_are_kept_whole_and_split():
    terms = identifier_terms("def add_route(self, HTTPConnection): parseURL2").split()
    assert {"addroute", "add", "route", "httpconnection", "http", "connection",
            "parseurl2", "parse", "url", "2"} <= set(terms)
    assert identifier_terms("add route") == "add route"
    assert identifier_terms("!!! ... ???") == ""
    assert split_identifier("parse_URLPath") == "parse url path"
    assert split_identifier("__init__") == "init" and split_identifier("_") == ""


def test_standalone_numbers_are_terms_too():
    # a status code in a query meets the same code in the source
    assert identifier_terms("answer 404 when") == "answer 404 when"
    assert "405" in identifier_terms("raise HTTPException(status_code=405)").split()
    # a digit alone, a version or a float part is no term of its own
    assert identifier_terms("x = 1.5 + 3; v2") == "x v2 v 2"


def _row(path, start, end, part="body"):
    return {"path": path, "start_line": start, "end_line": end, "part": part}


def test_results_are_merged_per_definition_in_rank_order():
    rows = [_row("a.py", 1, 50), _row("a.py", 1, 50, "summary"), _row("b.py", 3, 9),
            _row("a.py", 1, 50), _row("c.py", 1, 2)]
    merged = merge_by_definition(rows, 5)
    assert [(r["path"], r["part"]) for r in merged] == [("a.py", "body"), ("b.py", "body"),
                                                        ("c.py", "body")]
    assert len(merge_by_definition(rows, 2)) == 2


def test_fusion_rewards_definitions_both_sides_agree_on():
    vector = [_row("long.py", 1, 90), _row("long.py", 1, 90), _row("long.py", 1, 90),
              _row("both.py", 1, 5), _row("vec.py", 1, 5)]
    text = [_row("txt.py", 1, 5), _row("both.py", 1, 5)]
    fused = fuse_by_definition([vector, text])
    order = [r["path"] for r in fused]
    assert order[0] == "both.py"  # rank 2 and 2 beats rank 1 on one side only
    assert set(order) == {"long.py", "both.py", "vec.py", "txt.py"} and len(order) == 4
    assert fused[0]["_score"] > fused[1]["_score"] > 0
    assert fuse_by_definition([[], []]) == []
    # a weight below 1 lets the other list decide between single-side hits
    weighted = fuse_by_definition([[_row("v.py", 1, 2)], [_row("t.py", 1, 2)]], [1.0, 0.5])
    assert [r["path"] for r in weighted] == ["v.py", "t.py"]


def test_score_fusion_lets_the_lexical_side_break_near_ties_only():
    def scored(path: str, score: float) -> dict:
        return {**_row(path, 1, 5), "_score": score}

    vector = [scored("a.py", 0.60), scored("a.py", 0.59), scored("b.py", 0.58),
              scored("c.py", 0.40)]
    # BM25 scores on their own scale: only their ratio to the list's best counts
    text = [scored("c.py", 30.0), scored("b.py", 24.0), scored("t.py", 12.0)]
    fused = fuse_scores(vector, text, 0.05)
    order = [r["path"] for r in fused]
    assert order == ["b.py", "a.py", "c.py", "t.py"]  # one per definition
    assert fused[0]["_score"] == 0.58 + 0.05 * 24 / 30
    # a far better cosine is not overturned by a strong lexical match
    assert order.index("a.py") < order.index("c.py")
    # a definition only the text list found starts from the lowest fetched cosine
    assert fused[-1]["_score"] == 0.40 + 0.05 * 12 / 30
    # a bigger weight (a query naming an identifier) lets the names decide
    assert [r["path"] for r in fuse_scores(vector, text, 0.4)] == ["b.py", "c.py", "a.py",
                                                                   "t.py"]
    assert fuse_scores([], [], 0.05) == []
    assert [r["path"] for r in fuse_scores(vector, [], 0.05)] == ["a.py", "b.py", "c.py"]
    assert [r["path"] for r in fuse_scores([], text, 0.05)] == ["c.py", "b.py", "t.py"]


def test_a_query_naming_an_identifier_leans_on_the_lexical_side():
    assert text_weight("add_vary_header") == NAME_TEXT_WEIGHT > TEXT_WEIGHT
    assert text_weight("add a value to a header") == TEXT_WEIGHT
    assert text_weight("TrustedHostMiddleware") == text_weight("url_path_for Router")
    assert text_weight("answer a preflight OPTIONS request with JSON") == TEXT_WEIGHT
    assert text_weight("add_vary_header", (0.1, 1.5)) == 1.5
