"""A system-prompt preset's spend limit, through the API on the real dev server and the
scripted model: a session started with the preset gives its tasks the preset's limit (a
task there pauses `waiting_for_budget` at it); a session's own limit, or a task's, wins."""

from __future__ import annotations

from tests.api.test_budget import status, until_status
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of
from tests.workflow.test_budget import answered, cent_scenario

ENDED = ("completed", "incomplete", "failed", "cancelled")


async def stop(api, task_id: str) -> None:
    """Cancel a task once its limit is read. The first task took the scenario's only plan,
    so a later one may have failed by itself first: the API then answers 409 (ended)."""
    response = await api.post(f"/tasks/{task_id}/cancel")
    assert response.status_code in (200, 202, 409), response.text
    if response.status_code == 409:
        assert (await status(api, task_id))["status"] in ENDED


async def test_a_presets_limit_is_its_sessions_tasks_default(api, scripted_llm, workspace):
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")],
        "act": [call("list_dir", path="."), call("list_dir", path="."), final("listed")],
        "summary": [SUMMARY]})
    preset = await api.post("/prompts", json={
        "name": "frugal", "system_prompt": "You are brief.", "max_tokens": 6000})
    assert preset.status_code == 201, preset.text
    prompt_id = preset.json()["id"]
    assert preset.json()["max_tokens"] == 6000 and preset.json()["max_cost_usd"] is None
    assert (await api.post("/prompts", json={
        "name": "x", "system_prompt": "y", "max_cost_usd": 0})).status_code == 422

    # No limit named: the preset's
    session = await api.post("/agent/interactive/start", json={
        "workspace": str(workspace), "model": model, "prompt_id": prompt_id})
    assert session.status_code == 201, session.text
    session_id = session.json()["session_id"]
    started = await api.post("/agent/interactive/task", json={
        "session_id": session_id, "task": "list the files"})
    task_id = started.json()["task_id"]
    await until_status(api, task_id, "waiting_for_budget")
    assert answered(scripted_llm, model) == 3  # 2000 tokens each: a fourth passes 6000
    assert (await status(api, task_id))["budget"]["max_tokens"] == 6000
    assert (await api.post(f"/tasks/{task_id}/cancel")).status_code in (200, 202)

    # A task's own limit wins over the preset's
    own = await api.post("/agent/interactive/task", json={
        "session_id": session_id, "task": "list the files", "max_cost_usd": 2.5})
    own_budget = (await status(api, own.json()["task_id"]))["budget"]
    assert own_budget["max_cost_usd"] == 2.5 and own_budget["max_tokens"] == 6000
    await stop(api, own.json()["task_id"])

    # A session's own limit wins over its preset's; a one-call task takes the preset's too
    named = await api.post("/agent/interactive/start", json={
        "workspace": str(workspace), "model": model, "prompt_id": prompt_id,
        "max_tokens": 50_000})
    in_named = await api.post("/agent/interactive/task", json={
        "session_id": named.json()["session_id"], "task": "list the files"})
    assert (await status(api, in_named.json()["task_id"]))["budget"]["max_tokens"] == 50_000
    await stop(api, in_named.json()["task_id"])
    one_call = await api.post("/tasks", json={
        "workspace": str(workspace), "task": "list the files", "model": model,
        "prompt_id": prompt_id})
    assert one_call.status_code == 202, one_call.text
    assert (await status(api, one_call.json()["task_id"]))["budget"]["max_tokens"] == 6000
    await stop(api, one_call.json()["task_id"])

    # Cleared with null: no default any more
    cleared = await api.patch(f"/prompts/{prompt_id}", json={"max_tokens": None})
    assert cleared.status_code == 200 and cleared.json()["max_tokens"] is None
