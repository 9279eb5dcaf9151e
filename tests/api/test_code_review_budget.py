"""A code review's spend limit through the API, on the real dev server, PostgreSQL and the
scripted model (every call costs exactly $0.01 at the configured price): POST /code-reviews
with max_cost_usd 0.01 waits `waiting_for_budget` after its Review call, shows so in GET
/code-reviews/{id} and GET /tasks?status=, makes no call while it waits, goes on after POST
/tasks/{id}/budget raises its limit, and reports the calls the endpoint answered as its
cost."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from refloop.store.db import store_for
from refloop.worker.main import build_worker
from tests.api.test_budget import priced_api
from tests.workflow.helpers import wait_until
from tests.workflow.test_budget import answered, cent_scenario
from tests.workflow.test_code_review import DIFF, issue, review, verify

WAITING = "waiting_for_budget"


async def review_state(api: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    answer = await api.get(f"/code-reviews/{task_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()


async def until_review(api: httpx.AsyncClient, task_id: str, wanted: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update(await review_state(api, task_id))
        return seen["status"] == wanted
    await wait_until(reached, f"review {task_id} {wanted}", timeout_s=90)
    return seen


async def test_an_api_review_pauses_at_its_limit_and_goes_on_when_raised(
        client, settings, scripted_llm, workspace, task_queue):
    model = cent_scenario(scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]})
    async with priced_api(client, settings, task_queue, model) as api:
        body = {"review_type": "diff", "working_directory": str(workspace), "content": DIFF,
                "model": model, "max_cost_usd": 0.01}
        # How long it waits is the operator's, not a client's
        refused = await api.post("/code-reviews", json={**body, "budget_wait_s": 5.0})
        assert refused.status_code == 422
        started = await api.post("/code-reviews", json=body)
        assert started.status_code == 202, started.text
        task_id = started.json()["task_id"]
        state = await until_review(api, task_id, WAITING)
        assert state["stage"] == WAITING
        assert state["budget"] == {"max_cost_usd": 0.01, "max_tokens": None,
                                   "cost_usd": 0.01, "tokens": 2000, "waiting": True}
        calls = answered(scripted_llm, model)
        assert calls == 1
        await asyncio.sleep(1.5)  # no model request while it waits
        assert answered(scripted_llm, model) == calls
        row = store_for(settings.effective_database_url).get_task(task_id)
        assert row is not None and row.input is not None
        assert row.input["budget_wait_s"] == settings.refloop_budget_wait_s

        async def listed() -> bool:
            found = (await api.get("/tasks", params={"status": WAITING})).json()
            return task_id in {t["task_id"] for t in found}
        await wait_until(listed, "GET /tasks?status=waiting_for_budget lists the review")
        shown = (await api.get(f"/tasks/{task_id}")).json()
        assert shown["status"] == WAITING and shown["kind"] == "code_review"
        assert shown["cost_usd"] == 0.01 and shown["budget"]["waiting"]
        # Neither limit: the limit and spend as they are
        as_is = await api.post(f"/tasks/{task_id}/budget", json={})
        assert as_is.status_code == 200, as_is.text
        assert as_is.json()["cost_usd"] == 0.01 and as_is.json()["waiting"]
        below = await api.post(f"/tasks/{task_id}/budget", json={"max_cost_usd": 0.005})
        assert below.status_code == 409 and "$0.01" in below.text
        raised = await api.post(f"/tasks/{task_id}/budget", json={"max_cost_usd": 0.02})
        assert raised.status_code == 200, raised.text
        assert raised.json()["max_cost_usd"] == 0.02 and not raised.json()["waiting"]
        done = await until_review(api, task_id, "completed")
        ended = await api.post(f"/tasks/{task_id}/budget", json={"max_cost_usd": 1.0})
        assert ended.status_code == 409
        shown = (await api.get(f"/tasks/{task_id}")).json()
        assert shown["status"] == "completed" and shown["cost_usd"] == 0.02
        assert shown["budget"]["max_cost_usd"] == 0.02
    result = done["result"]
    assert answered(scripted_llm, model) == 2
    assert result["usage"]["cost_usd"] == 0.02 and result["usage"]["calls"] == 2
    assert result["budget"]["max_cost_usd"] == 0.02


async def test_the_mcp_servers_code_review_takes_a_limit(client, settings, scripted_llm,
                                                         workspace, task_queue):
    from refloop.api.mcp_server import McpDeps, build_mcp_server
    from tests.api.test_mcp_server import payload
    from tests.workflow.test_budget import priced

    model = cent_scenario(scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]})
    settings = priced(settings, model).model_copy(update={"refloop_task_queue": task_queue})
    deps = McpDeps(client=client, store=store_for(settings.effective_database_url),
                   settings=settings)
    server = build_mcp_server(lambda: deps)
    async with build_worker(client, settings, task_queue):
        started = payload(await server.call_tool("start_code_review", {
            "review_type": "diff", "working_directory": str(workspace), "content": DIFF,
            "model": model, "max_tokens": 3000}))
        task_id = started["task_id"]
        state: dict[str, Any] = {}

        async def waiting() -> bool:
            state.update(payload(await server.call_tool("get_code_review",
                                                        {"task_id": task_id})))
            return state["status"] == WAITING
        await wait_until(waiting, "the review waits for budget", timeout_s=60)
        assert state["budget"]["max_tokens"] == 3000 and state["budget"]["tokens"] == 2000
        await client.get_workflow_handle(f"code-review-{task_id}").cancel()
