"""The repo map and environment block of the system prompt.

Symbols per file (classes, functions, methods), ranked so that the most referenced come
first, cut to a token budget. References are counted as identifier occurrences across the
workspace's code, minus the definitions themselves: cheap, language-agnostic and good
enough to put the core types ahead of helpers.
"""

from __future__ import annotations

import platform
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from refloop.search.symbols import CODE_SUFFIXES, definitions, iter_sources, read_source

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
MAX_MAP_FILE_BYTES = 500_000


def estimate_tokens(text: str) -> int:
    """About four characters per token: what the map budget is counted in."""
    return (len(text) + 3) // 4


@dataclass(frozen=True)
class RankedSymbol:
    path: str
    label: str  # "class Store" / "def Store.put_blob"
    line: int
    references: int


def rank_symbols(sources: dict[str, str]) -> list[RankedSymbol]:
    """Every definition of every file, most referenced first (ties: path, then line)."""
    references: Counter[str] = Counter()
    defined: Counter[str] = Counter()
    found: list[tuple[str, str, str, int]] = []
    for path, text in sources.items():
        references.update(_IDENTIFIER.findall(text))
        for top in definitions(path, text):
            for qualified, definition in top.walk():
                if definition.name.startswith("__"):
                    continue  # dunders say nothing about the repo
                defined[definition.name] += 1
                keyword = "class" if definition.kind == "class" else "def"
                found.append((path, f"{keyword} {qualified}", definition.name,
                              definition.start_line))
    ranked = [
        RankedSymbol(path, label, line, max(references[name] - defined[name], 0))
        for path, label, name, line in found
    ]
    ranked.sort(key=lambda s: (-s.references, s.path, s.line))
    return ranked


def render_map(ranked: list[RankedSymbol], token_budget: int) -> str:
    """Greedy by rank within the budget; files listed in order of their best symbol."""
    chosen: dict[str, list[RankedSymbol]] = {}
    used = estimate_tokens("[00000 less referenced symbols not shown]")  # kept for the tail
    for symbol in ranked:
        cost = estimate_tokens(f"  {symbol.label} (line {symbol.line})\n")
        if symbol.path not in chosen:
            cost += estimate_tokens(f"{symbol.path}:\n")
        if used + cost > token_budget:
            continue  # a shorter entry further down may still fit
        chosen.setdefault(symbol.path, []).append(symbol)
        used += cost
    lines = []
    for path, symbols in chosen.items():
        lines.append(f"{path}:")
        lines += [f"  {s.label} (line {s.line})" for s in sorted(symbols, key=lambda s: s.line)]
    left_out = len(ranked) - sum(len(symbols) for symbols in chosen.values())
    if left_out:
        lines.append(f"[{left_out} less referenced symbols not shown]")
    return "\n".join(lines)


def build_repo_map(root: Path, token_budget: int) -> str:
    sources = {}
    for relative, path in iter_sources(root, CODE_SUFFIXES, MAX_MAP_FILE_BYTES):
        text = read_source(path)
        if text is not None:
            sources[relative] = text
    return render_map(rank_symbols(sources), token_budget) if sources else ""


def environment_block(root: Path) -> str:
    return (f"Environment: {platform.system()} {platform.release()} "
            f"({platform.platform(terse=True)}); workspace: {root}")


def workspace_context(root: Path, token_budget: int) -> str:
    """What the system prompt says about where the agent works."""
    block = environment_block(root)
    repo_map = build_repo_map(root, token_budget) if token_budget > 0 else ""
    if repo_map:
        block += f"\n\nRepo map (most referenced symbols first):\n{repo_map}"
    return block
