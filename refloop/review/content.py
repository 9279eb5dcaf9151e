"""Splitting and capping what a code review looks at (pure; used by the load activity)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from refloop.contract.code_review import ReviewContent

_DIFF_FILE = re.compile(r"^\+\+\+ (?:b/)?(.+)$")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def split_diff(diff: str) -> tuple[dict[str, str], dict[str, list[int]]]:
    """Per file: its diff text, and the new-file line numbers the hunks show."""
    texts: dict[str, list[str]] = {}
    lines: dict[str, list[int]] = {}
    current, number = None, 0
    for line in diff.splitlines():
        match = _DIFF_FILE.match(line)
        if match:
            current = match.group(1).strip()
            texts.setdefault(current, [])
            lines.setdefault(current, [])
        if current is None:
            continue
        texts[current].append(line)
        hunk = _HUNK.match(line)
        if hunk:
            number = int(hunk.group(1))
        elif line.startswith(("+", " ")) and not line.startswith("+++") and number:
            lines[current].append(number)
            number += 1
    return {k: "\n".join(v) for k, v in texts.items()}, lines


def line_spans(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted line numbers as runs of consecutive lines (first, last)."""
    spans: list[tuple[int, int]] = []
    for number in sorted(set(numbers)):
        if spans and number == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], number)
        else:
            spans.append((number, number))
    return spans


def by_reference(content: ReviewContent, put_blob: Callable[[str], str]) -> ReviewContent:
    """The content with its text stored (`put_blob` returns the key) and its lines as
    runs: what crosses Temporal is the names, the key and the runs."""
    return ReviewContent(files_ref=put_blob(json.dumps(content.files, ensure_ascii=False)),
                         line_spans={name: line_spans(numbers)
                                     for name, numbers in content.lines.items()},
                         skipped=content.skipped)


def cap_content(files: dict[str, str], lines: dict[str, list[int]], max_lines: int
                ) -> ReviewContent:
    """Whole files in order until the line budget is spent; the rest is named as skipped."""
    kept: dict[str, str] = {}
    used, skipped = 0, []
    for name, text in files.items():
        size = text.count("\n") + 1
        if used + size > max_lines and kept:
            skipped.append(name)
            continue
        kept[name] = text
        used += size
    return ReviewContent(files=kept, lines={k: lines[k] for k in kept}, skipped=skipped)
