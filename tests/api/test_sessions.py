"""Sessions as operators run them (finding 6): fresh workspaces inside the roots, empty
ones removed, and slow clients cut off by the server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from refloop.api.housekeeping import sweep_empty_workspaces
from refloop.api.main import create_app
from refloop.cli.serve import server_config
from refloop.runtime.net import free_port
from refloop.store.db import SessionRecord
from tests.api.test_api import wait_done, writing_scenario


@pytest.fixture
def api_settings(api_settings, tmp_path):
    """REFLOOP_WORKSPACE_ROOTS names a directory that does not hold the data dir."""
    (tmp_path / "projects").mkdir()
    return api_settings.model_copy(update={
        "refloop_workspace_roots": str(tmp_path / "projects"), "refloop_session_ttl": 60.0})


async def test_a_session_without_a_workspace_runs_tasks_under_set_roots(api, scripted_llm):
    started = await api.post("/agent/interactive/start",
                             json={"model": writing_scenario(scripted_llm)})
    assert started.status_code == 201
    task = await api.post("/agent/interactive/task", json={
        "session_id": started.json()["session_id"], "task": "write r.md"})
    assert task.status_code == 202, task.text
    assert (await wait_done(api, task.json()["task_id"]))["status"] == "completed"


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


async def test_empty_fresh_workspaces_are_removed_after_the_ttl(api, scripted_llm):
    store, settings = api.app.state.store, api.app.state.settings
    ids = [(await api.post("/agent/interactive/start", json={})).json()["session_id"]
           for _ in range(6)]
    dirs = [Path(store.get(SessionRecord, i).workspace) for i in ids]
    assert all(d.is_dir() for d in dirs)
    (dirs[0] / "notes.md").write_text("kept: not empty")
    for d in dirs[:5]:
        age(d, 120)  # older than the TTL; the last one is fresh
    assert sweep_empty_workspaces(settings, store) == 4
    assert dirs[0].is_dir() and dirs[5].is_dir()
    assert not any(d.exists() for d in dirs[1:5])
    # A later task of a swept session gets its directory back.
    store.update(SessionRecord, ids[1], {"model": writing_scenario(scripted_llm)})
    task = await api.post("/agent/interactive/task", json={"session_id": ids[1],
                                                           "task": "write r.md"})
    assert task.status_code == 202, task.text
    assert (await wait_done(api, task.json()["task_id"]))["status"] == "completed"
    assert (dirs[1] / "r.md").is_file()


async def test_a_running_tasks_empty_workspace_is_kept(api):
    from refloop.contract.task import RecordTaskInput

    store, settings = api.app.state.store, api.app.state.settings
    session_id = (await api.post("/agent/interactive/start", json={})).json()["session_id"]
    workspace = Path(store.get(SessionRecord, session_id).workspace)
    store.record_task(RecordTaskInput(task_id=f"t-{session_id}", workflow_id=f"t-{session_id}",
                                      session_id=session_id, status="running"))
    age(workspace, 120)
    sweep_empty_workspaces(settings, store)
    assert await asyncio.to_thread(workspace.is_dir)


async def test_slow_clients_are_cut_off(api_settings, tmp_path):
    """Slowloris: connections that trickle headers or a body, or idle after an answer."""
    settings = api_settings.model_copy(update={
        "refloop_http_header_timeout_s": 0.5, "refloop_http_body_timeout_s": 0.5,
        "refloop_http_keep_alive_s": 1.0})
    port = free_port()
    server = uvicorn.Server(server_config(create_app(settings), settings, "127.0.0.1", port))
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(100):
            if server.started:
                break
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/prompts")).status_code == 200  # normal requests work

        def probe(payload: bytes) -> float:
            """Seconds until the server closes the connection (at most 10)."""
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(payload)
                sock.settimeout(10)
                start = time.monotonic()
                while sock.recv(4096):
                    pass
                return time.monotonic() - start

        slow = [b"", b"GET /prompts HTTP/1.1\r\nHost: localhost\r\n",
                b"POST /prompts HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{",
                b"GET /prompts HTTP/1.1\r\nHost: localhost\r\n\r\n",  # then idle
                # answered 413 at its 10,001st member, then the rest of the body never comes
                b"POST /prompts HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                b"\r\nContent-Length: 900000\r\n\r\n[" + b"0," * 20_000]
        # All 125 at once, each on a thread of its own (the default executor's few threads
        # ran them a handful at a time, one deadline after another: 14 s).
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(len(slow) * 25) as pool:
            waits = await asyncio.gather(*(loop.run_in_executor(pool, probe, p)
                                           for p in slow * 25))
        assert max(waits) < 3, waits

        def trickle_after_answer() -> tuple[bytes, float]:
            """A body answered 413 early, whose rest then comes a byte at a time: the
            answer arrives, and the connection is still cut at the body's deadline."""
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(slow[-1])
                sock.settimeout(0.2)
                start, answer = time.monotonic(), b""
                while time.monotonic() - start < 10:
                    try:
                        sock.sendall(b"0")
                        if not (data := sock.recv(4096)):
                            break
                        answer += data
                    except TimeoutError:
                        continue
                    except OSError:  # reset: the server closed while bytes came
                        break
                return answer, time.monotonic() - start

        answer, took = await asyncio.to_thread(trickle_after_answer)
        assert answer.startswith(b"HTTP/1.1 413") and took < 3, (answer[:100], took)
    finally:
        server.should_exit = True
        await serving
