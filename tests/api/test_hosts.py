"""GET /hosts and the host of a session's workspace: the one host holding it, live or not,
or a 422 naming the candidates; a named host must be known and hold it. Once the fleet has
hosts, no session goes without one."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from refloop.store import hosts as host_rows
from refloop.store.db import store_for, utcnow


@pytest.fixture
def registered(settings) -> Iterator:
    """register(host, roots, beat_s): a host row; every one is forgotten afterwards."""
    store = store_for(settings.effective_database_url)
    names: list[str] = []

    def register(name: str, roots: list[str], beat_s: float = 60.0) -> str:
        host = f"{name}-{uuid.uuid4().hex[:6]}"
        host_rows.beat(store, host, roots, [f"q@{host}"], f"1@{host}", beat_s, utcnow())
        names.append(host)
        return host

    yield register
    for host in names:
        host_rows.forget(store, host)


async def test_hosts_are_listed_with_their_roots_and_liveness(api, registered, tmp_path):
    live = registered("live", [str(tmp_path / "a")])
    gone = registered("gone", [str(tmp_path / "b")], beat_s=0.05)
    await asyncio.sleep(0.3)  # three beats missed
    listed = {h["host_id"]: h for h in (await api.get("/hosts")).json()}
    assert listed[live]["live"] and listed[live]["roots"] == [str(tmp_path / "a")]
    assert listed[live]["task_queues"] == [f"q@{live}"] and listed[live]["last_seen"]
    assert listed[gone]["live"] is False


async def start(api, workspace, host=None):
    body = {"workspace": str(workspace)}
    if host is not None:
        body["host"] = host
    return await api.post("/agent/interactive/start", json=body)


async def test_a_workspace_gets_the_one_live_host_holding_it(api, registered, tmp_path):
    root_a, root_b = tmp_path / "a", tmp_path / "b"
    (root_a / "ws").mkdir(parents=True)
    root_b.mkdir()
    a = registered("a", [str(root_a)])
    registered("b", [str(root_b)])
    response = await start(api, root_a / "ws")
    assert response.status_code == 201, response.text
    assert response.json()["host"] == a


async def test_a_workspace_held_only_by_a_dead_host_is_placed_on_it(api, registered,
                                                                    tmp_path):
    """Host c is down; a session for a workspace under c's roots was answered 201 with
    `"host": null`, and its task's workspace activities ran on host b's worker. Now it is
    c's: its task waits for c (`waiting_for_host`) and never runs on another host."""
    (tmp_path / "c" / "ws").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    registered("b", [str(tmp_path / "b")])
    down = registered("c", [str(tmp_path / "c")], beat_s=0.05)
    await asyncio.sleep(0.3)  # three beats missed: c is not live
    assert not next(h for h in (await api.get("/hosts")).json() if h["host_id"] == down)["live"]
    response = await start(api, tmp_path / "c" / "ws")
    assert response.status_code == 201, response.text
    assert response.json()["host"] == down


async def test_once_the_fleet_has_hosts_no_session_goes_without_one(api, registered,
                                                                    tmp_path):
    """A workspace inside the API's own roots but no host's was placed with no host, to run
    on whichever worker; with hosts registered it is a 422 naming them. So is a session with
    no workspace while this machine is not one of the hosts (its fresh directory would be
    on no host's disk)."""
    (tmp_path / "mine").mkdir()  # inside the API's roots (tmp_path)
    other = registered("other", [str(tmp_path / "elsewhere")])
    unheld = await start(api, tmp_path / "mine")
    assert unheld.status_code == 422 and "no host holds" in unheld.text
    assert other in unheld.text
    fresh = await api.post("/agent/interactive/start", json={})
    assert fresh.status_code == 422 and "name a workspace" in fresh.text, fresh.text


async def test_with_no_host_registered_sessions_stay_on_this_machine(api, tmp_path):
    (tmp_path / "mine").mkdir()
    response = await start(api, tmp_path / "mine")
    assert response.status_code == 201 and response.json()["host"] is None
    fresh = await api.post("/agent/interactive/start", json={})
    assert fresh.status_code == 201 and fresh.json()["host"] is None


async def test_no_host_or_several_is_a_422_naming_the_candidates(api, registered, tmp_path):
    shared = tmp_path / "shared"
    (shared / "ws").mkdir(parents=True)
    first = registered("one", [str(shared)])
    second = registered("two", [str(shared)])
    ambiguous = await start(api, shared / "ws")
    assert ambiguous.status_code == 422
    assert first in ambiguous.text and second in ambiguous.text and "several" in ambiguous.text
    nowhere = await start(api, tmp_path / "nowhere")
    assert nowhere.status_code == 422 and "no host holds" in nowhere.text
    assert first in nowhere.text  # the candidates are named
    chosen = await start(api, shared / "ws", host=second)  # a named host wins
    assert chosen.status_code == 201 and chosen.json()["host"] == second


async def test_a_home_of_a_user_this_machine_lacks_is_a_422_not_a_500(api, registered,
                                                                       tmp_path):
    registered("a", [str(tmp_path)])
    response = await api.post("/agent/interactive/start",
                              json={"workspace": "~no-such-user-here/ws"})
    assert response.status_code == 422 and "no such user's home" in response.text


async def test_a_named_host_must_be_known_and_hold_the_workspace(api, registered, tmp_path):
    (tmp_path / "a" / "ws").mkdir(parents=True)
    a = registered("a", [str(tmp_path / "a")])
    unknown = await start(api, tmp_path / "a" / "ws", host="no-such-host")
    assert unknown.status_code == 422 and "unknown host 'no-such-host'" in unknown.text
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = await start(api, elsewhere, host=a)
    assert outside.status_code == 422 and "does not hold" in outside.text


async def test_a_task_waiting_for_its_host_shows_it_everywhere_and_can_be_cancelled(
        api, registered, scripted_llm, tmp_path):
    """The session's host goes into the task; with no worker of it, the task is
    `waiting_for_host` in GET /tasks/{id}, in ?status= and over SSE; cancel still works."""
    from tests.llm_fixtures import unique_scenario
    from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, wait_until

    api.app.state.settings = api.app.state.settings.model_copy(
        update={"refloop_host_wait_s": 1.0})
    (tmp_path / "w" / "ws").mkdir(parents=True)
    host = registered("w", [str(tmp_path / "w")])  # known and live; no worker polls it
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="a"), final("ok")],
        "summary": [SUMMARY]})
    session = (await api.post("/agent/interactive/start", json={
        "workspace": str(tmp_path / "w" / "ws"), "host": host, "model": model})).json()
    assert session["host"] == host
    task_id = (await api.post("/agent/interactive/task", json={
        "session_id": session["session_id"], "task": "write a.txt"})).json()["task_id"]

    async def status() -> str:
        return (await api.get(f"/tasks/{task_id}")).json()["status"]

    await wait_until(lambda: _is(status(), "waiting_for_host"), "waiting_for_host", 30)
    state = (await api.get(f"/tasks/{task_id}")).json()
    assert state["progress"]["status"] == "waiting_for_host"
    listed = (await api.get("/tasks", params={"status": "waiting_for_host"})).json()
    assert task_id in [t["task_id"] for t in listed]
    assert (await api.post(f"/tasks/{task_id}/cancel")).status_code == 202
    await wait_until(lambda: _is(status(), "cancelled"), "cancelled", 30)
    # Over SSE (in-process transport: read once the stream has ended)
    events = (await api.get(f"/tasks/{task_id}/events")).text
    assert "event: waiting_for_host" in events and "cancelled by request" in events
    assert not (tmp_path / "w" / "ws" / "a.txt").exists()


async def _is(value, expected: str) -> bool:
    return await value == expected


async def start_review(api, workdir, host=None, review_type="file"):
    body = {"review_type": review_type, "working_directory": str(workdir)}
    if review_type == "file":
        body["file_paths"] = ["m.py"]
    else:
        body["content"] = "eval(x)"
    if host is not None:
        body["host"] = host
    return await api.post("/code-reviews", json=body)


async def test_a_file_review_gets_the_host_holding_its_directory(api, registered, tmp_path):
    """As for a session: the one live host holding it, a named host after the roots check,
    and the same 422s; the review's input names its host."""
    from refloop.store.db import store_for

    (tmp_path / "a" / "repo").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    a = registered("a", [str(tmp_path / "a")])
    first = registered("one", [str(tmp_path / "shared")])
    registered("two", [str(tmp_path / "shared")])
    placed = await start_review(api, tmp_path / "a" / "repo")
    assert placed.status_code == 202, placed.text
    row = store_for(api.app.state.settings.effective_database_url).get_task(
        placed.json()["task_id"])
    assert row.input["host"] == a and row.input["working_directory"] == str(
        tmp_path / "a" / "repo")
    await api.app.state.client.get_workflow_handle(placed.json()["workflow_id"]).terminate()
    refusals = {
        "unknown host 'no-such-host'": await start_review(api, tmp_path / "a" / "repo",
                                                          host="no-such-host"),
        "does not hold": await start_review(api, tmp_path / "shared", host=a),
        "several hosts": await start_review(api, tmp_path / "shared"),
        "name an absolute path": await start_review(api, "repo", host=first),
    }
    for expected, response in refusals.items():
        assert response.status_code == 422 and expected in response.text, response.text
    # A snippet carries its content: no host's disk is read, and none is named.
    snippet = await start_review(api, tmp_path / "shared", review_type="snippet")
    assert snippet.status_code == 202, snippet.text
    assert store_for(api.app.state.settings.effective_database_url).get_task(
        snippet.json()["task_id"]).input["host"] is None


async def test_moving_a_waiting_task_to_another_host(api, registered, scripted_llm, tmp_path):
    """POST /tasks/{id}/move: 422 for a host that is unknown, not live or not holding the
    workspace; 409 for a task on that host already or ended; the move itself names the new
    host in the task's events and the session."""
    from tests.llm_fixtures import unique_scenario
    from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, wait_until

    api.app.state.settings = api.app.state.settings.model_copy(
        update={"refloop_host_wait_s": 1.0})
    root = tmp_path / "w"
    (root / "ws").mkdir(parents=True)
    old = registered("old", [str(root)])
    new = registered("new", [str(root)])
    elsewhere = registered("elsewhere", [str(tmp_path / "other")])
    stale = registered("stale", [str(root)], beat_s=0.05)
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="a"), final("ok")],
        "summary": [SUMMARY]})
    session = (await api.post("/agent/interactive/start", json={
        "workspace": str(root / "ws"), "host": old, "model": model})).json()
    task_id = (await api.post("/agent/interactive/task", json={
        "session_id": session["session_id"], "task": "write a.txt"})).json()["task_id"]

    async def status() -> str:
        return (await api.get(f"/tasks/{task_id}")).json()["status"]

    await wait_until(lambda: _is(status(), "waiting_for_host"), "waiting_for_host", 30)

    async def move(host, task=task_id):
        return await api.post(f"/tasks/{task}/move", json={"host": host})

    refusals = {"unknown host 'no-such-host'": await move("no-such-host"),
                "is not live": await move(stale),
                "does not hold": await move(elsewhere)}
    for expected, response in refusals.items():
        assert response.status_code == 422 and expected in response.text, response.text
    for hostile in ({"host": "../x"}, {"host": new, "extra": 1}, {"host": 7}):
        assert (await api.post(f"/tasks/{task_id}/move", json=hostile)).status_code == 422
    assert (await move(new, "task-nosuch")).status_code == 404
    # Moving needed the same absolute path on the new host: the copy's path is named now,
    # checked against the new host's roots only (the API need not see it).
    copy = tmp_path / "w" / "copy-on-new"
    for workspace, expected in ((str(tmp_path / "other" / "ws"), "does not hold"),
                                ("copy-on-new", "name an absolute path"),
                                ("/proc/1", "system directory")):
        refused = await api.post(f"/tasks/{task_id}/move",
                                 json={"host": new, "workspace": workspace})
        assert refused.status_code == 422 and expected in refused.text, refused.text
    moved = await api.post(f"/tasks/{task_id}/move", json={"host": new, "workspace": str(copy)})
    assert moved.status_code == 200, moved.text
    assert moved.json() == {"task_id": task_id, "host": new, "moved_from": old,
                            "workspace": str(copy)}
    again = await move(new)
    # the move ended its wait for a host: nothing of it waits to be moved any more
    assert again.status_code == 409 and "not waiting_for_host" in again.text
    sessions = store_for(api.app.state.settings.effective_database_url)
    from refloop.store.db import SessionRecord
    moved_session = sessions.get(SessionRecord, session["session_id"])
    assert moved_session.host == new and moved_session.workspace == str(copy)
    assert (await api.post(f"/tasks/{task_id}/cancel")).status_code == 202
    await wait_until(lambda: _is(status(), "cancelled"), "cancelled", 30)
    events = (await api.get(f"/tasks/{task_id}/events")).text
    assert "event: moved_to_host" in events and str(copy) in events
    ended = await move(new)
    assert ended.status_code == 409 and "already ended" in ended.text
