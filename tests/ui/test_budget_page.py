"""A task at its spend limit in the console, in a real headless Chromium: the front page's
inbox lists it with what it spent, its Raise limit… opens the task page's budget box, which
shows a refusal as the API says it, and a raised limit lets the task run to its end."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.ui.browser import chromium_page
from tests.ui.test_console import ARTIFACTS, CHROMIUM, console_and_model
from tests.workflow.helpers import CODING, SUMMARY, plan_of
from tests.workflow.test_budget import CENT_A_CALL, PRICE, listing

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
    "browser tests skipped")
SCENARIO = {"name": "budget-ui", "usage": CENT_A_CALL, "responses": {
    "intent": [CODING], "plan": [plan_of("list_dir")], "act": listing(5),
    "summary": [SUMMARY]}}


def test_a_task_waiting_for_budget_is_raised_from_the_inbox_and_task_page(tmp_path: Path):
    from playwright.sync_api import expect

    workspace = tmp_path / "ws"
    workspace.mkdir()
    prices = json.dumps({"scripted": PRICE})  # the model every task asks by default
    with console_and_model(tmp_path, scenario=SCENARIO, REFLOOP_MODEL_PRICES=prices,
                           REFLOOP_SEMANTIC_INDEX="false") as (console, _):
        started = httpx.post(f"{console}/tasks", timeout=30, json={
            "workspace": str(workspace), "task": "list the files", "enable_reflection": False,
            "max_cost_usd": 0.03})
        assert started.status_code == 202, started.text
        task_id = started.json()["task_id"]
        with chromium_page() as page:
            page.goto(f"{console}/ui/")
            item = page.locator("#inbox-items li.inbox-budget", has_text="list the files")
            expect(item).to_contain_text("spent $0.0300 of its limit", timeout=30_000)
            expect(page.locator("#inbox-counts")).to_have_text(
                "0 waiting for approval · 0 waiting for a host · 1 waiting for budget")
            item.get_by_role("link", name="Raise limit…").click()
            page.wait_for_url(f"**/task.html?id={task_id}#budget")
            box = page.locator("#budget")
            expect(box).to_be_visible()
            expect(box).to_contain_text("$0.03 spent of $0.03")
            page.screenshot(path=str(ARTIFACTS / "task-budget.png"), full_page=True)
            page.locator("#budget-cost").fill("0.01")
            page.get_by_role("button", name="Raise the limit").click()
            expect(page.locator("#budget-error")).to_contain_text("has spent $0.03")
            page.locator("#budget-cost").fill("1")
            page.get_by_role("button", name="Raise the limit").click()
            expect(page.locator("#budget-done")).to_have_text(
                "Limit set to $1; the task goes on.")
            expect(page.locator("#status")).to_have_text("completed", timeout=30_000)
            expect(box).to_be_hidden()
            expect(page.locator('[data-stat="cost (USD)"]')).to_have_text("0.0900")
