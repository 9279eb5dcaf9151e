"""History-lean payloads: large strings live in a content-addressed blob store.

Workflow histories carry only `[[blob:<sha256>:<size>:<shown>]]` markers (after a short
preview of `shown` characters); activities resolve markers themselves - in full for tool
arguments, capped for what the model reads.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

MARKER = re.compile(r"\[\[blob:([0-9a-f]{64}):(\d+):(\d+)\]\]")
PREVIEW_CHARS = 600

Put = Callable[[str], str]
Get = Callable[[str], str]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def marker(key: str, size: int, shown: int) -> str:
    return f"[[blob:{key}:{size}:{shown}]]"


def is_large(text: str, threshold: int) -> bool:
    """Over the threshold in UTF-8 bytes; a character is at most 4 bytes, so short strings
    are never encoded."""
    return len(text) * 4 > threshold and len(text.encode("utf-8")) > threshold


def any_string(value: Any, test: Callable[[str], bool]) -> bool:
    """Whether any string in a JSON-like value passes `test`."""
    if isinstance(value, str):
        return test(value)
    if isinstance(value, dict):
        return any(any_string(v, test) for v in value.values())
    if isinstance(value, list):
        return any(any_string(v, test) for v in value)
    return False


def holds_marker(value: Any) -> bool:
    return any_string(value, lambda text: "[[blob:" in text)


def holds_large_string(value: Any, threshold: int) -> bool:
    """Whether `offload_args` / `offload_output` would store anything."""
    return any_string(value, lambda text: is_large(text, threshold))


def offload_output(text: str, threshold: int, put: Put) -> str:
    """A large tool output becomes its preview plus a marker for the rest."""
    if not is_large(text, threshold):
        return text
    key = put(text)
    shown = min(PREVIEW_CHARS, len(text))
    return text[:shown] + marker(key, len(text), shown)


def offload_args(value: Any, threshold: int, put: Put) -> Any:
    """Large string arguments (a 1 MB file body) become bare markers."""
    if isinstance(value, str) and is_large(value, threshold):
        return marker(put(value), len(value), 0)
    if isinstance(value, dict):
        return {k: offload_args(v, threshold, put) for k, v in value.items()}
    if isinstance(value, list):
        return [offload_args(v, threshold, put) for v in value]
    return value


def resolve_args(value: Any, get: Get) -> Any:
    """Markers back to the exact strings, for the tool that needs them."""
    if isinstance(value, str):
        match = MARKER.fullmatch(value)
        return get(match.group(1)) if match else value
    if isinstance(value, dict):
        return {k: resolve_args(v, get) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_args(v, get) for v in value]
    return value


def expand_for_model(text: str, get: Get, limit: int) -> str:
    """What the model reads: each marker replaced by the rest of its blob, capped."""

    def expand(match: re.Match[str]) -> str:
        key, size, shown = match.group(1), int(match.group(2)), int(match.group(3))
        rest = get(key)[shown:limit]
        missing = size - shown - len(rest)
        return rest + (f"\n[... {missing} more characters not shown ...]" if missing > 0 else "")

    return MARKER.sub(expand, text)


def expand_args(value: Any, get: Get, limit: int) -> Any:
    """Tool-call arguments as the model re-reads them: markers expanded, capped."""
    if isinstance(value, str):
        return expand_for_model(value, get, limit) if "[[blob:" in value else value
    if isinstance(value, dict):
        return {k: expand_args(v, get, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_args(v, get, limit) for v in value]
    return value
