"""Determinism check: replay saved event histories against the current workflow code."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from refloop.worker.plugin import refloop_plugin


def dump_history(history: WorkflowHistory) -> str:
    """History JSON plus its workflow id, which replay needs (child ids derive from it)."""
    data = json.loads(history.to_json())
    return json.dumps({"workflowId": history.workflow_id, **data})


def started_workflow_id(data: dict) -> str | None:
    """The workflow ID the history itself records (its first event), if it does."""
    events = data.get("events") or [{}]
    started = events[0].get("workflowExecutionStartedEventAttributes") or {}
    return started.get("workflowId") or None


def load_history(path: Path) -> WorkflowHistory:
    """The history with its own workflow ID: a child's ID derives from its parent's, so a
    file named anything else (`parent.json`) must not lend the run its name."""
    data = json.loads(path.read_text(encoding="utf-8"))
    saved = data.pop("workflowId", None)
    return WorkflowHistory.from_json(started_workflow_id(data) or saved or path.stem, data)


async def replay_files(paths: list[Path]) -> dict[str, str]:
    """Path -> error for every history that does not replay; empty when all do."""
    replayer = Replayer(workflows=[], plugins=[refloop_plugin()])
    failures: dict[str, str] = {}
    for path in paths:
        result = await replayer.replay_workflow(load_history(path), raise_on_replay_failure=False)
        if result.replay_failure is not None:
            failures[str(path)] = str(result.replay_failure)
    return failures
