"""The HTTP API against the real Temporal dev server, real PostgreSQL and the scripted model."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx

from refloop.api.main import create_app
from refloop.workflows.agent import AgentTaskWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of

REVIEW_FAIL = {"json": {"pass": False, "reasons": ["no summary"], "suggestions": "add one",
                        "summary": "bad"}}


def parse_sse(text: str) -> list[dict]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line
                      and not line.startswith(":"))
        if "event" in fields:
            events.append({"id": int(fields["id"]) if "id" in fields else None,
                           "event": fields["event"],
                           "data": json.loads(fields["data"])})
    return events


async def new_session(api, workspace, **body) -> str:
    response = await api.post("/agent/interactive/start", json={"workspace": str(workspace),
                                                                **body})
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def writing_scenario(scripted_llm, reviews: list | None = None) -> str:
    responses = {"intent": [CODING], "plan": [plan_of("write_file")],
                 "act": [call("write_file", path="r.md", content="# R\n"), final("written")],
                 "summary": [SUMMARY]}
    if reviews:
        responses["quality_review"] = reviews
    return unique_scenario(scripted_llm, responses)


async def wait_done(api, task_id: str, within_s: float = 60.0) -> dict:
    """The task's state once it has ended (a wall-clock bound: a loaded machine is slow)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    state: dict = {}
    while loop.time() < deadline:
        state = (await api.get(f"/tasks/{task_id}")).json()
        if state["status"] in ("completed", "failed", "cancelled"):
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"task did not finish in {within_s} s: {state}")


async def test_session_task_and_resumable_events(api, scripted_llm, workspace):
    model = writing_scenario(scripted_llm)
    session = await new_session(api, workspace, model=model)
    accepted = await api.post("/agent/interactive/task", json={"session_id": session,
                                                               "task": "write r.md"})
    assert accepted.status_code == 202
    task_id = accepted.json()["task_id"]
    state = await wait_done(api, task_id)
    assert state["status"] == "completed" and state["result"]["answer"] == "written"
    assert (workspace / "r.md").exists()

    full = parse_sse((await api.get(f"/tasks/{task_id}/events")).text)
    assert [e["id"] for e in full] == list(range(1, len(full) + 1))  # no gaps
    assert full[-1]["event"] == "completed"
    resumed = parse_sse((await api.get(f"/tasks/{task_id}/events",
                                       headers={"Last-Event-ID": "3"})).text)
    assert [e["id"] for e in resumed] == [e["id"] for e in full[3:]]  # no duplicates

    listed = (await api.get("/tasks", params={"session_id": session})).json()
    assert [t["task_id"] for t in listed] == [task_id]
    assert (await api.get("/tasks", params={"session_id": session, "status": "failed"})
            ).json() == []


async def test_task_stream_answers_sse_until_the_end(api, scripted_llm, workspace):
    session = await new_session(api, workspace, model=writing_scenario(scripted_llm))
    response = await api.post("/agent/interactive/task/stream",
                              json={"session_id": session, "task": "write"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert events[0]["event"] == "intent" and events[-1]["event"] == "completed"
    assert "tool_call" in [e["event"] for e in events]


async def test_prompt_settings_are_inherited_and_overridden(api, scripted_llm, workspace):
    prompt = (await api.post("/prompts", json={
        "name": "writer", "system_prompt": "You write.", "enable_quality_review": True,
        "quality_review_rules": "Needs a summary."})).json()
    session = await new_session(api, workspace, prompt_id=prompt["id"],
                                model=writing_scenario(scripted_llm, [REVIEW_FAIL]))
    first = (await api.post("/agent/interactive/task", json={
        "session_id": session, "task": "write"})).json()["task_id"]
    state = await wait_done(api, first)
    assert state["result"]["stats"]["reviews"]["total"] == 1  # inherited from the prompt
    reviews = (await api.get("/quality-reviews", params={"task_id": first})).json()
    assert reviews[0]["pass"] is False and reviews[0]["reasons"] == ["no summary"]
    assert reviews[0]["session_id"] == session

    session2 = await new_session(api, workspace, prompt_id=prompt["id"],
                                 model=writing_scenario(scripted_llm))
    second = (await api.post("/agent/interactive/task", json={
        "session_id": session2, "task": "write", "enable_quality_review": False})).json()
    state = await wait_done(api, second["task_id"])
    assert state["result"]["stats"]["reviews"]["total"] == 0  # overridden per task
    assert state["result"]["quality_reviews"] == []


async def test_approval_granted_and_conflicts(api, scripted_llm, workspace):
    session = await new_session(api, workspace, model=writing_scenario(scripted_llm),
                                approval_mode="confirm_writes")
    task_id = (await api.post("/agent/interactive/task", json={
        "session_id": session, "task": "write"})).json()["task_id"]
    for _ in range(200):
        state = (await api.get(f"/tasks/{task_id}")).json()
        if state["progress"] and state["progress"]["event_count"] >= 4:
            break
        await asyncio.sleep(0.05)
    unknown = await api.post(f"/tasks/{task_id}/approvals",
                             json={"call_id": "42.0", "approved": True})
    assert unknown.status_code == 409
    granted = None
    for _ in range(100):
        granted = await api.post(f"/tasks/{task_id}/approvals",
                                 json={"call_id": "1.0", "approved": True, "comment": "go"})
        if granted.status_code == 200:
            break
        await asyncio.sleep(0.05)
    assert granted.json() == {"call_id": "1.0", "outcome": "approved"}
    again = await api.post(f"/tasks/{task_id}/approvals",
                           json={"call_id": "1.0", "approved": False})
    assert again.status_code == 409
    assert (await wait_done(api, task_id))["status"] == "completed"
    assert (workspace / "r.md").exists()


async def test_prompt_and_model_config_crud(api):
    created = await api.post("/prompts", json={"name": "p", "system_prompt": "s"})
    assert created.status_code == 201
    key = created.json()["id"]
    patched = await api.patch(f"/prompts/{key}", json={"enable_quality_review": True,
                                                       "quality_review_rules": "r"})
    assert patched.json()["enable_quality_review"] is True
    assert (await api.get(f"/prompts/{key}")).json()["quality_review_rules"] == "r"
    assert any(p["id"] == key for p in (await api.get("/prompts")).json())
    assert (await api.delete(f"/prompts/{key}")).status_code == 204
    assert (await api.get(f"/prompts/{key}")).status_code == 404

    config = await api.post("/model-configs", json={"name": "small", "model": "m"})
    assert config.status_code == 201 and "api_key" not in config.json()
    # A key variable the operator did not set aside (REFLOOP_MODEL_KEY_ENVS) is refused.
    unlisted = await api.post("/model-configs", json={"name": "small", "model": "m",
                                                      "api_key_env": "MY_KEY"})
    assert unlisted.status_code == 422 and "MY_KEY" in unlisted.text
    bad = await api.post("/model-configs", json={"name": "x", "model": "m",
                                                 "api_key": "sk-secret"})
    assert bad.status_code == 422  # a key itself is never accepted


async def test_validation_and_not_found(api, workspace, tmp_path):
    missing_ws = await api.post("/agent/interactive/start",
                                json={"workspace": str(tmp_path / "nope")})
    assert missing_ws.status_code == 422 and "not an existing directory" in missing_ws.text
    bad_body = await api.post("/agent/interactive/start", json={"workspace": 3, "x": 1})
    assert bad_body.status_code == 422 and "detail" in bad_body.json()
    assert (await api.post("/agent/interactive/start", json={
        "workspace": str(workspace), "prompt_id": 999999})).status_code == 404
    assert (await api.post("/agent/interactive/task", json={
        "session_id": "nope", "task": "x"})).status_code == 404
    assert (await api.get("/tasks/nope")).status_code == 404
    assert (await api.get("/tasks/nope/events")).status_code == 404
    assert (await api.post("/tasks/nope/cancel")).status_code == 404
    assert (await api.post("/tasks/nope/approvals", json={"call_id": "1.0", "approved": True})
            ).status_code == 404
    huge = await api.post("/prompts", content=b"x" * 1_100_000,
                          headers={"content-type": "application/json"})
    assert huge.status_code == 413


async def test_bearer_token_guards_everything_but_health(api):
    api.app.state.settings = api.app.state.settings.model_copy(
        update={"refloop_api_token": "s3cret"})
    assert (await api.get("/prompts")).status_code == 401
    assert (await api.get("/prompts", headers={"Authorization": "Bearer wrong"})
            ).status_code == 401
    assert (await api.get("/prompts", headers={"Authorization": "Bearer s3cret"})
            ).status_code == 200
    health = await api.get("/healthz")
    assert health.status_code == 200 and health.json() == {
        "status": "ok", "temporal": True, "database": True, "detail": {}}


async def test_health_reports_a_dead_database(client, settings):
    broken = settings.model_copy(update={
        "database_url": "postgresql+psycopg://postgres@127.0.0.1:1/none"})
    app = create_app(broken, client=client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as http:
        response = await http.get("/healthz")
    assert response.status_code == 503
    assert response.json()["database"] is False and response.json()["temporal"] is True


async def test_cancel_a_waiting_task(api, scripted_llm, workspace):
    session = await new_session(api, workspace, model=writing_scenario(scripted_llm),
                                approval_mode="confirm_all")
    task_id = (await api.post("/agent/interactive/task", json={
        "session_id": session, "task": "write"})).json()["task_id"]
    handle = api.app.state.client.get_workflow_handle(task_id)
    for _ in range(200):  # cancel once it waits for an approval
        with contextlib.suppress(Exception):
            events = await handle.query(AgentTaskWorkflow.events, 0)
            if events and events[-1].type == "approval_required":
                break
        await asyncio.sleep(0.05)
    assert (await api.post(f"/tasks/{task_id}/cancel")).status_code == 202
    assert (await wait_done(api, task_id))["status"] == "cancelled"
    assert (await api.post(f"/tasks/{task_id}/cancel")).status_code == 409


def test_openapi_is_complete(client, settings):
    spec = create_app(settings, client=client).openapi()
    for path in ("/agent/interactive/start", "/agent/interactive/task",
                 "/agent/interactive/task/stream", "/tasks/{task_id}/events",
                 "/tasks/{task_id}/approvals", "/quality-reviews", "/prompts",
                 "/model-configs", "/healthz"):
        assert path in spec["paths"], path
    start = spec["components"]["schemas"]["SessionStart"]
    assert start.get("examples") and "quality_review_rules" in start["properties"]


async def test_code_review_routes(api, scripted_llm, workspace):
    model = unique_scenario(scripted_llm, {
        "code_review": [{"json": {"task_id": "t", "issues": [{
            "id": "ISSUE-001", "relevantFile": "snippet", "existingCode": "eval(x)",
            "suggestionContent": "unsafe eval", "improvedCode": "literal_eval(x)",
            "label": "Security", "suggestionLine": 1, "severity": "Critical"}],
            "summary": {"overall_assessment": "bad"}}}],
        "code_verify": [{"json": {"task_id": "t", "verification_result": {
            "accuracy_check": [], "rule_compliance_check": [],
            "quality_assessment": {"overall_score": 90}}}}],
    })
    started = await api.post("/code-reviews", json={
        "review_type": "snippet", "working_directory": str(workspace), "content": "eval(x)",
        "output_format": "simple", "model": model})
    assert started.status_code == 202
    task_id = started.json()["task_id"]
    for _ in range(200):
        state = (await api.get(f"/code-reviews/{task_id}")).json()
        if state["status"] in ("completed", "failed"):
            break
        await asyncio.sleep(0.05)
    assert state["status"] == "completed"
    assert state["result"]["output"][0]["suggestionContent"] == "unsafe eval"
    assert state["content_record"]["review_result"]["issues"][0]["id"] == "ISSUE-001"
    assert (await api.get("/code-reviews/nope")).status_code == 404
    bad = await api.post("/code-reviews", json={"review_type": "poem",
                                                "working_directory": "/"})
    assert bad.status_code == 422
