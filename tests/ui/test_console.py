"""The web console in a real headless Chromium (Debian's package, driven by Playwright)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from refloop.llm.scripted import ScriptedLLMServer
from refloop.runtime.net import free_port
from tests.http_wait import wait_until_healthy

TOKEN = "ui-s3cret-token"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
    "browser tests skipped")

SCENARIO = {"name": "ui", "responses": {
    "intent": [{"json": {"intent": "CODING_TASK", "confidence": 0.9, "reason": "write"}}],
    "plan": [{"json": {"task_type": "creation",
                       "steps": [{"goal": "write the report", "tool": "write_file"}]}}],
    "act": [
        {"tool_calls": [{"name": "write_file",
                         "arguments": {"path": "report.md", "content": "# Report\n\nBody.\n"}}]},
        {"tool_calls": [{"name": "str_replace_based_edit_tool", "arguments": {
            "command": "str_replace", "path": "report.md", "old_str": "Body.",
            "new_str": "Body.\n\n## Summary\n\nDone."}}]},
        {"content": "report.md written with a summary"},
    ],
    "quality_review": [
        {"json": {"pass": False, "reasons": ["no Summary section"],
                  "suggestions": "add ## Summary", "summary": "missing summary"}},
        {"json": {"pass": True, "reasons": [], "suggestions": "", "summary": "good"}},
    ],
    "completeness": [{"json": {"is_complete": True, "analysis": "done", "missing_aspects": [],
                               "supplements": []}}],
    "summary": [{"content": "wrote report.md"}],
    "code_review": [{"json": {"task_id": "t", "summary": {}, "issues": [
        {"id": "ISSUE-001", "relevantFile": "snippet", "suggestionContent": "eval is unsafe",
         "suggestionLine": 1, "severity": "Critical", "label": "Security"},
        {"id": "ISSUE-002", "relevantFile": "snippet", "suggestionContent": "bad name",
         "suggestionLine": 1, "severity": "Low", "label": "Quality"}]}}],
    "code_verify": [{"json": {"task_id": "t", "verification_result": {
        "accuracy_check": [{"issue_id": "ISSUE-002", "accuracy_status": "INCORRECT",
                            "deletion_required": True}],
        "rule_compliance_check": [], "quality_assessment": {"overall_score": 80}}}}],
}}


@contextlib.contextmanager
def running_console(tmp_path: Path, token: str | None = None) -> Iterator[str]:
    """`refloop up` on a free port with the scripted model; its base URL."""
    with console_and_model(tmp_path, token) as (base, _):
        yield base


@contextlib.contextmanager
def console_and_model(tmp_path: Path, token: str | None = None, scenario: dict | None = None,
                      **env_extra: str) -> Iterator[tuple[str, ScriptedLLMServer]]:
    """`refloop up` on a free port with the scripted model (`scenario`, SCENARIO unless
    told): its base URL, and the model (to make it fail). `env_extra`: more settings."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with ScriptedLLMServer(scenario or SCENARIO) as llm:
        env = {k: v for k, v in os.environ.items()
               if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL", "REFLOOP_API_TOKEN")}
        env.update({"OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "ui",
                    "REFLOOP_DATA_DIR": str(tmp_path / "data"),
                    # Never the conventional ports: other servers run on this machine.
                    "REFLOOP_TEMPORAL_PORT": str(free_port()),
                    "REFLOOP_UI_PORT": str(free_port()),
                    # the tasks' workspaces, and `.` (the code-review form's default)
                    "REFLOOP_WORKSPACE_ROOTS": f"{tmp_path},{Path.cwd()}",
                    # No index process a task and no search warm-up: the pages never show
                    # search, and each cost the parallel tests CPU-seconds (as in the
                    # workflow tests' settings; `env_extra` may turn it on).
                    "REFLOOP_SEMANTIC_INDEX": "false"})
        if token:
            env["REFLOOP_API_TOKEN"] = token
        env.update(env_extra)
        server = subprocess.Popen([sys.executable, "-m", "refloop", "up", "--port", str(port)],
                                  env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(base, timeout_s=60)  # a loaded machine
            yield base, llm
        finally:
            server.terminate()
            server.wait(timeout=20)


@pytest.fixture
def console(tmp_path):
    with running_console(tmp_path) as base:
        yield base


@pytest.fixture
def secured_console(tmp_path):
    with running_console(tmp_path, token=TOKEN) as base:
        yield base


def test_prompt_task_reviews_approval_and_stats(console, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    workspace = tmp_path / "ws"
    workspace.mkdir()
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        # A prompt with review on: the rules box is disabled until the box is ticked.
        page.goto(f"{console}/ui/prompts.html")
        page.get_by_role("button", name="New system prompt").click()
        page.get_by_label("Name").fill("report writer")
        page.get_by_role("textbox", name="System prompt").fill("You write short reports.")
        expect(page.get_by_label("Quality review rules")).to_be_disabled()
        page.get_by_label("Enable quality review").check()
        page.get_by_label("Quality review rules").fill("Every report needs a Summary section.")
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_text("quality review on")).to_be_visible()
        # A task with that prompt, confirming writes.
        page.goto(f"{console}/ui/new-task.html")
        page.get_by_label("System prompt").select_option(label="report writer")
        page.get_by_label("Workspace").fill(str(workspace))
        page.get_by_label("Task", exact=True).fill("write report.md")
        page.get_by_label("Approvals").select_option("confirm_writes")
        page.get_by_role("button", name="Start").click()
        page.wait_for_url("**/task.html?id=*")
        # The wait is told as a status of its own, as the API tells it.
        expect(page.locator("#status")).to_have_text("waiting_approval")
        # Approve the write, watch the review fail, approve the fix, watch it pass.
        page.get_by_role("button", name="Approve").click()
        expect(page.locator(".quality-review.fail")).to_contain_text("no Summary section")
        page.get_by_role("button", name="Approve").click()
        expect(page.locator(".quality-review.pass")).to_be_visible()
        # The stats come with the end of the run.
        expect(page.locator("#status")).to_have_text("completed", timeout=20_000)
        expect(page.locator('[data-stat="reviews failed"]')).to_have_text("1")
        expect(page.locator('[data-stat="reviews passed"]')).to_have_text("1")
        page.screenshot(path=str(ARTIFACTS / "task-1280.png"), full_page=True)
        # A reload resumes without duplicates.
        reviews_before = page.locator(".quality-review").count()
        page.reload()
        expect(page.locator("#status")).to_have_text("completed")
        assert page.locator(".quality-review").count() == reviews_before
        page.set_viewport_size({"width": 390, "height": 844})
        page.screenshot(path=str(ARTIFACTS / "task-390.png"), full_page=True)
        page.goto(f"{console}/ui/reviews.html")
        expect(page.locator("#rows tr")).to_have_count(2)
        browser.close()
    assert (workspace / "report.md").read_text().endswith("## Summary\n\nDone.\n")


def test_a_task_waiting_for_the_model_says_so_and_goes_on(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    workspace = tmp_path / "ws"
    workspace.mkdir()
    with console_and_model(tmp_path) as (console, llm), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        llm.set_fault(status=503)
        page.goto(f"{console}/ui/new-task.html")
        page.get_by_label("Workspace").fill(str(workspace))
        page.get_by_label("Task", exact=True).fill("write report.md")
        page.get_by_role("button", name="Start").click()
        page.wait_for_url("**/task.html?id=*")
        expect(page.locator("#status")).to_have_text("waiting_for_model")
        expect(page.get_by_text("Waiting for the model")).to_be_visible()
        expect(page.get_by_text("HTTP 503")).to_be_visible()
        expect(page.get_by_role("button", name="Cancel")).to_be_visible()
        llm.set_fault()
        expect(page.get_by_text("Model back")).to_be_visible()
        expect(page.locator("#status")).to_have_text("completed", timeout=30_000)
        expect(page.locator('[data-stat="waited for the model (s)"]')).to_be_visible()
        browser.close()


def test_code_review_page_groups_by_severity_and_strikes_deletions(console):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 390, "height": 844})
        page.set_default_timeout(20_000)
        page.goto(f"{console}/ui/code-review.html")
        page.get_by_label("Review", exact=True).select_option("snippet")
        page.get_by_label("Diff, paths (one per line) or snippet").fill("eval(x)")
        page.keyboard.press("Tab")
        page.get_by_role("button", name="Review").click()
        # A review and its verification: two model calls through Temporal, which on a slow
        # machine take well past expect's 5 s (once still "reviewing…" then)
        expect(page.get_by_role("heading", name="Critical")).to_be_visible(timeout=120_000)
        expect(page.get_by_role("heading", name="Low")).to_be_visible()
        expect(page.locator(".struck")).to_contain_text("ISSUE-002")
        expect(page.locator(".card:not(.struck)", has_text="ISSUE-001")).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "code-review-390.png"), full_page=True)
        browser.close()


def test_token_protected_console_signs_in_and_approves_in_a_new_tab(secured_console,
                                                                    tmp_path):
    from playwright.sync_api import expect, sync_playwright

    workspace = tmp_path / "ws"
    workspace.mkdir()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(20_000)
        page = context.new_page()
        page.on("dialog", lambda dialog: pytest.fail(f"a blocking dialog: {dialog.message}"))
        # No token yet: a visible sign-in form, not a prompt() and not a blank page.
        page.goto(f"{secured_console}/ui/new-task.html")
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        page.get_by_label("API token").fill("wrong")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_text("The token was refused")).to_be_visible()
        # The prompt list never arrives here: Start must work before it does (a click
        # while it loads once fell through to the browser's own submit and reloaded).
        page.route("**/prompts", lambda route: None)
        # Nor has the page's script run when the form is filled in: Start waits for it
        # (a click before it once fell through to the browser's own submit, as above).
        held_scripts = []
        page.route("**/new-task.js", lambda route: held_scripts.append(route))
        page.get_by_label("API token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Sign in")).to_be_hidden()  # reloaded
        page.get_by_label("Workspace").fill(str(workspace))
        page.get_by_label("Task", exact=True).fill("write report.md")
        page.get_by_label("Approvals").select_option("confirm_writes")
        start = page.get_by_role("button", name="Start")
        expect(start).to_be_disabled()
        for _ in range(400):  # its request reaches the handler while Playwright waits
            if held_scripts:
                break
            page.wait_for_timeout(50)
        held_scripts[0].continue_()
        start.click()
        page.wait_for_url("**/task.html?id=*", timeout=60_000)  # a loaded machine is slow
        task_url = page.url
        # The same task in a new tab: no token there (sessionStorage is per tab), so its
        # event stream answers 401 and the sign-in comes back, visibly.
        tab = context.new_page()
        tab.goto(task_url)
        expect(tab.get_by_role("heading", name="Sign in")).to_be_visible()
        tab.get_by_label("API token").fill(TOKEN)
        tab.get_by_role("button", name="Sign in").click()
        # Signed in: the plan, the cards and the Approve button, from the token-bearing
        # event stream.
        expect(tab.locator("#plan li", has_text="write the report")).to_be_visible()
        expect(tab.locator("#events .card").first).to_be_visible()
        tab.get_by_role("button", name="Approve").click()
        expect(tab.get_by_text("Approval granted for call")).to_have_count(1)
        tab.get_by_role("button", name="Approve").click()
        expect(tab.get_by_text("Approval granted for call")).to_have_count(2)
        expect(tab.locator("#status")).to_have_text("completed", timeout=20_000)
        tab.screenshot(path=str(ARTIFACTS / "task-signed-in.png"), full_page=True)
        # A review no reviewer answered is UNAVAILABLE and grey, never a green PASS.
        from refloop.contract.activity_io import QualityReview, RecordQualityReviewInput
        from refloop.store.db import Store

        db = (tmp_path / "data" / "refloop.db").resolve()
        Store(f"sqlite:///{db}").record_quality_review(RecordQualityReviewInput(
            task_id="task-unavailable", review_key="unavailable-1", review=QualityReview(
                file_path="notes.md", passed=True, outcome="unavailable",
                summary="reviewer unreachable")))
        tab.goto(f"{secured_console}/ui/reviews.html?task_id=task-unavailable")
        row = tab.locator("#rows tr.unavailable")
        expect(row).to_contain_text("UNAVAILABLE")
        assert "PASS" not in row.inner_text()
        assert tab.locator("#rows tr.pass").count() == 0
        # The API docs load offline (local Swagger UI) with the tab's token.
        tab.goto(f"{secured_console}/docs")
        expect(tab.get_by_text("/agent/interactive/start").first).to_be_visible()
        browser.close()
    assert (workspace / "report.md").exists()
