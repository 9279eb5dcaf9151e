"""Definition-level evaluation of code search on third-party code (starlette as installed):
search_semantic's modes beside BM25 (rank-bm25) and grep, on the same chunks, in one run.

A query is answered at rank r when the r-th result *is* one of its labelled definitions
(same file, same first line): a class does not count for one of its methods, nor a window
for the function around it. Shared by bench/bench_code_search.py (the full corpus) and
tests/semantic/test_code_search_eval.py (the small one).
"""

from __future__ import annotations

import ast
import re
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from refloop.search.chunks import chunk_source, identifier_terms
from refloop.search.fusion import merge_by_definition
from refloop.search.index import CodeIndex

QUERIES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / \
    "code_search_queries.yaml"
_STOP = """a an and are as at be by for from in into is it its of on or that the their this
to when with without which what how where does do so else until then than once own every
some each any has have not but"""
STOP_WORDS = frozenset(_STOP.split())
# query -> ranked (path, start_line), or per ranked hit the definitions it shows
Ranker = Callable[[str], list[tuple[str, int]] | list[list[tuple[str, int]]]]


@dataclass
class Query:
    text: str
    path: str
    symbols: list[str]
    small: bool
    expected: set[tuple[str, int]] = field(default_factory=set)


@dataclass
class Scores:
    recall_at_1: float
    recall_at_5: float
    mrr: float
    misses: list[str]
    ranks: list[int | None] = field(default_factory=list)  # per query, None: not in the top


def paired(first: Scores, second: Scores, depth: int = 5) -> tuple[int, int, int]:
    """Queries `first` finds in its top `depth` and `second` does not (wins), the reverse
    (losses), and the rest (ties), over the same queries."""
    def found(rank: int | None) -> bool:
        return rank is not None and rank <= depth

    wins = sum(found(a) and not found(b) for a, b in zip(first.ranks, second.ranks, strict=True))
    losses = sum(found(b) and not found(a) for a, b in zip(first.ranks, second.ranks,
                                                           strict=True))
    return wins, losses, len(first.ranks) - wins - losses


def load_queries(small: bool, names: bool = False,
                 path: Path = QUERIES) -> tuple[str, list[str], list[Query]]:
    """The behaviour queries (or, with `names`, the name queries) of a query file."""
    spec = yaml.safe_load(path.read_text())
    queries = [Query(q["q"], q["path"], q["symbols"], q.get("small", False))
               for q in spec.get("name_queries" if names else "queries", [])]
    if small:
        queries = [q for q in queries if q.small]
    return spec["package"], spec["small_corpus"], queries


def copy_corpus(package: str, files: list[str] | None, target: Path) -> Path:
    """The installed package's sources (or the listed subset) copied to `target`."""
    source = Path(__import__(package).__file__).parent
    if files is None:
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        for relative in files:
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / relative, target / relative)
    return target


def definition_lines(path: Path) -> dict[str, list[int]]:
    """Qualified name -> first lines (decorators included; overloads give several)."""
    found: dict[str, list[int]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{node.name}"
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found.setdefault(name, []).append(start)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{name}.")

    visit(ast.parse(path.read_text()).body, "")
    return found


def definition_starts(path: Path) -> list[tuple[int, int]]:
    """Every definition's first line (decorators included) and its `def`/`class` line."""
    return [(min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.lineno)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]


def resolve(queries: list[Query], corpus: Path) -> None:
    """Each label's (path, first line); a label that no longer exists is an error."""
    for query in queries:
        lines = definition_lines(corpus / query.path)
        for symbol in query.symbols:
            if symbol not in lines:
                raise ValueError(f"label {query.path}:{symbol} not found in this version")
            query.expected |= {(query.path, line) for line in lines[symbol]}


def score(ranker: Ranker, queries: list[Query], depth: int = 10) -> Scores:
    top1 = top5 = 0
    reciprocal = 0.0
    misses = []
    ranks = []
    for query in queries:
        ranked = ranker(query.text)[:depth]
        rank = next((i for i, hit in enumerate(ranked, 1)
                     if (set(hit) if isinstance(hit, list) else {hit}) & query.expected), None)
        top1 += rank == 1
        top5 += rank is not None and rank <= 5
        reciprocal += 1 / rank if rank else 0.0
        ranks.append(rank)
        if rank is None or rank > 5:
            misses.append(f"{query.text!r} (rank {rank or '>' + str(depth)})")
    n = len(queries)
    return Scores(top1 / n, top5 / n, reciprocal / n, misses, ranks)


# ---------------------------------------------------------------- rankers


def index_ranker(index: CodeIndex, mode: str) -> Ranker:
    def rank(query: str) -> list[tuple[str, int]]:
        return [(hit.path, hit.start_line) for hit in index.search(query, 10, mode=mode)]
    return rank


_HIT_HEADER = re.compile(r"^(\S+):(\d+)-(\d+) \((?:score|unindexed, word match) [-0-9.]+\)$")
_SHOWN_LINE = re.compile(r"^(\d+)\t")


def output_hits(output: str) -> list[tuple[str, int, int, set[int]]]:
    """The hits of search_semantic's output, in order: path, range, and the line numbers
    its excerpt shows (a word-scan hit shows its first lines unnumbered)."""
    hits: list[tuple[str, int, int, set[int]]] = []
    for line in output.splitlines():
        header = _HIT_HEADER.match(line)
        if header:
            path, start, end = header.group(1), int(header.group(2)), int(header.group(3))
            hits.append((path, start, end, set()))
            continue
        if not hits:
            continue
        shown = _SHOWN_LINE.match(line)
        path, start, end, lines = hits[-1]
        if shown:
            lines.add(int(shown.group(1)))
        elif line and line != "...":  # unnumbered: the next line of the range
            lines.add(start + len(lines))
    return hits


def tool_ranker(index: CodeIndex, corpus: Path, limit: int = 5) -> Ranker:
    """search_semantic as the model reads it: the tool's own output of `index.answer`,
    parsed back. A hit answers a labelled definition when its range holds the definition's
    first line and its excerpt shows the `def`/`class` line: each shown definition
    counts as the hit's (path, first line), so `score` checks it like any ranker."""
    from refloop.tools.semantic_search import HITS_CHARS, answer_output

    definitions: dict[str, list[tuple[int, int]]] = {}

    def shown(path: str, start: int, end: int, numbers: set[int]) -> list[tuple[str, int]]:
        if path not in definitions:
            definitions[path] = definition_starts(corpus / path)
        return [(path, first) for first, keyword in definitions[path]
                if start <= first <= end and keyword in numbers]

    def rank(query: str) -> list[list[tuple[str, int]]]:
        answer = index.answer(query, limit, HITS_CHARS)
        return [shown(*hit) for hit in output_hits(answer_output(answer))]
    return rank


@dataclass
class Unit:
    path: str
    start_line: int
    end_line: int
    text: str  # the unit's header and its whole text (embedded or full-text only)


def corpus_units(corpus: Path, count_tokens) -> tuple[list[dict], list[Unit]]:
    """The index's chunks (same chunker, same tokenizer) and their definition units."""
    chunks: list[dict] = []
    units: dict[tuple[str, int, int], list[str]] = {}
    for path in sorted(corpus.rglob("*.py")):
        relative = path.relative_to(corpus).as_posix()
        for chunk in chunk_source(relative, path.read_text(), count_tokens):
            chunks.append({"path": relative, "start_line": chunk.start_line,
                           "end_line": chunk.end_line, "document": chunk.document})
            texts = units.setdefault((relative, chunk.start_line, chunk.end_line),
                                     [chunk.header])
            texts += [chunk.text, chunk.rest]
    return chunks, [Unit(p, s, e, "\n".join(texts)) for (p, s, e), texts in units.items()]


def bm25_ranker(chunks: list[dict]) -> Ranker:
    """rank-bm25 (Okapi) over the same chunks with the same identifier-split terms,
    merged per definition like search_semantic."""
    from rank_bm25 import BM25Okapi

    model = BM25Okapi([identifier_terms(c["document"]).split() for c in chunks])

    def rank(query: str) -> list[tuple[str, int]]:
        scores = model.get_scores(identifier_terms(query).split())
        order = sorted(range(len(chunks)), key=lambda i: -scores[i])
        merged = merge_by_definition([chunks[i] for i in order[:200]], 10)
        return [(row["path"], row["start_line"]) for row in merged]
    return rank


def bm25_definitions_ranker(units: list[Unit]) -> Ranker:
    """rank-bm25 (Okapi) over whole definitions (each unit's header and all its text), with
    the same identifier-split terms: the plain lexical baseline."""
    from rank_bm25 import BM25Okapi

    model = BM25Okapi([identifier_terms(unit.text).split() for unit in units])

    def rank(query: str) -> list[tuple[str, int]]:
        scores = model.get_scores(identifier_terms(query).split())
        order = sorted(range(len(units)), key=lambda i: -scores[i])[:10]
        return [(units[i].path, units[i].start_line) for i in order]
    return rank


def query_words(query: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", query.lower())
            if len(w) > 2 and w not in STOP_WORDS]


def grep_ranker(units: list[Unit]) -> Ranker:
    """What an agent does with grep: count the query's words (case-insensitive
    substrings) in each definition, most matches first."""
    lowered = [unit.text.lower() for unit in units]

    def rank(query: str) -> list[tuple[str, int]]:
        words = query_words(query)
        counts = [sum(text.count(w) for w in words) for text in lowered]
        order = sorted((i for i in range(len(units)) if counts[i]), key=lambda i: -counts[i])
        return [(units[i].path, units[i].start_line) for i in order[:10]]
    return rank


def latencies(ranker: Ranker, queries: list[Query], repeats: int) -> tuple[float, float]:
    """p50 and p95 in milliseconds."""
    times = []
    for _ in range(repeats):
        for query in queries:
            began = time.perf_counter()
            ranker(query.text)
            times.append((time.perf_counter() - began) * 1000)
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)]
