"""The repo map: most referenced symbols first, inside the token budget."""

from __future__ import annotations

import platform
from pathlib import Path

from refloop.search.repo_map import (
    build_repo_map,
    estimate_tokens,
    rank_symbols,
    render_map,
    workspace_context,
)

FIXTURE = Path(__file__).parents[2] / "fixtures" / "semantic_repo"


def test_most_referenced_symbols_come_first():
    sources = {
        "core.py": "class Engine:\n    pass\n\ndef helper():\n    pass\n",
        "a.py": "from core import Engine\nEngine()\nEngine()\n",
        "b.py": "from core import Engine, helper\nEngine()\nhelper()\n",
    }
    ranked = rank_symbols(sources)
    assert [(s.label, s.references) for s in ranked] == [
        ("class Engine", 5), ("def helper", 2)]


def test_the_map_respects_its_budget_and_says_what_it_left_out():
    ranked = rank_symbols({f"m{i}.py": "\n".join(f"def f{i}_{j}():\n    pass" for j in range(20))
                           for i in range(10)})
    text = render_map(ranked, 100)
    assert estimate_tokens(text) <= 100
    assert "less referenced symbols not shown" in text
    assert render_map(ranked, 100_000).count("def ") == 200


def test_fixture_map_puts_the_shared_helpers_first():
    text = build_repo_map(FIXTURE, 2_000)
    lines = text.splitlines()
    # default_retry_policy and hash_password are used by other modules
    assert lines.index("net/retries.py:") < lines.index("utils/text.py:")
    assert "  def default_retry_policy (line 14)" in lines
    assert "  def HttpClient.get_json (line 16)" in lines
    assert "README.md" not in text  # docs are not symbols


def test_context_names_the_os_and_the_workspace(tmp_path: Path):
    context = workspace_context(tmp_path, 1_000)
    assert platform.system() in context and str(tmp_path) in context
    assert "Repo map" not in context  # nothing to map
    assert "Repo map" in workspace_context(FIXTURE, 1_000)
    assert "Repo map" not in workspace_context(FIXTURE, 0)
