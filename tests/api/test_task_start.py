"""POST /tasks: a task in one call, against the real Temporal dev server, PostgreSQL and the
scripted model; hostile bodies are refused with a clear 4xx and start nothing."""

from __future__ import annotations

import asyncio

from sqlmodel import Session, select

from refloop.store.db import SessionRecord, TaskRecord
from tests.api.test_api import new_session, wait_done, writing_scenario


def rows(api) -> tuple[int, int]:
    """(sessions, tasks) in the API's database."""
    with Session(api.app.state.store.engine) as db:
        return (len(db.exec(select(SessionRecord)).all()),
                len(db.exec(select(TaskRecord)).all()))


async def workflows_started(client, task_queue: str) -> int:
    return len([wf async for wf in client.list_workflows(f'TaskQueue = "{task_queue}"')])


async def test_one_call_starts_a_task_in_a_new_session(api, scripted_llm, workspace):
    model = writing_scenario(scripted_llm)
    started = await api.post("/tasks", json={"workspace": str(workspace), "task": "write r.md",
                                             "model": model, "approval_mode": "auto"})
    assert started.status_code == 202, started.text
    body = started.json()
    assert body["task_id"] == body["workflow_id"] and body["session_id"].startswith("sess-")
    state = await wait_done(api, body["task_id"])
    assert state["status"] == "completed" and state["session_id"] == body["session_id"]
    assert (workspace / "r.md").read_text() == "# R\n"
    # The session it made takes more tasks the two-call way, which stays.
    again = await api.post("/agent/interactive/task", json={
        "session_id": body["session_id"], "task": "again"})
    assert again.status_code == 202, again.text


async def test_one_call_in_an_existing_session_keeps_its_settings(api, scripted_llm,
                                                                 workspace):
    model = writing_scenario(scripted_llm)
    session = await new_session(api, workspace, model=model)
    started = await api.post("/tasks", json={"session_id": session, "task": "write r.md",
                                             "max_iterations": 5})
    assert started.status_code == 202, started.text
    state = await wait_done(api, started.json()["task_id"])
    assert state["status"] == "completed" and state["model"] == model
    # What the session fixes cannot be changed per task: a clear 422, nothing started.
    before = rows(api)
    moved = await api.post("/tasks", json={"session_id": session, "task": "x",
                                           "workspace": "/tmp", "model": "other"})
    assert moved.status_code == 422
    assert "model, workspace: set by session" in moved.json()["detail"]
    unknown = await api.post("/tasks", json={"session_id": "sess-000000000000", "task": "x"})
    assert unknown.status_code == 404 and "session sess-000000000000" in unknown.text
    assert rows(api) == before


async def test_hostile_bodies_start_nothing(api, client, task_queue, tmp_path):
    outside = tmp_path.parent  # a real directory, but above REFLOOP_WORKSPACE_ROOTS
    (tmp_path / "ws").mkdir(exist_ok=True)
    before = rows(api)
    cases = [
        ({"workspace": str(outside), "task": "x"}, 422, "REFLOOP_WORKSPACE_ROOTS"),
        ({"workspace": "/etc", "task": "x"}, 422, "workspace"),
        ({"workspace": str(tmp_path / "ws" / ".." / ".."), "task": "x"}, 422, "workspace"),
        ({"workspace": str(tmp_path / "ws")}, 422, "task"),  # no task
        ({"workspace": str(tmp_path / "ws"), "task": ""}, 422, "task"),
        ({"workspace": str(tmp_path / "ws"), "task": "x", "rm": "-rf"}, 422, "rm"),
        ({"workspace": str(tmp_path / "ws"), "task": "x", "max_iterations": "5"}, 422,
         "max_iterations"),
        ({"workspace": str(tmp_path / "ws"), "task": "x", "session_id": "../../etc"}, 422,
         "session_id"),
        ({"workspace": str(tmp_path / "ws"), "task": "x", "mcp_servers": ["nosuch"]}, 422,
         "nosuch"),
        ({"task": "x", "prompt_id": 2_147_483_647}, 404, "prompt"),
    ]
    for body, code, said in cases:
        answer = await api.post("/tasks", json=body)
        assert answer.status_code == code, (body, answer.text)
        assert said in answer.text, (body, answer.text)
    not_json = await api.post("/tasks", content=b"{", headers={"content-type":
                                                                "application/json"})
    assert not_json.status_code == 422
    assert rows(api) == before
    await asyncio.sleep(0.5)  # visibility lags a start by a moment
    assert await workflows_started(client, task_queue) == 0
