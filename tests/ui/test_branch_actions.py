"""The task page's checkpoint actions in a real headless Chromium against `refloop up`, for a
task only the database knows: a point is offered only where the API takes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ui.browser import chromium_page
from tests.ui.test_console import CHROMIUM

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
    "browser tests skipped")
TASK = "t-branch"


def result(kind: str, path: str, checkpoint: str | None) -> tuple[str, dict]:
    data = {"iteration": 1, "id": path, "tool": kind, "ok": True, "error": None,
            "output": f"wrote {path}", "data": None}
    return "tool_result", {**data, **({"checkpoint": checkpoint} if checkpoint else {})}


def store_task(tmp_path: Path) -> None:
    from refloop.contract.task import Event, RecordTaskInput, TaskResult
    from refloop.store.db import Store

    shown = [("plan", {"task_type": "coding", "steps": [{"goal": "write", "tool": "write_file"}]}),
             result("write_file", "a.txt", "a" * 64),
             result("read_file", "a.txt", None),  # changed nothing: no checkpoint
             result("write_file", "b.txt", "b" * 64),
             ("forked", {"task_id": "t-child", "step": 1})]
    events = [Event(seq=n, type=kind, ts="2026-11-28T06:00:00+00:00", data=data)
              for n, (kind, data) in enumerate(shown, start=1)]
    store = Store(f"sqlite:///{(tmp_path / 'data' / 'refloop.db').resolve()}")
    store.record_task(RecordTaskInput(
        task_id=TASK, workflow_id=TASK, status="completed", input={"task": "write files"},
        result=TaskResult(task_id=TASK, workflow_id=TASK, status="completed",
                          stop_reason="final_answer", answer="done",
                          events=events).model_dump(mode="json")))
    store.record_task(RecordTaskInput(
        task_id="t-child", workflow_id="t-child", status="completed",
        input={"task": "write files", "fork": {"task_id": TASK, "step": 1,
                                               "checkpoint_id": "a" * 64}}))


def test_a_task_temporal_does_not_know_offers_no_point_the_api_refuses(console, tmp_path):
    """Its calls' checkpoints are shown, but no rewind or fork: the API cannot tell its run's
    checkpoints, so it would refuse them (test_review.py drives both on a real run)."""
    from playwright.sync_api import expect

    store_task(tmp_path)
    with chromium_page() as page:
        page.goto(f"{console}/ui/task.html?id={TASK}")
        expect(page.locator("#status")).to_have_text("completed")
        expect(page.locator(".event details.changes")).to_have_count(2)  # two checkpoints
        expect(page.get_by_role("button", name="Fork from here")).to_have_count(0)
        expect(page.get_by_role("button", name="Rewind to here")).to_have_count(0)
        expect(page.locator("#task-facts")).to_contain_text("forks: t-child (checkpoint 1)")
        # Its diff is asked of the API, which has no such checkpoint: said, not broken
        page.locator(".event details.changes summary").first.click()
        expect(page.locator(".event .diff-body").first).to_contain_text("Changes not shown")

        page.goto(f"{console}/ui/task.html?id=t-child")
        expect(page.locator("#task-facts")).to_contain_text(
            f"forked from {TASK} at checkpoint 1")
