"""The console's front page, the list of tasks, in a real headless Chromium: its inbox of
tasks waiting for a person, and each of its filters."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.ui.browser import chromium_page
from tests.ui.test_console import ARTIFACTS, CHROMIUM

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
    "browser tests skipped")
def start_task(base: str, workspace: Path, task: str, approval_mode: str = "auto") -> str:
    session = httpx.post(f"{base}/agent/interactive/start", timeout=30, json={
        "workspace": str(workspace), "approval_mode": approval_mode}).json()
    accepted = httpx.post(f"{base}/agent/interactive/task", timeout=30, json={
        "session_id": session["session_id"], "task": task, "enable_reflection": False})
    assert accepted.status_code == 202, accepted.text
    return accepted.json()["task_id"]


def event_time(base: str, task_id: str, wanted: str) -> float:
    """When the ended task's first `wanted` event happened (workflow time), epoch seconds."""
    events = httpx.get(f"{base}/tasks/{task_id}", timeout=10).json()["result"]["events"]
    return min(datetime.fromisoformat(e["ts"]).timestamp() for e in events
               if e["type"] == wanted)


def stored_rows(tmp_path: Path) -> None:
    """Ended tasks of every kind and a few statuses, hosts and models, straight into the
    console's database (oldest first): the filters' ground truth."""
    from refloop.contract.task import RecordTaskInput
    from refloop.store.db import Store

    store = Store(f"sqlite:///{(tmp_path / 'data' / 'refloop.db').resolve()}")
    rows = [
        ("t-alpha", "agent", "completed", {"task": "alpha report on llamas", "host": "h-east",
                                           "model": "m-one"}),
        ("t-beta", "agent", "failed", {"task": "beta migration plan", "host": "h-west",
                                       "model": "m-two"}),
        ("review-gamma", "code_review", "completed", {"mode": "snippet", "model": "m-two"}),
        ("t-delta", "agent", "incomplete", {"task": "delta llamas census", "host": "h-west",
                                            "model": "m-one"}),
        ("t-epsilon", "agent", "waiting_for_model", {"task": "epsilon wait", "model": "m-one"}),
        # A status this console does not know yet: shown as told, never dropped.
        ("t-zeta", "agent", "on_hold", {"task": "zeta hold", "model": "m-three"}),
    ]
    for task_id, kind, status, inp in rows:
        store.record_task(RecordTaskInput(
            task_id=task_id, workflow_id=task_id if kind == "agent" else f"code-review-{task_id}",
            kind=kind, status=status, input=inp,
            usage={"usage": {"total_tokens": 1234}} if task_id == "t-alpha" else None))
        time.sleep(0.02)  # distinct creation times: the order is the test's


def shown(page) -> list[str]:
    return page.locator("#rows tr[data-task]").evaluate_all(
        "rows => rows.map((r) => r.dataset.task)")


def test_inbox_shows_a_waiting_task_within_2_s_and_approves_it(console, tmp_path):
    from playwright.sync_api import expect

    workspace = tmp_path / "ws"
    workspace.mkdir()
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page() as page:
        page.goto(f"{console}/ui/")
        expect(page.get_by_role("link", name="Hosts")).to_be_visible()  # in the header
        expect(page.locator("#inbox-counts")).to_have_text(
            "0 waiting for approval · 0 waiting for a host")
        task_id = start_task(console, workspace, "write report.md", "confirm_writes")
        item = page.locator("#inbox-items li.inbox-approval", has_text="write report.md")
        expect(item).to_be_visible(timeout=30_000)
        seen_at = time.time()  # checked against the wait's own time once the task ends
        expect(page.locator("#inbox-counts")).to_have_text(
            "1 waiting for approval · 0 waiting for a host")
        row = page.locator(f'#rows tr[data-task="{task_id}"]')
        expect(row.locator(".status")).to_have_text("waiting_approval")
        expect(row).to_contain_text("write report.md")
        page.screenshot(path=str(ARTIFACTS / "front-page-inbox.png"), full_page=True)
        # The inbox opens the approval; it is given there (twice: the write and its edit).
        item.get_by_role("link", name="Open approval").click()
        page.wait_for_url(f"**/task.html?id={task_id}#approvals")
        approval = page.locator("#approvals .approval")
        expect(approval).to_contain_text("write_file")
        # The file's content as content: its lines, never a literal \n.
        expect(approval.locator("pre")).to_have_text("# Report\n\nBody.\n")
        page.get_by_role("button", name="Approve").click()
        expect(page.get_by_text("Approval granted for call")).to_have_count(1)
        page.get_by_role("button", name="Approve").click()
        expect(page.locator("#status")).to_have_text("completed", timeout=30_000)
        # Back on the front page: nothing waits, and the task has ended.
        page.get_by_role("link", name="Tasks").click()
        expect(page.locator("#inbox-counts")).to_have_text(
            "0 waiting for approval · 0 waiting for a host")
        expect(row.locator(".status")).to_have_text("completed")
    assert (workspace / "report.md").read_text().endswith("Done.\n")
    waited_at = event_time(console, task_id, "approval_required")
    print(f"inbox showed the waiting task {seen_at - waited_at:.2f} s after its wait began")
    assert seen_at - waited_at <= 2.0, \
        f"the inbox showed the task {seen_at - waited_at:.2f} s after it began to wait"


def test_each_filter_returns_the_right_tasks(console, tmp_path):
    from playwright.sync_api import expect

    stored_rows(tmp_path)
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page() as page:
        page.goto(f"{console}/ui/")
        everything = ["t-zeta", "t-epsilon", "t-delta", "review-gamma", "t-beta", "t-alpha"]
        expect(page.locator("#rows tr[data-task]")).to_have_count(6)
        assert shown(page) == everything  # newest first
        alpha = page.locator('#rows tr[data-task="t-alpha"]')
        expect(alpha).to_contain_text("h-east")
        expect(alpha).to_contain_text("m-one")
        expect(alpha.locator("td.num").first).to_have_text("1234")
        expect(page.locator('#rows tr[data-task="t-epsilon"] .status')).to_have_text(
            "waiting_for_model")
        expect(page.locator('#rows tr[data-task="t-zeta"] .status.st-other')).to_have_text(
            "on_hold")
        page.screenshot(path=str(ARTIFACTS / "front-page.png"), full_page=True)

        def check(expected: list[str]) -> None:
            """The list shows exactly `expected`, in order, within 10 s of the filter."""
            deadline = time.monotonic() + 10
            while shown(page) != expected and time.monotonic() < deadline:
                page.wait_for_timeout(100)
            assert shown(page) == expected

        def clear() -> None:
            for box in ("#f-host", "#f-model", "#f-q"):
                page.locator(box).fill("")
            page.locator("#f-kind").select_option("")
            page.locator("#f-status").select_option("")  # submits on change

        page.locator("#f-status").select_option("completed")
        check(["review-gamma", "t-alpha"])
        page.locator("#f-status").select_option("waiting_for_model")
        check(["t-epsilon"])
        page.locator("#f-status").select_option("on_hold")  # offered once a task told it
        check(["t-zeta"])
        page.locator("#f-status").select_option("waiting_approval")
        expect(page.locator("#rows")).to_contain_text("No tasks match.")
        clear()
        page.locator("#f-kind").select_option("code_review")
        check(["review-gamma"])
        page.locator("#f-kind").select_option("agent_task")
        check(["t-zeta", "t-epsilon", "t-delta", "t-beta", "t-alpha"])
        clear()
        page.locator("#f-host").fill("h-west")
        page.get_by_role("button", name="Filter").click()
        check(["t-delta", "t-beta"])
        page.locator("#f-host").fill("")
        page.locator("#f-model").fill("m-two")
        page.get_by_role("button", name="Filter").click()
        check(["review-gamma", "t-beta"])
        page.locator("#f-model").fill("")
        page.locator("#f-q").fill("LLAMAS")
        page.get_by_role("button", name="Filter").click()
        check(["t-delta", "t-alpha"])
        # Filters combine, and the address keeps them (a reload shows the same list).
        page.locator("#f-model").fill("m-one")
        page.locator("#f-status").select_option("incomplete")
        check(["t-delta"])
        page.reload()
        check(["t-delta"])
        expect(page.locator("#f-q")).to_have_value("LLAMAS")
    # The API says each kind by its one name, RefloopKind's.
    kinds = {t["task_id"]: t["kind"] for t in httpx.get(f"{console}/tasks", timeout=10).json()}
    assert kinds["t-alpha"] == "agent_task" and kinds["review-gamma"] == "code_review"


def ended_rows(tmp_path: Path) -> None:
    from refloop.contract.task import RecordTaskInput
    from refloop.store.db import Store

    store = Store(f"sqlite:///{(tmp_path / 'data' / 'refloop.db').resolve()}")
    for n, status in enumerate(("completed", "failed", "completed")):
        store.record_task(RecordTaskInput(task_id=f"t-done-{n}", workflow_id=f"t-done-{n}",
                                          kind="agent", status=status,
                                          input={"task": f"ended task {n}"}))


@pytest.mark.slow  # waits out the refreshes at 1, 2, 4 and 8 s
def test_the_front_page_asks_less_while_nothing_runs_and_nothing_when_hidden(console,
                                                                               tmp_path):
    """Nothing runs: one request per refresh (the inbox is the list's waiting rows), at 1,
    2, 4, 8 s; a hidden tab asks nothing; shown again, it refreshes at once."""
    ended_rows(tmp_path)
    with chromium_page() as page:
        asked: list[float] = []
        page.on("request", lambda r: asked.append(time.monotonic())
                if "/tasks" in r.url else None)
        page.goto(f"{console}/ui/")
        page.locator('#rows tr[data-task="t-done-0"]').wait_for()
        loaded = time.monotonic()
        page.wait_for_timeout(8000)
        first = [t - loaded for t in asked if t >= loaded - 1]
        print(f"front page, nothing running: {len(first)} requests in 8 s "
              f"(3 a second before), at {[round(t, 1) for t in first]}")
        assert len(first) <= 5, first
        page.evaluate("""() => { Object.defineProperty(document, "hidden",
            { configurable: true, get: () => true });
            document.dispatchEvent(new Event("visibilitychange")); }""")
        hidden_at = len(asked)
        page.wait_for_timeout(11000)  # past the longest back-off
        assert len(asked) == hidden_at, "a hidden tab asked for the tasks"
        page.evaluate("""() => { Object.defineProperty(document, "hidden",
            { configurable: true, get: () => false });
            document.dispatchEvent(new Event("visibilitychange")); }""")
        page.wait_for_timeout(700)
        assert len(asked) == hidden_at + 1, "shown again, the page did not refresh at once"


@pytest.mark.slow  # its own `refloop up`
def test_a_task_waiting_for_its_host_is_moved_from_the_inbox_and_task_page(tmp_path):
    """A task whose host has no worker waits for it; the inbox's Move… opens the task page's
    move box, which offers the live hosts, shows a refusal as the API says it, asks before
    moving, and the moved task runs to its end on this machine's worker."""
    from playwright.sync_api import expect

    from refloop.store import hosts as host_rows
    from refloop.store.db import store_for, utcnow
    from tests.ui.test_console import console_and_model

    workspace = tmp_path / "ws"
    workspace.mkdir()
    with console_and_model(tmp_path, REFLOOP_HOST_WAIT_S="1") as (console, _):
        store = store_for(f"sqlite:///{(tmp_path / 'data' / 'refloop.db').resolve()}")
        here = [h["host_id"] for h in httpx.get(f"{console}/hosts", timeout=10).json()]
        assert len(here) == 1  # `refloop up`'s own worker
        host_rows.beat(store, "gone", [str(tmp_path)], ["q@gone"], "1@gone", 0.05, utcnow())
        host_rows.beat(store, "far", [str(tmp_path / "far")], ["q@far"], "1@far", 60.0,
                       utcnow())
        session = httpx.post(f"{console}/agent/interactive/start", timeout=30, json={
            "workspace": str(workspace), "host": "gone"}).json()
        task_id = httpx.post(f"{console}/agent/interactive/task", timeout=30, json={
            "session_id": session["session_id"], "task": "write report.md",
            "enable_reflection": False}).json()["task_id"]
        with chromium_page() as page:
            page.goto(f"{console}/ui/")
            item = page.locator("#inbox-items li.inbox-host", has_text="write report.md")
            expect(item).to_contain_text("waits for host gone", timeout=30_000)
            expect(page.locator("#inbox-counts")).to_have_text(
                "0 waiting for approval · 1 waiting for a host")
            item.get_by_role("link", name="Move…").click()
            page.wait_for_url(f"**/task.html?id={task_id}#move")
            box = page.locator("#move")
            expect(box).to_be_visible()
            expect(box).to_contain_text("No worker of host gone has taken")
            offered = page.locator("#move-host option").evaluate_all(
                "options => options.map((o) => o.value)")
            assert sorted(offered) == sorted(["far", here[0]])  # live, and not its own host
            page.screenshot(path=str(ARTIFACTS / "task-move.png"), full_page=True)
            page.locator("#move-host").select_option("far")
            page.get_by_role("button", name="Move…").click()
            expect(page.locator("#move-question")).to_contain_text("Move this task to host far?")
            page.get_by_role("button", name="Confirm move").click()
            expect(page.locator("#move-error")).to_contain_text("Not moved:")
            expect(page.locator("#move-error")).to_contain_text("does not hold")
            page.locator("#move-host").select_option(here[0])
            page.get_by_role("button", name="Move…").click()
            page.get_by_role("button", name="Keep waiting").click()  # the question goes
            expect(page.locator("#move-confirm")).to_be_hidden()
            assert httpx.get(f"{console}/tasks/{task_id}", timeout=10).json()["host"] == "gone"
            page.get_by_role("button", name="Move…").click()
            page.get_by_role("button", name="Confirm move").click()
            expect(page.locator("#move-done")).to_have_text(
                f"Moved from host gone to host {here[0]}; the task goes on there.")
            expect(page.locator("#events")).to_contain_text(
                f"Moved from host gone to host {here[0]}")
            expect(page.locator("#status")).to_have_text("completed", timeout=30_000)
            expect(box).to_be_hidden()
    assert (workspace / "report.md").read_text().endswith("Done.\n")
