"""Patterns the model writes (grep's regular expressions, globs), compiled by RE2.

RE2 matches in time linear in the text and compiles under a memory bound, so no pattern can
stall or bloat the worker: `a{8000000}` or nested repeats are refused at once (E_PATTERN),
and backtracking blow-ups cannot happen. The price is RE2's syntax: no lookaround and no
backreferences, which the error says. Globs are translated to RE2 the same way.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import re2

from refloop.contract.errors import ToolError

MAX_PATTERN_CHARS = 4096
# What compiling one pattern may allocate; RE2 refuses a pattern that needs more.
PATTERN_MEMORY_BYTES = 16 * 1024 * 1024


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = PATTERN_MEMORY_BYTES
    options.log_errors = False  # refusals are the model's to read, not the worker's log
    return options


def compile_regex(pattern: str) -> re2._Regexp:
    """`pattern` compiled, or E_PATTERN saying why not (too large, or not RE2 syntax)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ToolError(f"E_PATTERN: the pattern is longer than {MAX_PATTERN_CHARS} "
                        "characters")
    try:
        return re2.compile(pattern, _options())
    except re2.error as err:
        why = err.args[0].decode(errors="replace") if err.args and isinstance(
            err.args[0], bytes) else str(err)
        raise ToolError(f"E_PATTERN: bad regular expression: {why} (RE2 syntax: no "
                        "lookaround, no backreferences; repeats up to {1000}; the "
                        "compiled pattern must fit in "
                        f"{PATTERN_MEMORY_BYTES // (1024 * 1024)} MiB)") from None


def _class(segment: str, start: int) -> tuple[str, int] | None:
    """The `[...]` class at `start` as RE2, and the index after it; None: no closing `]`."""
    end = start + 1
    if end < len(segment) and segment[end] in "!^":
        end += 1
    if end < len(segment) and segment[end] == "]":
        end += 1
    end = segment.find("]", end)
    if end < 0:
        return None
    body = segment[start + 1:end]
    negate = body[:1] in ("!", "^")
    body = body[1:] if negate else body
    body = body.replace("\\", "\\\\").replace("[", "\\[")
    return f"[{'^' if negate else ''}{body}]", end + 1


def glob_regex(glob: str, star: str = "[^/]*") -> str:
    """fnmatch semantics in RE2 syntax: `*` is `star`, `?` one character, `[...]` a class."""
    out, i = [], 0
    while i < len(glob):
        char = glob[i]
        if char == "*":
            out.append(star)
            while i + 1 < len(glob) and glob[i + 1] == "*" and star != "[^/]*":
                i += 1  # `**` in a whole-path glob is the same as `*`
        elif char == "?":
            out.append("[^/]" if star == "[^/]*" else ".")
        elif char == "[" and (found := _class(glob, i)) is not None:
            out.append(found[0])
            i = found[1]
            continue
        else:
            out.append(re.escape(char))
        i += 1
    return "(?s)" + "".join(out)


@functools.lru_cache(maxsize=256)
def _segments(pattern: str) -> tuple[re2._Regexp | None, ...]:
    """One compiled matcher per `/` segment; None stands for `**`."""
    return tuple(None if part == "**" else compile_regex(glob_regex(part))
                 for part in pattern.split("/"))


def glob_match(pattern: str, rel: str) -> bool:
    """`**` matches any number of folders; other segments match like fnmatch."""
    pat, parts = _segments(pattern), rel.split("/")

    @functools.cache
    def match(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(parts)
        if pat[i] is None:
            return match(i + 1, j) or (j < len(parts) and match(i, j + 1))
        return j < len(parts) and pat[i].fullmatch(parts[j]) is not None \
            and match(i + 1, j + 1)

    return match(0, 0)


def path_glob(pattern: str) -> Callable[[str], bool]:
    """A matcher for grep's `glob`: by segments (`**` for folders), or, like fnmatch on the
    whole path, `*` crossing folders (`*.py` finds every Python file)."""
    whole = compile_regex(glob_regex(pattern, star=".*"))
    _segments(pattern)  # refused here, before any file is read, when it cannot compile
    return lambda rel: glob_match(pattern, rel) or whole.fullmatch(rel) is not None
