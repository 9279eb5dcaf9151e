"""Reviewing a task in the console, in a real headless Chromium against `refloop up` with the
scripted model: each write's diff and the whole task's, a rejection with a reason the model
reads, a rerun with the same input, cancel only once confirmed, no action button on an
ended task (after a reload too), "Cancelled" for a cancelled task; and rewind and fork
numbered as the API numbers them, also after a rewind from the command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest

from refloop.runtime.net import free_port
from tests.ui.browser import chromium_page
from tests.ui.test_console import CHROMIUM, console_and_model

pytestmark = [pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
    "browser tests skipped"),
    pytest.mark.slow]  # each starts a `refloop up` and a browser: 10-20 s
SLOW_MS = 60_000  # a task's next event on a loaded 2-core machine
ACTION = "^(Approve|Reject|Cancel…|Rewind to here)$"


def write(path: str, content: str) -> dict:
    return {"tool_calls": [{"name": "write_file", "arguments": {"path": path,
                                                                "content": content}}]}


def scenario(acts: list[dict], runs: int = 1) -> dict:
    return {"name": "review", "responses": {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 0.9, "reason": "w"}}] * runs,
        "plan": [{"json": {"task_type": "creation", "steps": [
            {"goal": "write the files", "tool": "write_file"}]}}] * runs,
        "act": acts,
        "completeness": [{"json": {"is_complete": True, "analysis": "done",
                                   "missing_aspects": [], "supplements": []}}] * runs,
        "summary": [{"content": "done"}] * runs}}


def start(page, console: str, workspace: Path, text: str) -> str:
    page.goto(f"{console}/ui/new-task.html")
    page.get_by_label("Workspace").fill(str(workspace))
    page.get_by_label("Task", exact=True).fill(text)
    page.get_by_label("Approvals").select_option("confirm_writes")
    page.get_by_role("button", name="Start").click()
    page.wait_for_url("**/task.html?id=*", timeout=SLOW_MS)
    return page.url.split("id=")[1]


def no_actions(page) -> None:
    import re

    from playwright.sync_api import expect

    expect(page.get_by_role("button", name=re.compile(ACTION))).to_have_count(0)


def test_diff_reject_with_reason_rerun_and_confirmed_cancel(tmp_path):
    from playwright.sync_api import expect

    workspace = tmp_path / "ws"
    workspace.mkdir()
    acts = [write("report.md", "# Report\n\nBody.\n"),
            {"tool_calls": [{"name": "str_replace_based_edit_tool", "arguments": {
                "command": "str_replace", "path": "report.md", "old_str": "Body.",
                "new_str": "Body, long."}}]},
            {"content": "report.md written"},
            write("report.md", "# Report again\n")]  # the rerun: waits for approval
    with console_and_model(tmp_path, scenario=scenario(acts, runs=2)) as (console, llm), \
            chromium_page() as page:
        posts: list[str] = []
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        task_id = start(page, console, workspace, "write report.md")
        page.get_by_role("button", name="Approve").click()
        # The second write: rejected, with a reason for the model
        expect(page.locator(".approval")).to_contain_text("str_replace", timeout=SLOW_MS)
        page.get_by_label("Reason, if you reject it").fill("keep the body as it is")
        page.screenshot(path="/tmp/refloop-reject-comment.png", full_page=True)
        page.get_by_role("button", name="Reject").click()
        expect(page.get_by_text("Approval rejected for call")).to_contain_text(
            "keep the body as it is")
        expect(page.locator("#status")).to_have_text("completed", timeout=SLOW_MS)
        told = json.dumps(llm.requests(purpose="act")[2]["body"]["messages"])
        assert "E_DENIED: the user rejected this call: keep the body as it is" in told

        # The write's diff, from its checkpoint; then the whole task's
        page.locator(".event details.changes summary").first.click()
        diff = page.locator(".event details.changes pre.diff").first
        expect(diff.locator(".diff-add").first).to_have_text("+# Report")
        expect(page.locator(".event .diff-file").first).to_contain_text("added report.md")
        page.locator("#task-changes-card summary").click()
        expect(page.locator("#task-changes-card .diff-file")).to_contain_text("report.md")
        expect(page.locator("#task-changes-card")).to_contain_text("against an empty workspace")
        page.locator(".event details.changes").first.scroll_into_view_if_needed()
        page.screenshot(path="/tmp/refloop-task-diff.png", full_page=True)
        no_actions(page)
        page.reload()
        expect(page.locator("#status")).to_have_text("completed")
        no_actions(page)

        # Run again: a new task with the same input (it waits for its first write)
        page.get_by_role("button", name="Run again").click()
        page.wait_for_url(lambda url: task_id not in url, timeout=SLOW_MS)
        rerun_id = page.url.split("id=")[1]
        expect(page.locator("#task-text")).to_have_text("write report.md")
        expect(page.locator("#status")).to_have_text("waiting_approval", timeout=SLOW_MS)
        expect(page.locator(".approval")).to_contain_text("# Report again")

        # Cancel asks first: kept running, nothing sent; then confirmed
        page.get_by_role("button", name="Cancel…").click()
        expect(page.get_by_role("alertdialog")).to_contain_text("Cancel this task?")
        page.get_by_role("button", name="Keep it running").click()
        expect(page.get_by_role("alertdialog")).to_be_hidden()
        assert not [url for url in posts if url.endswith("/cancel")]
        page.get_by_role("button", name="Cancel…").click()
        page.get_by_role("button", name="Cancel the task").click()
        expect(page.locator("#status")).to_have_text("cancelled", timeout=SLOW_MS)
        expect(page.locator('.event[data-event="failed"]')).to_have_text("Cancelled")
        expect(page.get_by_text("Failed (")).to_have_count(0)
        no_actions(page)
        page.reload()  # the approval it waited for is not offered again
        expect(page.locator("#status")).to_have_text("cancelled")
        expect(page.locator('.event[data-event="failed"]')).to_have_text("Cancelled")
        no_actions(page)
        expect(page.get_by_role("button", name="Run again")).to_be_visible()

        # The list: durations rounded once ("12 min 0 s", never "11 min 60 s")
        from refloop.store.db import Store, TaskRecord

        store = Store(f"sqlite:///{(tmp_path / 'data' / 'refloop.db').resolve()}")
        store.update(TaskRecord, task_id, {"duration_s": 719.6})
        page.goto(f"{console}/ui/index.html")
        expect(page.locator(f'tr[data-task="{task_id}"]')).to_contain_text("12 min 0 s")
        expect(page.locator(f'tr[data-task="{rerun_id}"]')).to_contain_text("cancelled")
        page.screenshot(path="/tmp/refloop-task-list.png", full_page=True)
        icon = httpx.get(f"{console}/favicon.ico")
        assert icon.status_code == 200 and icon.content.startswith(b"\x00\x00\x01\x00")


def test_rewind_and_fork_numbered_as_the_api_after_a_cli_rewind(tmp_path):
    from playwright.sync_api import expect

    workspace = tmp_path / "ws"
    workspace.mkdir()
    acts = [write("a.md", "a\n"), write("b.md", "b\n"),
            write("c.md", "c\n"),  # waits: rewound from the command line to checkpoint 1
            write("d.md", "d\n"),  # waits: rewound from the console to checkpoint 1
            write("e.md", "e\n")]  # waits: cancelled
    temporal_port = free_port()
    with console_and_model(tmp_path, scenario=scenario(acts),
                           REFLOOP_TEMPORAL_PORT=str(temporal_port)) as (console, _), \
            chromium_page() as page:
        answers: list[tuple[str, int]] = []
        page.on("response", lambda r: answers.append((r.url, r.status))
                if r.request.method == "POST" else None)
        task_id = start(page, console, workspace, "write the files")
        for name in ("a.md", "b.md"):
            expect(page.locator(".approval")).to_contain_text(name, timeout=SLOW_MS)
            page.get_by_role("button", name="Approve").click()
        expect(page.locator(".approval")).to_contain_text("c.md", timeout=SLOW_MS)
        rewinds = page.get_by_role("button", name="Rewind to here")
        expect(rewinds).to_have_count(2)
        rewinds.nth(1).click()
        expect(page.locator("#branch-title")).to_have_text("Rewind to checkpoint 2?")
        expect(page.locator("#branch-what")).to_contain_text(
            "at checkpoint 2 (after plan step 1, call 2.0: write_file b.md)")
        expect(page.locator("#branch-instruction")).to_be_hidden()  # a rewind takes none
        page.locator("#branch-cancel").click()
        page.get_by_role("button", name="Fork from here").nth(0).click()
        expect(page.locator("#branch-title")).to_have_text("Fork from checkpoint 1?")
        expect(page.locator("#branch-instruction")).to_be_visible()
        page.locator("#branch-cancel").click()

        # From the command line, as a person would: back to checkpoint 1
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
        env.update({"TEMPORAL_ADDRESS": f"127.0.0.1:{temporal_port}",
                    "REFLOOP_DATA_DIR": str(tmp_path / "data")})
        import subprocess

        rewound = subprocess.run([sys.executable, "-m", "refloop", "rewind", task_id,
                                  "--to-step", "1"], env=env, capture_output=True, text=True,
                                 timeout=120)
        assert rewound.returncode == 0, rewound.stderr
        # The console follows the same run: the approval taken back goes, one checkpoint
        # is left, offered as the API has it
        expect(page.locator(".approval")).to_contain_text("d.md", timeout=SLOW_MS)
        expect(page.locator('.event[data-event="rewound"]')).to_contain_text(
            "Rewound to checkpoint 1")
        expect(page.locator('.event[data-event="rewound"]')).to_contain_text(
            "1 edit taken back")
        expect(rewinds).to_have_count(1)
        rewinds.first.click()
        expect(page.locator("#branch-title")).to_have_text("Rewind to checkpoint 1?")
        page.get_by_role("button", name="Confirm").click()
        expect(page.locator("#branch-dialog")).to_be_hidden()
        expect(page.locator(".approval")).to_contain_text("e.md", timeout=SLOW_MS)
        expect(rewinds).to_have_count(1)
        refused = [(url, status) for url, status in answers if status >= 400]
        assert not refused, refused
        page.get_by_role("button", name="Cancel…").click()
        page.get_by_role("button", name="Cancel the task").click()
        expect(page.locator("#status")).to_have_text("cancelled", timeout=SLOW_MS)
        expect(page.get_by_role("button", name="Rewind to here")).to_have_count(0)
        expect(page.get_by_role("button", name="Fork from here")).to_have_count(1)


def test_approve_with_edited_arguments(tmp_path):
    """The approval card's edit box: the call's arguments as JSON, refused in the API's
    words where the tool would refuse them (the call still waits), run as edited once
    valid; the event shows what changed, and the model is told."""
    from playwright.sync_api import expect

    workspace = tmp_path / "ws"
    workspace.mkdir()
    acts = [write("notes.md", "draft\n"), {"content": "notes.md written"}]
    shots = os.environ.get("REFLOOP_SCREENSHOTS")  # a folder for the screenshots, if given
    with console_and_model(tmp_path, scenario=scenario(acts)) as (console, llm), \
            chromium_page() as page:
        start(page, console, workspace, "write notes.md")
        card = page.locator(".approval")
        expect(card).to_contain_text("notes.md", timeout=SLOW_MS)
        expect(card.locator(".expires")).to_contain_text("the task ends incomplete")
        card.get_by_text("Edit the arguments before approving").click()
        box = card.get_by_label("The call's arguments, as JSON")
        expect(box).to_have_value(json.dumps({"path": "notes.md", "content": "draft\n"},
                                             indent=2))
        approve = card.get_by_role("button", name="Approve with these arguments")
        box.fill("{not json")
        approve.click()
        expect(card.locator(".error")).to_contain_text("The arguments are not JSON")
        box.fill(json.dumps({"path": "notes.md"}))
        approve.click()
        expect(card.locator(".error")).to_have_text(
            "invalid arguments for write_file: content: Field required")
        expect(page.locator("#status")).to_have_text("waiting_approval")
        edited = {"path": "notes.md", "content": "# Notes\n\nEdited before approval.\n"}
        box.fill(json.dumps(edited, indent=2))
        if shots:
            card.scroll_into_view_if_needed()
            page.screenshot(path=f"{shots}/approval-with-edited-arguments.png")
        approve.click()
        expect(page.locator("#status")).to_have_text("completed", timeout=SLOW_MS)
        decided = page.locator('.event[data-event="approval_decided"]')
        expect(decided).to_contain_text("Approval granted for call 1.0 with edited arguments")
        expect(decided.locator("ins")).to_have_text("# Notes\n\nEdited before approval.\n")
        expect(decided.locator("del")).to_have_text("draft\n")
        if shots:
            decided.scroll_into_view_if_needed()
            page.screenshot(path=f"{shots}/approval-edited-event.png")
        no_actions(page)
    assert (workspace / "notes.md").read_text() == edited["content"]
    told = json.dumps(llm.requests(purpose="act")[1]["body"]["messages"])
    assert "the user edited this call's arguments before approving it" in told
