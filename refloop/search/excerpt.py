"""What a code-search hit shows the model: its definition, numbered, within a character
budget. Whatever the budget, the definition's own line (decorators and signature) comes
first, after the lines of its enclosing classes for a method, then the start of its
docstring and the lines that matched the query; the rest of the definition fills what is
left, from the top. Lines left out show as one `...` line, so the numbers say where each
shown line is. Pure functions: the index passes the file's lines in.
"""

from __future__ import annotations

import re

MAX_LINE_CHARS = 200  # a longer line (minified code, data) is cut
SIGNATURE_LINES = 8  # the most lines of a signature shown before the body
DOCSTRING_LINES = 3
_DEF = re.compile(r"\s*(?:async\s+def|def|class)\s+([A-Za-z_][A-Za-z0-9_]*)")
GAP = "..."


def _numbered(number: int, line: str) -> str:
    cut = line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "…"
    return f"{number}\t{cut}"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def owner_lines(lines: list[str], start: int, symbol: str) -> list[int]:
    """1-based lines of the `class` statements enclosing the definition at `start` (outer
    first), found upwards by name and smaller indentation."""
    owners = symbol.split(".")[:-1]
    found: list[int] = []
    below = _indent(lines[start - 1]) if 0 < start <= len(lines) else 0
    number = start - 1
    for owner in reversed(owners):
        while number >= 1:
            line = lines[number - 1]
            match = _DEF.match(line)
            if (match and match.group(1) == owner and line.lstrip().startswith("class")
                    and _indent(line) < below):
                found.append(number)
                below = _indent(line)
                number -= 1
                break
            number -= 1
        else:
            break
    return found[::-1]


def signature_lines(lines: list[str], start: int, end: int) -> list[int]:
    """The decorators and the `def`/`class` statement up to its colon (at most
    SIGNATURE_LINES lines past the keyword's line)."""
    numbers = []
    number = start
    while number <= end and not _DEF.match(lines[number - 1]):
        numbers.append(number)  # decorators
        number += 1
    first = number
    depth = 0
    while number <= min(end, first + SIGNATURE_LINES):
        numbers.append(number)
        code = lines[number - 1].split("#", 1)[0]
        depth += code.count("(") + code.count("[") - code.count(")") - code.count("]")
        if depth <= 0 and code.rstrip().endswith(":"):
            break
        number += 1
    return numbers


def _docstring_lines(lines: list[str], after: int, end: int) -> list[int]:
    """The first DOCSTRING_LINES lines of a docstring starting right after line `after`."""
    if after + 1 > end or not lines[after].lstrip().startswith(('"""', "'''", 'r"""', "r'''")):
        return []
    return list(range(after + 1, min(end, after + DOCSTRING_LINES) + 1))


def matched_lines(lines: list[str], start: int, end: int, chunk_text: str) -> list[int]:
    """Where the matched chunk's lines are in the definition (its first non-blank line
    found, then as many lines as the chunk has)."""
    chunk = [line for line in chunk_text.splitlines() if line.strip()]
    if not chunk:
        return []
    for number in range(start, end + 1):
        if lines[number - 1] == chunk[0]:
            return [n for n in range(number, min(end, number + len(chunk) * 2) + 1)
                    if lines[n - 1].strip()][: len(chunk)]
    return []


def excerpt(lines: list[str], start: int, end: int, symbol: str, chunk_text: str,
            budget: int) -> str:
    """The definition at `start`..`end` of `lines` (1-based, inclusive) in at most about
    `budget` characters, numbered; see the module's docstring for what comes first."""
    end = min(end, len(lines))
    if start > end:
        return ""
    owners = owner_lines(lines, start, symbol) if "." in symbol else []
    signature = signature_lines(lines, start, end) if symbol else []
    after = signature[-1] if signature else start - 1
    wanted = [*owners, *signature, *_docstring_lines(lines, after, end),
              *matched_lines(lines, start, end, chunk_text)]
    kept: list[int] = []
    used = 0

    def take(number: int, force: bool = False) -> bool:
        nonlocal used
        if number in kept:
            return True
        cost = len(_numbered(number, lines[number - 1])) + 1
        if not force and used + cost > budget:
            return False
        kept.append(number)
        used += cost
        return True

    for number in [*owners, *signature]:  # never left out
        take(number, force=True)
    for number in wanted:
        if not take(number):
            break
    for number in range(start, end + 1):  # then the rest, top down, while it fits
        if lines[number - 1].strip() and not take(number):
            break
    kept.sort()
    out: list[str] = []
    previous = None
    for number in kept:
        if previous is not None and number > previous + 1 and any(
                lines[n - 1].strip() for n in range(previous + 1, number)):
            out.append(GAP)
        out.append(_numbered(number, lines[number - 1]))
        previous = number
    if kept and kept[-1] < end and any(lines[n - 1].strip() for n in range(kept[-1] + 1,
                                                                           end + 1)):
        out.append(GAP)
    return "\n".join(out)
