"""Chunks an embedding model reads whole, each mapped back to the definition it came from.

Every Python class and function is one unit, reported with its whole line range. A short
unit (up to WINDOW_LINES lines) is one chunk (and its docstring alone, a second). A longer
one embeds a summary (signature and docstring) and windows of WINDOW_LINES lines of its
code after the docstring, sharing no line (BODY_WINDOWS of them; by default all); what no
chunk embeds (a signature's lines, the docstring's, windows left out) is searched by its
words only (`CodeChunk.rest`, the summary row's full-text column), so the lexical side
covers whole definitions. Small windows because the model mean-pools its tokens: over a
whole function the part a query describes is blurred by the rest. The model's cost is per
token, and on library code most tokens were in windows sharing half their lines and in
headers repeating long signatures: this shape embeds 53% of the tokens of the earlier one
on starlette, 19% on FastAPI. A class's own text keeps its header, docstring, attributes
and the signatures of its methods; each method is a unit of its own. Every chunk starts
with its symbol path (file, classes, the signature's start, the names split into words);
a body window's names its definition without the parameters.
Module-level code, other languages and text files are cut into line windows of the token
budget.

Pure functions (no model here): token counts come from a `TokenCounter`, the real model's
tokenizer in the semantic index, a character estimate without it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

TokenCounter = Callable[[list[str]], list[int]]  # tokens of each text, specials excluded
MODEL_WINDOW = 256  # all-MiniLM-L6-v2's max_seq_length
SPECIAL_TOKENS = 2  # [CLS] and [SEP]
MARGIN = 4  # per-line counts can differ slightly from the joined text's
WINDOW_LINES = 6  # the most lines one chunk of a definition embeds (within the tokens too)
WINDOW_STEP = WINDOW_LINES  # consecutive windows of a definition share no line
# A long definition embeds its summary (signature and docstring) and the first BODY_WINDOWS
# windows of its code; the rest of it is full-text only (`CodeChunk.rest`). None: every
# window (kept: on starlette the first window alone found 35 of 42 definitions in the top
# 5, the first two 36, all 37, for 66%, 79% and 100% of the tokens).
BODY_WINDOWS: int | None = None
SUMMARY_TOKENS = 128  # the most of a docstring a summary embeds
# The signature in a whole definition's and a summary's header, cut to this many
# characters: a long one (FastAPI's run to hundreds of characters of annotations) was half
# of all the tokens embedded. A body window's header keeps its name only: its parameters
# were 10% of FastAPI's tokens, and on sympy the name alone found as much.
HEADER_SIGNATURE_CHARS = 60
OVERLAP_LINES = 2  # other windows (token-sized) share a little context
MAX_SIGNATURE_CHARS = 200
MODULE = ""  # the symbol of module-level code and text windows


def approx_tokens(texts: list[str]) -> list[int]:
    """About four characters per token, when no tokenizer is at hand."""
    return [(len(text) + 3) // 4 for text in texts]


@dataclass(frozen=True)
class CodeChunk:
    start_line: int  # the unit's whole range, 1-based inclusive
    end_line: int
    symbol: str  # qualified name ("Config.get"); MODULE for windows
    header: str  # the symbol path the embedded document starts with
    text: str  # the source this chunk embeds
    part: str  # "whole", "summary", "body" or "window"
    rest: str = ""  # the unit's text that no chunk embeds: searched by its words only

    @property
    def document(self) -> str:
        return f"{self.header}\n{self.text}"


@dataclass(frozen=True)
class _Unit:
    symbol: str
    start_line: int
    end_line: int
    signature: str  # "class Config" / "def get(self, key, cast=None)"
    docstring: str
    own_lines: tuple[int, ...]  # 1-based line numbers of the unit's own text
    body_start: int  # the first line after the signature and the docstring


def chunk_source(path: str, text: str, count_tokens: TokenCounter = approx_tokens,
                 window: int = MODEL_WINDOW) -> list[CodeChunk]:
    """The chunks of one file; every document fits `window` tokens as `count_tokens` sees
    them."""
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        return []
    budget = window - SPECIAL_TOKENS - MARGIN
    costs = count_tokens(lines)
    units = _python_units(text, lines) if path.endswith((".py", ".pyi")) else None
    if not units:
        return list(_windows(path, lines, costs, range(1, len(lines) + 1), path, budget,
                             count_tokens))
    chunks: list[CodeChunk] = []
    covered: set[int] = set()
    for unit in units:
        if "." not in unit.symbol:
            covered.update(range(unit.start_line, unit.end_line + 1))
        chunks += _unit_chunks(path, unit, lines, costs, budget, count_tokens)
    module = [n for n in range(1, len(lines) + 1) if n not in covered]
    for run in _runs(module):
        chunks += _windows(path, lines, costs, run, path, budget, count_tokens)
    chunks.sort(key=lambda c: (c.start_line, c.end_line))
    return chunks


# ---------------------------------------------------------------- Python units


def _python_units(text: str, lines: list[str]) -> list[_Unit] | None:
    """Classes and functions, methods as units of their own; None if unparseable."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    units: list[_Unit] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            qualified = f"{prefix}{node.name}"
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            end = node.end_lineno or node.lineno
            own = set(range(start, end + 1))
            if isinstance(node, ast.ClassDef):
                for child in node.body:  # a member keeps only its def line here
                    if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                        first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                        own -= set(range(first, (child.end_lineno or child.lineno) + 1))
                        own.add(child.lineno)
            docstring = ast.get_docstring(node) or ""
            units.append(_Unit(qualified, start, end, _signature(lines, node), docstring,
                               tuple(sorted(own)), _body_start(node, bool(docstring), end)))
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{qualified}.")

    visit(tree.body, "")
    return units


def _body_start(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef,
                has_docstring: bool, end: int) -> int:
    if not node.body:
        return end + 1
    first = node.body[0]
    if has_docstring:
        return (first.end_lineno or first.lineno) + 1
    return first.lineno


def _signature(lines: list[str], node: ast.AST) -> str:
    """The def/class line(s) up to the body, whitespace collapsed."""
    first = node.lineno
    body_line = node.body[0].lineno if node.body else first
    last = max(first, body_line - 1)
    joined = " ".join(line.strip() for line in lines[first - 1 : last])
    joined = re.sub(r"\s+", " ", joined).rstrip(":")
    if len(joined) > MAX_SIGNATURE_CHARS:
        joined = joined[:MAX_SIGNATURE_CHARS] + "…"
    return joined


def _header(path: str, unit: _Unit, name_only: bool = False) -> str:
    """`path :: class Outer :: def read_all(self, limit`: file, enclosing classes and the
    signature's start (with `name_only`, up to its parameters: `:: def read_all`); then
    the names split into words (`UploadFile.read_all` -> upload file read all), which the
    model's word-piece vocabulary reads far better than CamelCase."""
    owners = unit.symbol.split(".")[:-1]
    cut = unit.signature.split("(", 1)[0] if name_only else unit.signature[:HEADER_SIGNATURE_CHARS]
    signature = [cut] if HEADER_SIGNATURE_CHARS else []
    header = " :: ".join([path, *(f"class {owner}" for owner in owners), *signature])
    words = " ".join(split_identifier(name) for name in unit.symbol.split("."))
    return f"{header} | {words}" if words else header


def _unit_chunks(path: str, unit: _Unit, lines: list[str], costs: list[int], budget: int,
                 count_tokens: TokenCounter) -> list[CodeChunk]:
    header = _header(path, unit)
    room = budget - count_tokens([header])[0]
    own = [n for n in unit.own_lines if lines[n - 1].strip()]
    if len(own) <= WINDOW_LINES and sum(costs[n - 1] for n in own) <= room:
        chunks = [CodeChunk(unit.start_line, unit.end_line, unit.symbol, header,
                            "\n".join(lines[n - 1] for n in own), "whole")]
        if unit.docstring:  # the prose alone, undiluted by code, matches prose queries
            summary = _fit(f"{unit.signature}\n{unit.docstring}",
                           min(room, SUMMARY_TOKENS), count_tokens)
            chunks.append(CodeChunk(unit.start_line, unit.end_line, unit.symbol, header,
                                    summary, "summary"))
        return chunks
    code = [n for n in own if n >= unit.body_start]
    windows = list(_pack(lines, costs, code, room, count_tokens, WINDOW_LINES))
    embedded = windows if BODY_WINDOWS is None else windows[:BODY_WINDOWS]
    seen = {n for first, last, _ in embedded for n in code if first <= n <= last}
    rest = "\n".join(lines[n - 1] for n in own if n not in seen)
    summary = _fit(f"{unit.signature}\n{unit.docstring}".strip(), min(room, SUMMARY_TOKENS),
                   count_tokens)
    chunks = [CodeChunk(unit.start_line, unit.end_line, unit.symbol, header, summary,
                        "summary", rest)]
    body_header = _header(path, unit, name_only=True)
    for body in embedded:
        chunks.append(CodeChunk(unit.start_line, unit.end_line, unit.symbol, body_header,
                                body[2], "body"))
    return chunks


# ---------------------------------------------------------------- windows


def _windows(path: str, lines: list[str], costs: list[int], numbers: range | list[int],
             header: str, budget: int, count_tokens: TokenCounter) -> Iterator[CodeChunk]:
    """Line windows over `numbers` (blank lines skipped), each reported with its own
    range."""
    room = budget - count_tokens([header])[0]
    own = [n for n in numbers if lines[n - 1].strip()]
    for first, last, text in _pack(lines, costs, own, room, count_tokens):
        yield CodeChunk(first, last, MODULE, header, text, "window")


def _pack(lines: list[str], costs: list[int], numbers: list[int], room: int,
          count_tokens: TokenCounter, max_lines: int | None = None
          ) -> Iterator[tuple[int, int, str]]:
    """Windows of whole lines within `room` tokens: with `max_lines`, of up to that many
    lines, each starting WINDOW_STEP lines after the last; else as many lines as fit,
    sharing OVERLAP_LINES. A single line too long for a window is cut."""
    room = max(room, 16)
    i = 0
    while i < len(numbers):
        taken: list[int] = []
        used = 0
        j = i
        while (j < len(numbers) and len(taken) < (max_lines or len(numbers))
               and used + costs[numbers[j] - 1] <= room):
            used += costs[numbers[j] - 1]
            taken.append(numbers[j])
            j += 1
        if not taken:  # one overlong line
            number = numbers[i]
            yield number, number, _fit(lines[number - 1], room, count_tokens)
            i += 1
            continue
        yield taken[0], taken[-1], "\n".join(lines[n - 1] for n in taken)
        if j >= len(numbers):
            break
        if max_lines:
            i += max(1, len(taken) * WINDOW_STEP // max_lines)
        else:
            i = max(i + 1, j - OVERLAP_LINES)


def _fit(text: str, room: int, count_tokens: TokenCounter) -> str:
    """`text` cut (by characters) until it fits `room` tokens."""
    while text and count_tokens([text])[0] > room:
        text = text[: max(1, int(len(text) * 0.8))]
    return text


def _runs(numbers: list[int]) -> Iterator[list[int]]:
    """Consecutive stretches of line numbers."""
    run: list[int] = []
    for number in numbers:
        if run and number != run[-1] + 1:
            yield run
            run = []
        run.append(number)
    if run:
        yield run


# ---------------------------------------------------------------- lexical side

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# identifiers, and numbers of two digits or more standing alone (not "v2", not "1.5")
_TERM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|(?<![A-Za-z0-9_.])[0-9]{2,}(?![A-Za-z0-9_.])")
_CAMEL_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def split_identifier(word: str) -> str:
    """`parse_URLPath` -> "parse url path"; underscores-only names give ""."""
    return " ".join(p.lower() for piece in word.split("_") for p in _CAMEL_PART.findall(piece))


def identifier_terms(text: str) -> str:
    """Text for the full-text index: every identifier kept whole (underscores dropped, so
    a word tokenizer keeps it as one term) and split into its snake_case/CamelCase parts;
    numbers of two digits or more as they are (`404`, `status_code=404`).
    Queries go through the same function, so `add_route`, `addRoute` and "add route" meet."""
    terms: list[str] = []
    for match in _TERM.finditer(text):
        word = match.group(0)
        if word.isdigit():  # status codes, ports, limits: "404" means something
            terms.append(word)
            continue
        parts = split_identifier(word).split()
        whole = word.replace("_", "").lower()
        if len(parts) > 1 and whole:
            terms.append(whole)
        terms.extend(parts)
    return " ".join(terms)
