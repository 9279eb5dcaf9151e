"""The task page's checkpoint actions in a real headless Chromium against `refloop up`: each
call that took a checkpoint offers "fork from here" (and, while the task runs, "rewind to
here"); each asks first in a dialog naming the step and what will happen, sends nothing on
Cancel, and on Confirm calls the API and shows its answer."""

from __future__ import annotations

import json
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


def test_fork_from_here_asks_first_and_calls_the_api(console, tmp_path):
    from playwright.sync_api import expect

    store_task(tmp_path)
    with chromium_page() as page:
        posts: list[tuple[str, str | None]] = []
        page.on("request", lambda r: posts.append((r.url, r.post_data))
                if r.method == "POST" else None)
        page.goto(f"{console}/ui/task.html?id={TASK}")
        expect(page.locator("#status")).to_have_text("completed")
        forks = page.get_by_role("button", name="Fork from here")
        expect(forks).to_have_count(2)  # the two calls that took a checkpoint
        # An ended task is not rewound: its buttons are not offered
        expect(page.get_by_role("button", name="Rewind to here")).to_have_count(0)
        expect(page.locator("#task-facts")).to_contain_text("forks: t-child (step 1)")

        forks.nth(1).click()
        dialog = page.locator("#branch-dialog")
        expect(dialog).to_be_visible()
        expect(page.locator("#branch-title")).to_have_text("Fork from step 2?")
        expect(page.locator("#branch-what")).to_contain_text(
            "after step 2 (write_file, checkpoint bbbbbbbbbbbb)")
        expect(page.locator("#branch-what")).to_contain_text(
            "This task and its workspace are left as they are.")
        page.get_by_role("button", name="Cancel").click()
        expect(dialog).to_be_hidden()
        assert not [url for url, _ in posts if "/fork" in url]  # nothing sent

        forks.nth(1).click()
        page.locator("#branch-instruction").fill("use the other library")
        page.get_by_role("button", name="Confirm").click()
        # The API's own word: this stored task is unknown to the console's Temporal
        expect(page.locator("#branch-error")).to_have_text(f"task {TASK} not found")
        sent = [json.loads(body or "{}") for url, body in posts if url.endswith("/fork")]
        assert sent == [{"at_step": 2, "task": "use the other library"}]

        page.goto(f"{console}/ui/task.html?id=t-child")
        expect(page.locator("#task-facts")).to_contain_text(f"forked from {TASK} at step 1")
