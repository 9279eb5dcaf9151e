"""Tool-result feedback: long outputs are windowed around the task's
keywords instead of cut at the head, with markers saying which lines were left out."""

from __future__ import annotations

import re

from refloop.contract.tool_properties import ToolProperties

CONTEXT_LINES = 3
MAX_KEYWORDS = 12
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}|[\u4e00-\u9fff]{2,}")
_STOPWORDS = frozenset((
    "the", "and", "for", "with", "that", "this", "from", "into", "over", "then", "than", "when",
    "what", "where", "which", "while", "will", "would", "should", "could", "have", "has", "had",
    "are", "was", "were", "been", "being", "you", "your", "our", "their", "them", "they", "its",
    "it's", "not", "but", "all", "any", "each", "every", "some", "more", "most", "less", "such",
    "only", "also", "just", "very", "can", "may", "must", "file", "files", "code", "make",
    "write", "read", "find", "show", "list", "use", "using", "used", "add", "update", "fix",
    "change", "please", "task", "step", "steps", "about", "after", "before", "there", "here",
    "how", "why", "who", "whom", "does", "did", "done", "out", "get", "set",
))


def task_keywords(task: str) -> list[str]:
    """Distinctive words of the task, in order of first appearance, lower-cased."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(task):
        lowered = word.lower()
        if lowered not in _STOPWORDS:
            seen.setdefault(lowered, None)
    return list(seen)[:MAX_KEYWORDS]


def tool_feedback(output: str, properties: ToolProperties, keywords: list[str],
                  limit: int) -> str:
    """What the model reads of a tool's output. A `windowed` tool's output is a listing
    whose relevant part can be anywhere: windowed around the keywords. Any other output is
    left whole here; the workflow cuts it at the end."""
    return window_text(output, keywords, limit) if properties.windowed else output


def window_text(text: str, keywords: list[str], limit: int) -> str:
    """`text` if it fits in `limit` characters; else the head and the tail, plus the
    lines around keyword hits (best-scoring first), in order with omission markers."""
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    pattern = _keyword_pattern(keywords)
    scores = [len(set(pattern.findall(line.lower()))) if pattern else 0 for line in lines]
    keep: set[int] = set()
    budget = limit - 200  # room for the markers

    def take(first: int, last: int) -> bool:
        nonlocal budget
        new = [i for i in range(max(first, 0), min(last, len(lines) - 1) + 1) if i not in keep]
        cost = sum(len(lines[i]) + 1 for i in new)
        if first - 1 not in keep:  # a new region costs a marker line
            cost += 60
        if cost > budget:
            return False
        keep.update(new)
        budget -= cost
        return True

    take(0, CONTEXT_LINES * 2)  # the head: a header, the first lines of a file
    take(len(lines) - CONTEXT_LINES * 2, len(lines) - 1)  # the tail: a command's verdict
    hits = sorted((i for i, score in enumerate(scores) if score), key=lambda i: (-scores[i], i))
    for index in hits:
        take(index - CONTEXT_LINES, index + CONTEXT_LINES)
    # Spend what is left from the top down, so a keyword-free output shows its start.
    for index in range(len(lines)):
        if index not in keep and not take(index, index):
            break
    if not keep:  # one huge line: nothing to window
        cut = limit - 80
        return f"{text[:cut]}\n[... {len(text) - cut} characters left out ...]"
    return _render(lines, sorted(keep), keywords)


def _keyword_pattern(keywords: list[str]) -> re.Pattern[str] | None:
    if not keywords:
        return None
    return re.compile("|".join(re.escape(k.lower()) for k in keywords))


def _render(lines: list[str], kept: list[int], keywords: list[str]) -> str:
    out: list[str] = []
    previous = -1
    for index in kept:
        if index > previous + 1:
            out.append(_marker(previous + 1, index - 1))
        out.append(lines[index])
        previous = index
    if previous < len(lines) - 1:
        out.append(_marker(previous + 1, len(lines) - 1))
    out.append(f"[windowed around: {', '.join(keywords) or '(no keywords)'}; "
               f"{len(lines) - len(kept)} of {len(lines)} lines left out]")
    return "\n".join(out)


def _marker(first: int, last: int) -> str:
    count = last - first + 1
    return (f"[... {count} line{'s' if count > 1 else ''} left out "
            f"(output lines {first + 1}-{last + 1}) ...]")
