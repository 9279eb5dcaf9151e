"""Fusing the vector and full-text lists of code search, per definition: by the shape of
each list's scores (standard scores, the default), by score (the cosine plus a weight
times the normalised full-text score, for queries naming an identifier) or by rank (RRF).
"""

from __future__ import annotations

import math
import re

CANDIDATES = 100  # chunks fetched from each side before fusion and merging
RRF_K = 60  # the usual reciprocal-rank-fusion constant
# The lexical list's say in the fusion (its normalised score, beside the cosine). Zero
# for prose, so the hybrid does not run the full-text query for it: with the
# fused-attention vectors, any weight lost sympy queries the vectors had found (0.05: 5
# of 14 at 5, 0.01: 6, none: 7) and won no query at 5 on starlette, FastAPI, httpx or a
# held-out networkx set. A query holding an identifier (snake_case or CamelCase) names
# exactly what it wants: there the words count.
TEXT_WEIGHT = 0.0
NAME_TEXT_WEIGHT = 0.5
RRF_TEXT_WEIGHTS = (0.1, 1.5)  # the same two cases in the "rrf" mode (rank fusion)
# The default fusion ("hybrid", `fuse_shapes`): each list's scores as standard scores over
# its first SHAPE_DEPTH definitions, so a list counts by how far its best stand out from
# the rest for this query, not by one fixed weight: a full-text list whose first place
# towers over the others moves the ranking, a flat one hardly does. The full-text side's
# say beside the vectors': for prose, and for a query naming an identifier. Chosen on
# starlette, httpx and FastAPI (issue 47; recall@1 / @5 0.48 / 0.86 -> 0.55 / 0.88 on
# starlette, 0.56 -> 0.69 at 1 on FastAPI, httpx 0.81 -> 0.75 at 1); weights 0.2-1.0,
# depths 10-100 and per-list gap weights measured no better.
SHAPE_TEXT_WEIGHTS = (0.5, 1.0)
SHAPE_DEPTH = 20
# A class gains this share of the lead its best-scoring method has over it: members that
# match are evidence for the class ("a cache that forgets the least recently used entries"
# ranks LRUCache's methods, then the class); the method keeps its own score, so one asked
# for still comes first.
MEMBER_SHARE = 0.3
# Test files repeat the names and words of the code they test, so on the word side they
# shadow the definition asked for (networkx's `TestDagLongestPath` before
# `dag_longest_path`); the fusion leaves them to the vectors, which still find a test a
# query describes. On networkx recall@1 0.17 -> 0.28, no other set changed (chosen after
# seeing networkx: it is no longer held out for this rule).
_TEST_FILE = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_test\.py$|"
                        r"(^|/)conftest\.py$")


def is_test_file(path: str) -> bool:
    return bool(_TEST_FILE.search(path))
_CODE_NAME = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]|[a-z][A-Z]")


def text_weight(query: str, weights: tuple[float, float] | None = None) -> float:
    """How much the full-text list counts for `query` (see TEXT_WEIGHT): `weights` for
    prose and for a query naming an identifier (default: the score fusion's)."""
    weights = weights or (TEXT_WEIGHT, NAME_TEXT_WEIGHT)
    return weights[1] if _CODE_NAME.search(query) else weights[0]


def fuse_by_definition(ranked_lists: list[list[dict]], weights: list[float] | None = None,
                       k: int = RRF_K) -> list[dict]:
    """Weighted reciprocal-rank fusion per definition: each list is first merged per
    definition (so one long function's windows do not crowd a list), then every definition
    scores sum(weight / (k + rank)) over the lists; the row kept is its best-ranked chunk.
    (The "rrf" mode; the default fuses scores, see `fuse_scores`.)"""
    weights = weights or [1.0] * len(ranked_lists)
    scores: dict[tuple[str, int, int], float] = {}
    best: dict[tuple[str, int, int], tuple[int, dict]] = {}
    for ranked, weight in zip(ranked_lists, weights, strict=True):
        for rank, row in enumerate(merge_by_definition(ranked, len(ranked)), start=1):
            key = (row["path"], row["start_line"], row["end_line"])
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
            if key not in best or rank < best[key][0]:
                best[key] = (rank, row)
    order = sorted(scores, key=lambda key: (-scores[key], best[key][0]))
    return [{**best[key][1], "_score": scores[key]} for key in order]


def fuse_scores(vector_rows: list[dict], text_rows: list[dict],
                text_weight: float) -> list[dict]:
    """Score fusion per definition: its best chunk's cosine plus `text_weight` times its
    best full-text score over the list's top score (so 0..1 whatever the corpus). Rank
    fusion gives the weaker list's first place as much as the stronger one's; here a
    lexical match only moves definitions whose cosines are close, which is what a
    tie-breaker should do. A definition the vector list did not fetch gets that list's
    lowest cosine (its own is no higher)."""
    vectors = merge_by_definition(vector_rows, len(vector_rows))
    texts = merge_by_definition(text_rows, len(text_rows))
    floor = min((float(row["_score"]) for row in vectors), default=0.0)
    top = max((float(row["_score"]) for row in texts), default=0.0)
    scores: dict[tuple[str, int, int], float] = {}
    rows: dict[tuple[str, int, int], dict] = {}
    for row in vectors:
        key = (row["path"], row["start_line"], row["end_line"])
        scores[key], rows[key] = float(row["_score"]), row
    for row in texts if top > 0 else []:
        key = (row["path"], row["start_line"], row["end_line"])
        scores[key] = scores.get(key, floor) + text_weight * float(row["_score"]) / top
        rows.setdefault(key, row)
    order = sorted(scores, key=lambda key: -scores[key])  # stable: vector order on ties
    return [{**rows[key], "_score": scores[key]} for key in order]


def _standard_scores(rows: list[dict], depth: int) -> dict[tuple[str, int, int], float]:
    """Each of the first `depth` definitions' (z) score: (score - mean) / deviation."""
    scores: dict[tuple[str, int, int], float] = {}
    for row in merge_by_definition(rows, depth):
        scores[(row["path"], row["start_line"], row["end_line"])] = float(row["_score"])
    if not scores:
        return {}
    mean = sum(scores.values()) / len(scores)
    deviation = (sum((v - mean) ** 2 for v in scores.values()) / len(scores)) ** 0.5 or 1.0
    return {key: (value - mean) / deviation for key, value in scores.items()}


def fuse_shapes(vector_rows: list[dict], text_rows: list[dict], text_weight: float,
                depth: int = SHAPE_DEPTH, member_share: float = MEMBER_SHARE) -> list[dict]:
    """Per definition: its standard score in the vector list plus `text_weight` times its
    standard score in the full-text list (see SHAPE_TEXT_WEIGHTS); a definition one list
    did not rank gets that list's lowest; test files count by their vectors only
    (`is_test_file`). Then a class gains `member_share` of its best
    member's lead over it (MEMBER_SHARE). The row kept is the vector list's (its best
    chunk), else the full-text list's."""
    text_rows = [row for row in text_rows if not is_test_file(row["path"])]
    vectors = _standard_scores(vector_rows, depth)
    texts = _standard_scores(text_rows, depth)
    rows: dict[tuple[str, int, int], dict] = {}
    for row in [*merge_by_definition(text_rows, depth), *merge_by_definition(vector_rows,
                                                                             depth)]:
        rows[(row["path"], row["start_line"], row["end_line"])] = row
    vector_floor = min(vectors.values(), default=0.0)
    text_floor = min(texts.values(), default=0.0)
    scores = {key: vectors.get(key, vector_floor) + text_weight * texts.get(key, text_floor)
              for key in rows}
    members: dict[tuple[str, str], float] = {}
    for key, row in rows.items():
        if "." in row["symbol"]:
            owner = (row["path"], row["symbol"].rsplit(".", 1)[0])
            members[owner] = max(members.get(owner, scores[key]), scores[key])
    for key, row in rows.items():
        lead = members.get((row["path"], row["symbol"]), scores[key]) - scores[key]
        if row["symbol"] and lead > 0:
            scores[key] += member_share * lead
    order = sorted(scores, key=lambda key: -scores[key])
    # shown as 0..1 (logistic: the order is the same), like the cosines of the vector side
    return [{**rows[key], "_score": 1 / (1 + math.exp(-scores[key]))} for key in order]


def merge_by_definition(rows: list[dict], limit: int) -> list[dict]:
    """One result per definition (path and line range), at its best-ranked chunk, in rank
    order. `rows` are ranked chunks with path, start_line and end_line."""
    seen: set[tuple[str, int, int]] = set()
    merged = []
    for row in rows:
        key = (row["path"], row["start_line"], row["end_line"])
        if key in seen:
            continue
        seen.add(key)
        merged.append(row)
        if len(merged) == limit:
            break
    return merged
