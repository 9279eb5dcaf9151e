"""Spend limits through the API, on the real dev server, PostgreSQL and the scripted model
(every call costs exactly $0.01 at the configured price): POST /tasks with max_cost_usd
0.05 pauses the task in `waiting_for_budget`, no call goes out while it waits, POST
/tasks/{id}/budget raises the limit, the task pauses again (in its supplement child, which
draws from the same limit) and completes after a third raise; the cost it reports is the
calls the endpoint answered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from refloop.api.main import create_app
from refloop.worker.main import build_worker
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, wait_until
from tests.workflow.test_budget import (
    COMPLETE,
    PRICE,
    SAVE_SUMMARY,
    SUPPLEMENT_PLAN,
    answered,
    cent_scenario,
    priced,
)


@asynccontextmanager
async def priced_api(client, settings, task_queue, model) -> AsyncIterator[httpx.AsyncClient]:
    settings = priced(settings, model).model_copy(update={"refloop_task_queue": task_queue})
    app = create_app(settings, client=client)
    async with build_worker(client, settings, task_queue):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield http


async def status(api: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    answer = await api.get(f"/tasks/{task_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()


async def until_status(api, task_id: str, wanted: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update(await status(api, task_id))
        return seen["status"] == wanted
    await wait_until(reached, f"task {task_id} {wanted}", timeout_s=90)
    return seen


async def still_waiting(api, task_id, scripted_llm, model) -> int:
    before = answered(scripted_llm, model)
    await asyncio.sleep(1.5)
    assert answered(scripted_llm, model) == before
    assert (await status(api, task_id))["status"] == "waiting_for_budget"
    return before


async def test_an_api_task_pauses_at_its_limit_and_goes_on_after_each_raise(
        client, settings, scripted_llm, workspace, task_queue):
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")],
        "act": [call("list_dir", path="."), call("list_dir", path="."), final("listed"),
                call("write_file", path="summary.md", content="# Summary\n"),
                call("list_dir", path="."), call("list_dir", path="."), final("saved")],
        "completeness": [SAVE_SUMMARY, COMPLETE], "supplement_plan": [SUPPLEMENT_PLAN],
        "summary": [SUMMARY]})
    async with priced_api(client, settings, task_queue, model) as api:
        started = await api.post("/tasks", json={
            "workspace": str(workspace), "task": "list and save a summary", "model": model,
            "enable_reflection": True, "max_cost_usd": 0.05})
        assert started.status_code == 202, started.text
        task_id = started.json()["task_id"]
        await until_status(api, task_id, "waiting_for_budget")
        calls = await still_waiting(api, task_id, scripted_llm, model)
        state = await status(api, task_id)  # the row recorded by now
        assert calls <= 6 and state["cost_usd"] == 0.05
        assert state["budget"]["waiting"] and state["budget"]["max_cost_usd"] == 0.05
        assert state["waiting"]["budget"]["status"] == "waiting_for_budget"
        listed = (await api.get("/tasks", params={"status": "waiting_for_budget"})).json()
        assert task_id in [t["task_id"] for t in listed]

        below = await api.post(f"/tasks/{task_id}/budget", json={"max_cost_usd": 0.02})
        assert below.status_code == 409 and "$0.05" in below.json()["detail"]
        asked = await api.post(f"/tasks/{task_id}/budget", json={})  # changes nothing
        assert asked.status_code == 200 and asked.json()["max_cost_usd"] == 0.05
        assert asked.json()["waiting"] and asked.json()["cost_usd"] == 0.05
        zero = await api.post(f"/tasks/{task_id}/budget", json={"max_cost_usd": 0})
        assert zero.status_code == 422
        raised = await api.post(f"/tasks/{task_id}/budget", json={"max_cost_usd": 0.09})
        assert raised.status_code == 200, raised.text
        assert raised.json()["max_cost_usd"] == 0.09

        # The check and the supplement plan ($0.07), then its child on the $0.02 left
        await wait_until(lambda: answered(scripted_llm, model) > calls, "calls go on")
        await until_status(api, task_id, "waiting_for_budget")
        calls = await still_waiting(api, task_id, scripted_llm, model)
        state = await status(api, task_id)
        assert "supplement child" in state["waiting"]["budget"]["reason"]
        assert calls == 9

        raised = await api.post(f"/tasks/{task_id}/budget", json={"max_cost_usd": 1})
        assert raised.status_code == 200, raised.text
        done = await until_status(api, task_id, "completed")
    calls = answered(scripted_llm, model)
    assert calls == 13  # 5 + check + plan + the child's 4 turns + check + summary
    assert done["cost_usd"] == round(0.01 * calls, 9)
    assert done["own_cost_usd"] == round(0.01 * (calls - 4), 9)
    assert done["unpriced_calls"] == 0
    assert (workspace / "summary.md").read_text() == "# Summary\n"


async def test_a_model_configs_own_price_prices_its_tasks(api, scripted_llm, workspace):
    """No REFLOOP_MODEL_PRICES: the session's model config carries the price."""
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")],
        "act": [call("list_dir", path="."), final("listed")], "summary": [SUMMARY]})
    half = await api.post("/model-configs", json={"name": "half", "model": model,
                                                  "price": {"input_usd_per_mtok": 5.0}})
    assert half.status_code == 422 and "output_usd_per_mtok" in half.text
    config = await api.post("/model-configs", json={
        "name": "priced", "model": model, "price": PRICE})
    assert config.status_code == 201, config.text
    started = await api.post("/tasks", json={
        "workspace": str(workspace), "task": "list the files",
        "model_config_id": config.json()["id"]})
    assert started.status_code == 202, started.text
    done = await until_status(api, started.json()["task_id"], "completed")
    calls = answered(scripted_llm, model)
    assert calls == 5 and done["cost_usd"] == 0.05 and done["unpriced_calls"] == 0


async def test_a_sessions_limit_is_its_tasks_default(api, scripted_llm, workspace):
    """A session's max_tokens: its tasks start with it (a task's own would win), counted
    in tokens with no price anywhere."""
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")],
        "act": [call("list_dir", path="."), call("list_dir", path="."), final("listed")],
        "summary": [SUMMARY]})
    session = await api.post("/agent/interactive/start", json={
        "workspace": str(workspace), "model": model, "max_tokens": 6000})
    assert session.status_code == 201, session.text
    started = await api.post("/agent/interactive/task", json={
        "session_id": session.json()["session_id"], "task": "list the files"})
    task_id = started.json()["task_id"]
    await until_status(api, task_id, "waiting_for_budget")
    assert answered(scripted_llm, model) == 3  # 2000 tokens each: a fourth passes 6000
    state = await status(api, task_id)
    assert state["budget"]["max_tokens"] == 6000 and state["unpriced_calls"] == 3
    assert state["cost_usd"] == 0
    raised = await api.post(f"/tasks/{task_id}/budget", json={"max_tokens": 100_000})
    assert raised.status_code == 200 and not raised.json()["waiting"]
    assert (await until_status(api, task_id, "completed"))["budget"]["max_tokens"] == 100_000
