"""A code review's spend limit on the real dev server: every call of the scripted Review,
Verify and format agents costs exactly $0.01 at the configured price. A review at its limit
waits `waiting_for_budget` with no model request going out, goes on when the
`raise_budget` update raises it, ends incomplete when nobody does, and reports its cost.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from refloop.contract import visibility
from refloop.contract.budget import RAISE_BUDGET_UPDATE, BudgetRaise, BudgetState
from refloop.contract.code_review import CodeReviewInput, CodeReviewResult
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history
from refloop.workflows.code_review import CodeReviewWorkflow
from tests.workflow.helpers import HISTORIES, wait_until
from tests.workflow.test_budget import answered, cent_scenario, priced
from tests.workflow.test_code_review import DIFF, issue, review, verify

WAITING = "waiting_for_budget"


def request(model: str, **fields) -> CodeReviewInput:
    return CodeReviewInput(review_type="diff", working_directory="/tmp", content=DIFF,
                           model=model, **fields)


async def start(client: Client, task_queue: str, inp: CodeReviewInput) -> WorkflowHandle:
    return await client.start_workflow(CodeReviewWorkflow.run, inp,
                                       id=f"cr-{uuid.uuid4().hex[:8]}", task_queue=task_queue,
                                       result_type=CodeReviewResult)


async def stage_of(handle: WorkflowHandle) -> str:
    return (await handle.query(CodeReviewWorkflow.status))["stage"]


async def paused(handle: WorkflowHandle) -> None:
    async def waiting() -> bool:
        return await stage_of(handle) == WAITING
    await wait_until(waiting, "the review waits for budget", timeout_s=60)


async def searched(client: Client, workflow_id: str) -> bool:
    query = f"{visibility.STATUS.name} = '{WAITING}' AND {visibility.KIND.name} = 'code_review'"
    return workflow_id in {w.id async for w in client.list_workflows(query)}


async def test_golden_review_pauses_at_its_limit_and_goes_on_when_raised(
        client: Client, settings, scripted_llm, task_queue):
    model = cent_scenario(scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]})
    settings = priced(settings, model)
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue, request(model, max_cost_usd=0.01))
        await paused(handle)  # the review's $0.01 spent: the verify call is not covered
        assert answered(scripted_llm, model) == 1
        await asyncio.sleep(1.5)  # no model request while it waits
        assert answered(scripted_llm, model) == 1 and await stage_of(handle) == WAITING
        await wait_until(lambda: searched(client, handle.id), "RefloopStatus says so")
        status = await handle.query(CodeReviewWorkflow.status)
        assert status["budget"] == {"max_cost_usd": 0.01, "max_tokens": None,
                                    "cost_usd": 0.01, "tokens": 2000, "waiting": True}
        # A limit below the spend is refused with the figure; nothing changes
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(RAISE_BUDGET_UPDATE, BudgetRaise(max_cost_usd=0.005),
                                        result_type=BudgetState)
        assert "$0.01" in str(refused.value.cause)
        raised = await handle.execute_update(CodeReviewWorkflow.raise_budget,
                                             BudgetRaise(max_cost_usd=0.02))
        assert raised.max_cost_usd == 0.02 and raised.cost_usd == 0.01
        assert not raised.waiting
        result = await handle.result()
        history = await handle.fetch_history()
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        (HISTORIES / "code_review_budget_pause_and_raise.json").write_text(
            dump_history(history))
    assert result.status == "completed" and result.stop_reason is None
    # Its cost is the calls the endpoint answered
    assert answered(scripted_llm, model) == 2
    assert result.usage.cost_usd == 0.02 and result.usage.calls == 2
    assert result.budget is not None and result.budget.max_cost_usd == 0.02
    assert result.budget.cost_usd == 0.02 and not result.budget.waiting
    described = await client.get_workflow_handle(handle.id).describe()
    assert described.typed_search_attributes.get(visibility.STATUS) == "completed"


async def test_a_review_nobody_raises_ends_incomplete(client: Client, settings, scripted_llm,
                                                      task_queue):
    model = cent_scenario(scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]})
    settings = priced(settings, model)
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue,
                             request(model, max_tokens=3000, budget_wait_s=2))
        result = await handle.result()
    assert result.status == "incomplete"
    assert result.stop_reason is not None and "token limit" in result.stop_reason
    assert "no raise came within 2 s" in result.stop_reason
    assert result.output["status"] == "INCOMPLETE"
    assert answered(scripted_llm, model) == 1 and result.usage.total_tokens == 2000
    described = await client.get_workflow_handle(handle.id).describe()
    assert described.typed_search_attributes.get(visibility.STATUS) == "incomplete"


async def test_a_custom_format_past_the_limit_returns_the_detailed_report(
        client: Client, settings, scripted_llm, task_queue):
    model = cent_scenario(scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()],
        "summary": [{"content": "ISSUE-001 src/app.py:2"}]})
    settings = priced(settings, model)
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue, request(
            model, max_cost_usd=0.02, budget_wait_s=1, output_format="one line per finding"))
        result = await handle.result()
    assert result.status == "incomplete" and answered(scripted_llm, model) == 2
    assert result.output["summary"]["total_issues"] == 1  # the findings stand
    assert result.format_note is not None and "spend limit" in result.format_note
    assert result.usage.cost_usd == 0.02


async def test_a_review_without_a_limit_reports_its_cost(client: Client, settings,
                                                         scripted_llm, task_queue):
    model = cent_scenario(scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]})
    async with build_worker(client, priced(settings, model), task_queue):
        handle = await start(client, task_queue, request(model))
        result = await handle.result()
    assert result.status == "completed" and result.budget is None
    assert result.usage.cost_usd == 0.02 and result.usage.total_tokens == 4000
