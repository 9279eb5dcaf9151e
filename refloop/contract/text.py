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


# Characters a terminal acts on rather than shows: C0 controls (ESC starts every escape
# sequence: colours, screen clears, OSC 52 clipboard writes), DEL, C1 controls (0x9b is a
# one-byte CSI) and the bidirectional overrides that reorder what a reader sees.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str, keep: str = "\n\t") -> str:
    """`text` with every control character except those in `keep` shown as an escape
    (`\\x1b`, `\\u202e`): what a model, a repository or a tool wrote reaches a terminal, a
    page or another tool as text, never as an instruction to it."""
    def escaped(match: re.Match[str]) -> str:
        char = match.group()
        if char in keep:
            return char
        return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"

    return _CONTROLS.sub(escaped, text)


def escape_json_controls(text: str) -> str:
    """JSON text (json.dumps escapes C0 controls itself) with the C1 and bidi controls
    escaped too: inside strings, the only place they can be, `\\u009b` is valid JSON."""
    return re.sub("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]",
                  lambda match: f"\\u{ord(match.group()):04x}", text)
