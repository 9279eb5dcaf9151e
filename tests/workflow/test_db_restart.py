"""PostgreSQL stopped and restarted in the middle of a run: no task row or review is lost."""

from __future__ import annotations

import asyncio

import pytest

from refloop.contract import policies
from refloop.contract.task import TaskInput
from refloop.store.db import store_for
from refloop.worker.main import build_worker
from tests.llm_fixtures import unique_scenario
from tests.proxy import DatabaseProxy
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, result_of, start
from tests.workflow.test_crash import wait_for_event

PASS = {"json": {"pass": True, "reasons": [], "suggestions": "", "summary": "ok"}}


async def test_database_restart_mid_run_loses_nothing(client, settings, scripted_llm,
                                                      workspace, task_queue):
    proxy = DatabaseProxy()
    await proxy.start()
    through_proxy = settings.model_copy(update={"database_url": settings.database_url.replace(
        "127.0.0.1:5432", f"127.0.0.1:{proxy.port}")})
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.md", content="# A\n"),
                call("write_file", path="b.md", content="# B\n"), final("both written")],
        "quality_review": [PASS, PASS], "summary": [SUMMARY],
    })
    try:
        async with build_worker(client, through_proxy, task_queue):
            handle = await start(client, task_queue, TaskInput(
                task="write two docs", workspace=str(workspace), model=model,
                enable_quality_review=True, quality_review_rules="be brief",
                enable_reflection=False))
            await wait_for_event(handle, lambda e: e.type == "tool_call")
            await proxy.stop()  # the database goes away mid-run...
            await asyncio.sleep(3)
            await proxy.start()  # ...and comes back
            result = await asyncio.wait_for(result_of(handle), timeout=120)
    finally:
        await proxy.stop()
    assert result.status == "completed"
    store = store_for(settings.effective_database_url)
    assert store.get_task(result.task_id).status == "completed"
    reviews = store.list_quality_reviews(task_id=result.task_id)
    assert [r.file_path for r in reviews] == ["a.md", "b.md"]


async def history_length(handle) -> int:
    return (await handle.describe()).raw_description.workflow_execution_info.history_length


@pytest.mark.slow
async def test_a_long_database_outage_costs_a_bounded_number_of_history_events(
        client, settings, scripted_llm, workspace, task_queue):
    """The database is down from the task's start: its first write fails locally for a
    few attempts (STORE_WRITE_LOCAL), then waits on the server, adding no events until the
    database is back."""
    assert policies.STORE_WRITE_LOCAL.retry.maximum_attempts == 4  # about 7 s of attempts
    proxy = DatabaseProxy()
    await proxy.start()
    through_proxy = settings.model_copy(update={"database_url": settings.database_url.replace(
        "127.0.0.1:5432", f"127.0.0.1:{proxy.port}")})
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.md", content="# A\n"), final("written")],
        "summary": [SUMMARY],
    })
    try:
        async with build_worker(client, through_proxy, task_queue):
            await proxy.stop()  # down before the task's first write
            handle = await start(client, task_queue, TaskInput(
                task="write a doc", workspace=str(workspace), model=model,
                enable_reflection=False))
            await asyncio.sleep(12)
            early = await history_length(handle)
            await asyncio.sleep(10)  # local retries would add a workflow task every ~8 s
            late = await history_length(handle)
            await proxy.start()
            result = await asyncio.wait_for(result_of(handle), timeout=120)
    finally:
        await proxy.stop()
    assert late == early and early < 80, (early, late)  # ~45 are the start's patch markers
    assert result.status == "completed"
    assert store_for(settings.effective_database_url).get_task(result.task_id).status \
        == "completed"
