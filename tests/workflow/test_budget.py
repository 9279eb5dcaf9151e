"""Spend limits on the real dev server: the scripted model reports the same usage for
every call, so at the configured price each call costs exactly $0.01. A task at its limit
waits `waiting_for_budget` with no model request going out, goes on when the
`raise_budget` update raises it, and ends incomplete when nobody does; its supplement child
draws from the same limit; its cost is the calls the endpoint answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from refloop.contract import visibility
from refloop.contract.budget import BudgetRaise
from refloop.contract.task import TaskInput, TaskResult
from refloop.settings import Settings
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from tests.workflow.helpers import (
    CODING,
    HISTORIES,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    result_of,
    run_task,
    start,
    wait_until,
)

# 1000 + 1000 tokens at $5 per million each way: $0.01 a call
CENT_A_CALL = {"prompt_tokens": 1000, "completion_tokens": 1000}
PRICE = {"input_usd_per_mtok": 5.0, "output_usd_per_mtok": 5.0}


def cent_scenario(scripted_llm, responses: dict[str, Any]) -> str:
    """A scenario whose every answer costs $0.01 at PRICE (its name is the model's)."""
    model = f"s-{uuid.uuid4().hex[:10]}"
    scripted_llm.load(model, {"name": model, "responses": responses, "usage": CENT_A_CALL})
    return model


def priced(settings: Settings, model: str) -> Settings:
    return settings.model_copy(update={"refloop_model_prices": json.dumps({model: PRICE})})


def answered(scripted_llm, model: str) -> int:
    return len(scripted_llm.requests(model=model))


async def status_of(handle: WorkflowHandle) -> str:
    return (await handle.query(AgentTaskWorkflow.progress)).status


async def paused(handle: WorkflowHandle) -> None:
    async def waiting() -> bool:
        return await status_of(handle) == "waiting_for_budget"
    await wait_until(waiting, "the task waits for budget", timeout_s=60)


async def no_call_while_waiting(handle: WorkflowHandle, scripted_llm, model: str) -> int:
    """The calls so far, unchanged over a while the task waits."""
    before = answered(scripted_llm, model)
    await asyncio.sleep(1.5)
    assert answered(scripted_llm, model) == before
    assert await status_of(handle) == "waiting_for_budget"
    return before


async def searched(client: Client, workflow_id: str) -> bool:
    """What `temporal workflow list --query` finds: the task, by its status."""
    query = f"{visibility.STATUS.name} = 'waiting_for_budget'"
    return workflow_id in {w.id async for w in client.list_workflows(query)}


def listing(n: int) -> list[dict[str, Any]]:
    return [call("list_dir", path=".")] * n + [final("listed")]


async def test_pauses_at_the_limit_and_goes_on_after_each_raise(
        client: Client, settings, scripted_llm, workspace: Path, task_queue):
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")], "act": listing(7),
        "summary": [SUMMARY]})
    settings = priced(settings, model)
    inp = TaskInput(task="list the files", workspace=str(workspace), model=model,
                    enable_reflection=False, max_cost_usd=0.05)
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue, inp)
        await paused(handle)
        calls = await no_call_while_waiting(handle, scripted_llm, model)
        assert calls == 5  # $0.05 spent: a sixth call is not covered
        await wait_until(lambda: searched(client, handle.id), "RefloopStatus says so")
        # A limit below the spend is refused with the figure; nothing changes
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(AgentTaskWorkflow.raise_budget,
                                        BudgetRaise(max_cost_usd=0.03))
        assert "$0.05" in str(refused.value.cause)
        raised = await handle.execute_update(AgentTaskWorkflow.raise_budget,
                                             BudgetRaise(max_cost_usd=0.08))
        assert raised.max_cost_usd == 0.08 and raised.cost_usd == 0.05
        await wait_until(lambda: answered(scripted_llm, model) > calls, "a call after the raise")
        await paused(handle)
        assert await no_call_while_waiting(handle, scripted_llm, model) == 8
        await handle.execute_update(AgentTaskWorkflow.raise_budget, BudgetRaise(max_cost_usd=1.0))
        result = await result_of(handle)
        history = await handle.fetch_history()
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        (HISTORIES / "agent_task_budget_pause_and_raise.json").write_text(dump_history(history))
    assert result.status == "completed"
    calls = answered(scripted_llm, model)
    assert calls == 11  # intent, plan, 8 turns, summary
    assert result.stats.usage.cost_usd == pytest.approx(0.01 * calls, abs=1e-9)
    assert result.stats.usage.unpriced_calls == 0
    waits = events_of(result, "waiting_for_budget")
    assert len(waits) == 2 and "$0.05 spent of $0.05" in waits[0]["reason"]
    assert len(events_of(result, "budget_raised")) == 2
    assert len(events_of(result, "budget_resumed")) == 2


async def test_an_unanswered_wait_ends_the_task_incomplete(
        client, settings, scripted_llm, workspace, task_queue):
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")], "act": listing(3),
        "summary": [SUMMARY]})
    result = await run_task(client, priced(settings, model), task_queue, model, workspace,
                            max_cost_usd=0.03, budget_wait_s=1)
    assert result.status == "incomplete" and result.stop_reason == "budget_wait_expired"
    assert "no raise came within 1 s" in result.missing[0]
    assert answered(scripted_llm, model) == 3
    assert result.stats.usage.cost_usd == pytest.approx(0.03)


async def test_a_waiting_task_can_be_cancelled(client, settings, scripted_llm, workspace,
                                               task_queue):
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")], "act": listing(3)})
    inp = TaskInput(task="list", workspace=str(workspace), model=model,
                    enable_reflection=False, max_cost_usd=0.02)
    async with build_worker(client, priced(settings, model), task_queue):
        handle = await start(client, task_queue, inp)
        await paused(handle)
        await handle.cancel()
        with pytest.raises(Exception):  # noqa: B017 - cancelled: the run fails so
            await handle.result()
        events = await handle.query(AgentTaskWorkflow.events)
    assert events[-1].type == "failed" and events[-1].data["stop_reason"] == "cancelled"
    assert answered(scripted_llm, model) == 2


async def test_a_model_without_a_price_counts_tokens_and_max_tokens_limits_it(
        client, settings, scripted_llm, workspace, task_queue):
    """No price: the cost stays 0 and every answered call is unpriced; a token limit (the
    earlier `token_budget` name) pauses the task all the same."""
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")], "act": listing(3)})
    inp = TaskInput(task="list", workspace=str(workspace), model=model,
                    enable_reflection=False, token_budget=6000, budget_wait_s=1)
    assert inp.max_tokens == 6000
    async with build_worker(client, settings, task_queue):
        result: TaskResult = await result_of(await start(client, task_queue, inp))
    assert result.stop_reason == "budget_wait_expired"
    assert answered(scripted_llm, model) == 3  # 2000 tokens each: a fourth passes 6000
    usage = result.stats.usage
    assert usage.cost_usd == 0 and usage.unpriced_calls == 3 and usage.total_tokens == 6000


SAVE_SUMMARY = {"json": {
    "is_complete": False, "analysis": "the summary was never saved",
    "missing_aspects": ["persist the summary"],
    "supplements": [{"action": "save the summary to summary.md", "reason": "asked for",
                     "suggested_tools": ["write_file"]}]}}
COMPLETE = {"json": {"is_complete": True, "analysis": "all done", "missing_aspects": [],
                     "supplements": []}}
SUPPLEMENT_PLAN = {"json": {"task_type": "creation",
                            "steps": [{"goal": "save summary.md", "tool": "write_file"}]}}


async def test_a_supplement_child_draws_from_the_parents_limit(
        client, settings, scripted_llm, workspace, task_queue):
    """The child starts with what is left, pauses at it, and goes on when the parent's
    limit is raised (passed on to it); the parent's cost includes the child's."""
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")],
        "act": [call("list_dir", path="."), final("listed"),
                call("write_file", path="summary.md", content="# Summary\n"),
                call("list_dir", path="."), final("saved")],
        "completeness": [SAVE_SUMMARY, COMPLETE], "supplement_plan": [SUPPLEMENT_PLAN],
        "summary": [SUMMARY]})
    # intent, plan, 2 turns, the check, the supplement plan: $0.06; the child has $0.02
    inp = TaskInput(task="list and save a summary", workspace=str(workspace), model=model,
                    max_cost_usd=0.08)
    async with build_worker(client, priced(settings, model), task_queue):
        handle = await start(client, task_queue, inp)
        child = client.get_workflow_handle(f"{handle.id}-supplement-1")
        await wait_until(lambda: answered(scripted_llm, model) >= 8, "the child's calls")
        await paused(child)
        assert await no_call_while_waiting(child, scripted_llm, model) == 8
        await handle.execute_update(AgentTaskWorkflow.raise_budget, BudgetRaise(max_cost_usd=1))
        result = await result_of(handle)
    assert result.status == "completed", result.missing
    calls = answered(scripted_llm, model)
    assert calls == 11  # and the child's third turn, the second check, the summary
    stats = result.stats
    assert stats.usage.cost_usd == pytest.approx(0.11)
    assert stats.children_usage.cost_usd == pytest.approx(0.03)


async def test_a_task_handed_over_while_it_waits_keeps_its_limit_and_spend(
        client, settings, scripted_llm, workspace, task_queue):
    """`refloop drain` takes a task waiting for budget at its turn's model call: the next
    run (another build's) waits again with the same spend, and the raise lets it end."""
    from refloop.worker.handover import drain, take_over

    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")], "act": listing(3),
        "summary": [SUMMARY]})
    inp = TaskInput(task="list", workspace=str(workspace), model=model,
                    enable_reflection=False, max_cost_usd=0.03)
    async with build_worker(client, priced(settings, model), task_queue):
        handle = await start(client, task_queue, inp)
        await paused(handle)
        report = await drain(client, "build-a", task_queue, timeout_s=30, poll_s=0.2)
        assert report.asked == [handle.id] and not report.still_running
        assert await status_of(handle) == "handed_over"
        assert await take_over(client, "build-b", task_queue) == 1
        await paused(handle)  # the new run: the same spend, the same limit
        progress = await handle.query(AgentTaskWorkflow.progress)
        assert progress.budget is not None and progress.budget.cost_usd == 0.03
        assert progress.budget.max_cost_usd == 0.03
        assert answered(scripted_llm, model) == 3  # the waiting turn was never asked
        await handle.execute_update(AgentTaskWorkflow.raise_budget, BudgetRaise(max_cost_usd=1))
        result = await result_of(handle)
    assert result.status == "completed"
    assert result.stats.usage.cost_usd == pytest.approx(0.01 * answered(scripted_llm, model))
    assert events_of(result, "handed_over")
