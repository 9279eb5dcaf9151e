"""What an indexing pass has not stored yet, and a plain word scan over those files.

A pass writes, after every batch, the files it still has to store (`<table>.pending.json`);
a search reads it to say which part of the workspace its ranked hits do not cover, and
scans those files for the query's words, so a search during the first pass of a large
workspace answers at once (lexical hits first, vectors as they come). The scan stops at a
time budget; the note says how far it got. Before any pass has written its list (no index
yet), every source file is pending.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from refloop.search.chunks import identifier_terms
from refloop.search.symbols import read_source

SCAN_BUDGET_S = 1.5  # the most a search spends reading files the index does not hold yet
SCAN_HIT_LINES = 40  # the most lines of a block a scan hit shows
NOTE_PATHS = 5  # pending files named in a note
_BLOCK_START = re.compile(
    r"^\s*(?:export\s+)?(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?"
    r"(?:def|class|function|func|fn|struct|interface|trait|impl|enum|module)\b")
_SHORT = 3  # query words shorter than this match inside too many identifiers
# Words of a question that say nothing about the code (they are everywhere in prose).
_STOP = """a an and are as at be by can for from how in into is it its of on or that the
their then this to was what when where which who why with without does do not but any all
each every some has have had will would should could"""
STOP_WORDS = frozenset(_STOP.split())


@dataclass(frozen=True)
class Pending:
    """The files a pass has yet to store, out of `total` source files."""

    files: tuple[str, ...]
    total: int


def write_pending(path: Path, files: list[str], total: int) -> None:
    """Atomically (a reader never sees half a list)."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"files": files, "total": total}))
    os.replace(temporary, path)


def read_pending(path: Path) -> Pending | None:
    """The last list a pass wrote, or None when no pass is under way (or it finished)."""
    try:
        data = json.loads(path.read_text())
        return Pending(tuple(data["files"]), int(data["total"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def scan_terms(query: str) -> list[str]:
    """The query's words as the full-text side sees them (identifiers split and joined),
    lower case, question words out, a plain English ending cut (a substring then matches
    "hashed passwords" in `hash_password`, as the stemmed full-text side would)."""
    seen: dict[str, None] = {}
    for term in identifier_terms(query).lower().split():
        if len(term) >= _SHORT and term not in STOP_WORDS:
            seen.setdefault(_stem(term))
    return list(seen)


def _stem(word: str) -> str:
    for ending, shortest in (("ing", 6), ("ed", 5), ("s", 4)):
        if word.endswith(ending) and len(word) >= shortest and not word.endswith("ss"):
            return word[: -len(ending)]
    return word


@dataclass(frozen=True)
class ScanHit:
    path: str
    start_line: int
    end_line: int
    text: str
    score: float  # the share of the query's words the block holds, 0..1


def scan_files(workspace: Path, paths: list[str] | tuple[str, ...], query: str, limit: int,
               budget_s: float = SCAN_BUDGET_S) -> tuple[list[ScanHit], int]:
    """The blocks (a definition up to the next one, or the file's head) of `paths` holding
    the most of the query's words, best first; and how many files were read before the
    budget ran out."""
    terms = scan_terms(query)
    if not terms:
        return [], len(paths)
    any_term = re.compile("|".join(re.escape(term) for term in terms), re.IGNORECASE)
    deadline = time.monotonic() + budget_s
    hits: list[ScanHit] = []
    read = 0
    for relative in paths:
        if time.monotonic() > deadline:
            break
        read += 1
        text = read_source(workspace / relative)
        if not text or not any_term.search(text):
            continue
        hits += _blocks(relative, text.splitlines(), terms, any_term)
    hits.sort(key=lambda hit: (-hit.score, hit.path, hit.start_line))
    return hits[:limit], read


def _blocks(relative: str, lines: list[str], terms: list[str], any_term: re.Pattern
            ) -> list[ScanHit]:
    starts = [0] + [i for i, line in enumerate(lines) if i and _BLOCK_START.match(line)]
    found = []
    for number, first in enumerate(starts):
        last = (starts[number + 1] if number + 1 < len(starts) else len(lines)) - 1
        block = "\n".join(lines[first : last + 1])
        if not any_term.search(block):
            continue
        lowered = block.lower()
        share = sum(term in lowered for term in terms) / len(terms)
        shown = lines[first : min(last + 1, first + SCAN_HIT_LINES)]
        found.append(ScanHit(relative, first + 1, last + 1, "\n".join(shown), round(share, 4)))
    return found


def scan_slots(limit: int, pending: Pending, indexed: int, scanned: int) -> int:
    """How many of `limit` places go to word-scan hits: the share of files not indexed
    (at least one), and whatever the other side cannot fill."""
    share = len(pending.files) / max(pending.total, 1)
    slots = min(limit, max(1, round(limit * share)))
    slots = max(slots, limit - indexed)  # the index has fewer hits than its places
    return min(slots, scanned)


def pending_note(pending: Pending, read: int, running: bool = True) -> str:
    """What a partial answer does not cover, for the model to read; `running`: whether a
    pass is storing files now (else the last one stopped, killed, before it finished)."""
    stored = pending.total - len(pending.files)
    names = ", ".join(pending.files[:NOTE_PATHS])
    more = f" and {len(pending.files) - NOTE_PATHS} more" if len(pending.files) > NOTE_PATHS \
        else ""
    scanned = ("all of them were scanned for the query's words" if read >= len(pending.files)
               else f"{read} of them were scanned for the query's words before the time "
                    "budget ran out")
    state = ("indexing runs in the background" if running else
             "the last indexing pass stopped before it finished; the next one resumes it")
    return (f"partial: the index holds {stored} of {pending.total} files so far ({state}); "
            f"not yet indexed: {names}{more}; {scanned} (those hits are marked unindexed)")
