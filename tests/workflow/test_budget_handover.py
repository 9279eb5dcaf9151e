"""`refloop drain` and a task waiting for budget in the middle of a turn: the turn's edit is
one the quality review judges, and the limit does not cover the review's model call. The
task waits before the edit (never between the edit and its review), and a hand-over takes
it there as at a turn's model call: the new run makes the edit once, then its review."""

from __future__ import annotations

import pytest

from refloop.contract.budget import BudgetRaise
from refloop.contract.task import TaskInput
from refloop.worker.main import build_worker
from refloop.workflows.agent import AgentTaskWorkflow
from tests.workflow.helpers import (
    CODING,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    result_of,
    start,
)
from tests.workflow.test_budget import answered, cent_scenario, paused, priced, status_of
from tests.workflow.test_quality_review import PASS


async def test_a_task_waiting_for_budget_mid_turn_is_handed_over(
        client, settings, scripted_llm, workspace, task_queue):
    from refloop.worker.handover import drain, take_over

    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.md", content="# A\n"), final("written")],
        "quality_review": [PASS], "summary": [SUMMARY]})
    inp = TaskInput(task="write a.md", workspace=str(workspace), model=model,
                    enable_reflection=False, enable_quality_review=True, max_cost_usd=0.03)
    async with build_worker(client, priced(settings, model), task_queue):
        handle = await start(client, task_queue, inp)
        await paused(handle)  # intent, plan, act: $0.03; the edit's review is not covered
        assert answered(scripted_llm, model) == 3
        assert not (workspace / "a.md").exists()  # it waits before the edit
        report = await drain(client, "build-a", task_queue, timeout_s=20, poll_s=0.2)
        assert report.asked == [handle.id] and not report.still_running
        assert await status_of(handle) == "handed_over"
        assert await take_over(client, "build-b", task_queue) == 1
        await paused(handle)  # the new run waits again, before the same edit
        assert not (workspace / "a.md").exists()
        progress = await handle.query(AgentTaskWorkflow.progress)
        assert progress.budget is not None and progress.budget.cost_usd == 0.03
        assert answered(scripted_llm, model) == 3
        await handle.execute_update(AgentTaskWorkflow.raise_budget, BudgetRaise(max_cost_usd=1))
        result = await result_of(handle)
    assert result.status == "completed"
    assert events_of(result, "handed_over")
    assert (workspace / "a.md").read_text() == "# A\n"
    waits = events_of(result, "waiting_for_budget")
    assert len(waits) == 2  # in each run, before the edit
    assert all("the quality review of the write_file call" in e["reason"] for e in waits)
    writes = [e for e in events_of(result, "tool_result") if e.get("tool") == "write_file"]
    assert len(writes) == 1  # the edit ran once, in the new run
    assert result.stats.reviews.total == 1 and result.stats.reviews.passed == 1
    assert result.stats.usage.cost_usd == pytest.approx(0.01 * answered(scripted_llm, model))
