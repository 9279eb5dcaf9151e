"""The approval wait over HTTP: a session's `approval_timeout_s` is its tasks' (a task's
own over it), the operator's REFLOOP_APPROVAL_TIMEOUT_S otherwise; unanswered, the task
ends incomplete naming the call; edited arguments a tool would refuse are a 422."""

from __future__ import annotations

import asyncio

from refloop.store.db import store_for
from tests.api.test_api import new_session, writing_scenario


async def reaches(api, task_id: str, status: str) -> dict:
    for _ in range(1200):  # a loaded machine is slow
        if (state := (await api.get(f"/tasks/{task_id}")).json())["status"] == status:
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"{task_id} never reached {status}: {state}")


async def test_a_session_s_wait_is_its_tasks_and_ends_them_incomplete(
        api, api_settings, scripted_llm, workspace):
    session = await new_session(api, workspace, model=writing_scenario(scripted_llm),
                                approval_mode="confirm_writes", approval_timeout_s=1)
    task_id = (await api.post("/agent/interactive/task", json={
        "session_id": session, "task": "write"})).json()["task_id"]
    state = await reaches(api, task_id, "incomplete")
    assert state["error"] == "incomplete: no decision on call 1.0 (write_file r.md) within 1 s"
    assert state["result"]["stop_reason"] == "approval_timeout"
    assert not (workspace / "r.md").exists()
    store = store_for(api_settings.effective_database_url)
    # a task's own wait over its session's; neither: the operator's
    for in_session, in_task, seconds in (
            ({"approval_timeout_s": 30}, {"approval_timeout_s": 7200}, 7200),
            ({"approval_timeout_s": 30}, {}, 30),
            ({}, {}, api_settings.refloop_approval_timeout_s)):
        other = await new_session(api, workspace, model=writing_scenario(scripted_llm),
                                  approval_mode="confirm_writes", **in_session)
        started = (await api.post("/agent/interactive/task", json={
            "session_id": other, "task": "write", **in_task})).json()["task_id"]
        await reaches(api, started, "waiting_approval")
        assert store.get_task(started).input["approval_timeout_s"] == seconds
        refused = await api.post(f"/tasks/{started}/approvals", json={
            "call_id": "1.0", "approved": True, "arguments": {"path": "r.md", "size": 3}})
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"].startswith("invalid arguments for write_file: ")
        assert (await api.post(f"/tasks/{started}/cancel")).status_code == 202
    assert (await api.post("/agent/interactive/start", json={
        "workspace": str(workspace), "approval_timeout_s": 0})).status_code == 422
