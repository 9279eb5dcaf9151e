"""Which paths a checkpoint keeps: what a person would restore, not build output.

Always left out: `.git` (the repository's own history is git's business) and the usual
build and cache directories. Each `.gitignore` in the tree applies below its directory.
A `.gitignore` is repository content, so it is read bounded and matched with RE2 (linear
time, whatever its patterns).
"""

from __future__ import annotations

import pathspec

# By name, at any depth (a set lookup: every path of a large tree is checked).
ALWAYS_IGNORED_DIRS = frozenset({
    ".git", "__pycache__", ".venv", "venv", "node_modules", ".tox", ".nox", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".refloop-data"})
ALWAYS_IGNORED_SUFFIXES = (".pyc", ".pyo")
MAX_GITIGNORE_BYTES = 64 * 1024
MAX_GITIGNORE_PATTERNS = 2_000


def compile_patterns(lines: list[str]) -> pathspec.GitIgnoreSpec:
    return pathspec.GitIgnoreSpec.from_lines(lines[:MAX_GITIGNORE_PATTERNS], backend="re2")


def parse_gitignore(data: bytes) -> pathspec.GitIgnoreSpec | None:
    """The patterns of one `.gitignore`; None when it holds none."""
    text = data[:MAX_GITIGNORE_BYTES].decode("utf-8", "replace")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return compile_patterns(lines) if lines else None

class IgnoreRules:
    """The specs in force at one directory: the defaults, then each ancestor's
    `.gitignore` with the prefix it applies under."""

    def __init__(self, scoped: tuple[tuple[str, pathspec.GitIgnoreSpec], ...] = (),
                 key: tuple[tuple[str, str], ...] = ()) -> None:
        self.scoped = scoped
        # (prefix, sha256 of the .gitignore) per spec: equal keys, equal rules (a walk
        # reuses a directory's last classification when its rules have not changed)
        self.key = key

    def below(self, directory: str, spec: pathspec.GitIgnoreSpec | None,
              digest: str = "") -> IgnoreRules:
        if spec is None:
            return self
        prefix = f"{directory}/" if directory else ""
        return IgnoreRules((*self.scoped, (prefix, spec)), (*self.key, (prefix, digest)))

    def ignores(self, path: str, name: str, is_dir: bool) -> bool:
        if name in ALWAYS_IGNORED_DIRS if is_dir else name.endswith(ALWAYS_IGNORED_SUFFIXES):
            return True
        if not self.scoped:
            return False
        candidate = f"{path}/" if is_dir else path
        for prefix, spec in self.scoped:
            if candidate.startswith(prefix) and spec.match_file(candidate[len(prefix):]):
                return True
        return False
