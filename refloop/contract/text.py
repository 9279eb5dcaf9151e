"""Text checks on model output: runaway repetition and JSON extraction."""

from __future__ import annotations

import re

ABNORMAL_THRESHOLD = 50


def detect_abnormal_output(text: str, threshold: int = ABNORMAL_THRESHOLD) -> str | None:
    """A run of `[` or `{` longer than the threshold means the model derailed."""
    for char in "[{":
        if re.search(re.escape(char) + r"(\s*" + re.escape(char) + "){" + str(threshold) + ",}",
                     text):
            return f"runaway repetition of '{char}' (more than {threshold} in a row)"
    return None


def first_json_object(text: str) -> str | None:
    """The first balanced {...} that parses as far as braces go, honouring strings."""
    start = text.find("{")
    while start != -1:
        depth, in_string, escaped = 0, False, False
        for index in range(start, len(text)):
            char = text[index]
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
            elif char == '"':
                in_string = True
            elif char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[start : index + 1]
        start = text.find("{", start + 1)
    return None


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
