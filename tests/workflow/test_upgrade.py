"""Upgrading with tasks in flight, without a patch: tasks on build A in five states (mid model
call, mid tool call, waiting for approval, waiting for the model, waiting for a host) are
handed over (`refloop drain`), A stops, and build B, a copy of the package whose agent loop
schedules a row write before each model turn, finishes every one of them. A's histories do
not replay on B (the change is real), yet no run fails a workflow task."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from refloop.contract.activity_io import ApprovalDecision, ModelEndpoint
from refloop.contract.task import TaskInput
from refloop.llm.scripted import ScriptedLLMServer
from refloop.store import hosts as host_rows
from refloop.store.db import store_for
from refloop.worker.handover import drain, take_over
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    HISTORIES,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    result_of,
    start,
    wait_until,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Build B's change: a row write before each model turn (a local activity's marker where A's
# history has the turn's model call).
LOOP_LINE = '            self.state.stats = self.state.stats.model_copy(update={"iterations": ' \
            'iteration})\n'
# Runs `refloop` from the copy, not from the editable install.
BOOT = ("import runpy, sys; "
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
        "sys.path.insert(0, sys.argv[1]); sys.argv = ['refloop', *sys.argv[2:]]; "
        "runpy.run_module('refloop', run_name='__main__', alter_sys=True)")


def build_b(into: Path) -> Path:
    """A second copy of the package, laid out as installed, its loop changed."""
    package = into / "refloop"
    shutil.copytree(REPO / "refloop", package, ignore=shutil.ignore_patterns("__pycache__"))
    for layer in ("workflows", "activities", "worker", "api", "cli"):
        shutil.copytree(REPO / layer, package / layer,
                        ignore=shutil.ignore_patterns("__pycache__"))
    agent = package / "workflows" / "agent.py"
    source = agent.read_text()
    assert source.count(LOOP_LINE) == 1
    agent.write_text(source.replace(
        LOOP_LINE, LOOP_LINE + "            await self._record(self._visible_status())\n"))
    return into


def run_b(copy: Path, env: dict[str, str], *args: str, **popen: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BOOT, str(copy), *args], env=env,
                            cwd=copy, start_new_session=True, **popen)  # type: ignore[arg-type]


def nondeterministic(history) -> list[str]:
    return [e.workflow_task_failed_event_attributes.failure.message for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]


async def status(handle) -> str:
    try:
        return (await handle.query(AgentTaskWorkflow.progress,
                                   rpc_timeout=timedelta(seconds=10))).status
    except Exception:  # noqa: BLE001 - between runs, or no worker yet
        return "unknown"


async def test_tasks_in_five_states_finish_on_a_build_whose_loop_differs(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    # A stuck phase fails the test where it stuck, not the suite's whole run.
    async with asyncio.timeout(420):
        await five_states(temporal_server, client, settings, scripted_llm, tmp_path,
                          task_queue)


async def five_states(temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    root = tmp_path / "root"
    root.mkdir()
    host_b = f"hb-{uuid.uuid4().hex[:6]}"
    store = store_for(settings.effective_database_url)
    # Host B is known (it beat once) but none of its workers runs until build B starts.
    await asyncio.to_thread(host_rows.beat, store, host_b, [str(root)], [], "x@hb", 0.01,
                            host_rows.utcnow())
    settings_a = settings.model_copy(update={
        "refloop_build_id": "build-a", "refloop_host_id": f"ha-{uuid.uuid4().hex[:6]}",
        "refloop_workspace_roots": str(root), "refloop_model_probe_s": 1.0,
        "refloop_data_dir": tmp_path / "a-data"})
    spaces = {name: root / name for name in ("model", "tool", "approval", "outage", "host")}
    for space in spaces.values():
        space.mkdir()

    def writes(*names: str, first: dict | None = None, slow: int = 0) -> str:
        acts = [call("write_file", path=n, content=f"{n}\n") for n in names]
        if slow:  # the second model turn takes this long
            acts[1] = {**acts[1], "delay_ms": slow}
        return unique_scenario(scripted_llm, {
            "intent": [CODING], "plan": [plan_of("write_file")],
            "act": [*([first] if first else []), *acts, final("done")],
            "summary": [SUMMARY]})

    down = ScriptedLLMServer()
    down.__enter__()
    outage_model = unique_scenario(down, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="d1.txt", content="d1.txt\n"),
                call("write_file", path="d2.txt", content="d2.txt\n"), final("done")],
        "summary": [SUMMARY]})
    common = {"enable_reflection": False, "enable_quality_review": False}
    inputs = {
        "model": TaskInput(task="write a and b", workspace=str(spaces["model"]),
                           model=writes("a.txt", "b.txt", slow=6000), **common),
        "tool": TaskInput(task="wait, then write c", workspace=str(spaces["tool"]),
                          model=writes("c.txt", first=call("run_cmd", command="sleep 4")),
                          **common),
        "approval": TaskInput(task="write e", workspace=str(spaces["approval"]),
                              model=writes("e.txt"), approval_mode="confirm_writes",
                              **common),
        "outage": TaskInput(task="write d1 and d2", workspace=str(spaces["outage"]),
                            endpoint=ModelEndpoint(model=outage_model, base_url=down.base_url),
                            **common),
        "host": TaskInput(task="write f", workspace=str(spaces["host"]), host=host_b,
                          host_wait_s=1, model=writes("f.txt"), **common),
    }
    proc = None
    try:
        async with build_worker(client, settings_a, task_queue):
            handles = {name: await start(client, task_queue, inp)
                       for name, inp in inputs.items()}
            await wait_until(lambda: (spaces["outage"] / "d1.txt").exists(), "outage: d1")
            down.set_fault(status=503)
            await wait_until(lambda: (spaces["model"] / "a.txt").exists(), "model: a")
            for name, want in (("approval", "waiting_approval"),
                               ("outage", "waiting_for_model"), ("host", "waiting_for_host")):
                await wait_until(lambda h=handles[name], w=want: _is(h, w), f"{name}: {want}",
                                 timeout_s=60)
            tool_events = await handles["tool"].query(AgentTaskWorkflow.events, 0)
            assert any(e.type == "tool_call" and e.data["tool"] == "run_cmd"
                       for e in tool_events)
            assert not (spaces["model"] / "b.txt").exists()  # its model call is in flight
            report = await drain(client, "build-a", task_queue, timeout_s=60, poll_s=0.5)
            assert not report.refused, report.refused
            names = {h.id: name for name, h in handles.items()}
            assert not report.still_running, [
                (names.get(i), await status(client.get_workflow_handle(i)))
                for i in report.still_running]
            assert set(report.asked) >= {h.id for h in handles.values()}
            # The first run of each task, as build A recorded it (its last is parked).
            histories_a = {name: await client.get_workflow_handle(
                h.id, run_id=h.first_execution_run_id).fetch_history()
                for name, h in handles.items()}
        # The change is real: A's history of a run does not replay on build B.
        copy = build_b(tmp_path / "build-b")
        recorded = tmp_path / "model-run-a.json"
        recorded.write_text(dump_history(histories_a["model"]))
        env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server,
               "REFLOOP_TASK_QUEUE": task_queue, "OPENAI_BASE_URL": settings.openai_base_url,
               "OPENAI_API_KEY": "test", "DATABASE_URL": settings.database_url,
               "REFLOOP_DATA_DIR": str(tmp_path / "b-data"), "REFLOOP_HOST_ID": host_b,
               "REFLOOP_WORKSPACE_ROOTS": str(root), "REFLOOP_BUILD_ID": "build-b",
               "REFLOOP_TAKE_OVER_EVERY_S": "1", "REFLOOP_GRACEFUL_SHUTDOWN_S": "5"}
        replay = run_b(copy, env, "replay", str(recorded), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
        said = replay.communicate(timeout=120)[0].decode()
        assert replay.returncode != 0, said
        assert "nondetermin" in said.lower() or "non-determin" in said.lower(), said
        down.set_fault()  # the endpoint is back
        log = (tmp_path / "b.log").open("ab")
        proc = run_b(copy, env, "worker", stdout=subprocess.DEVNULL, stderr=log)
        await wait_until(lambda: _is(handles["approval"], "waiting_approval"),
                         "approval asked again on B", timeout_s=90)
        pending = [e for e in await handles["approval"].query(AgentTaskWorkflow.events, 0)
                   if e.type == "approval_required"][-1]
        await handles["approval"].execute_update(
            AgentTaskWorkflow.decide_approval,
            ApprovalDecision(call_id=pending.data["call_id"], approved=True))
        results = {name: await asyncio.wait_for(result_of(h), 120)
                   for name, h in handles.items()}
        histories_b = {name: await h.fetch_history() for name, h in handles.items()}
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        down.__exit__(None, None, None)
    expected = {"model": ["a.txt", "b.txt"], "tool": ["c.txt"], "approval": ["e.txt"],
                "outage": ["d1.txt", "d2.txt"], "host": ["f.txt"]}
    for name, files in expected.items():
        result = results[name]
        assert result.status == "completed", (name, result.answer)
        assert sorted(p.name for p in spaces[name].iterdir()) == files, name
        assert all((spaces[name] / f).read_text() == f"{f}\n" for f in files), name
        taken = events_of(result, "taken_over")
        assert taken and taken[0]["from_build"] == "build-a", name
        assert not nondeterministic(histories_b[name]), name
        # B ran the last run: its row write before a model turn is in the history
        markers = [e for e in histories_b[name].events
                   if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
        assert markers, name
    assert results["approval"].stats.tool_calls >= 1
    assert store.get_task(handles["host"].id).status == "completed"


async def _is(handle, wanted: str) -> bool:
    return await status(handle) == wanted


async def test_golden_a_task_handed_over_while_it_waits_is_taken_over_by_another_build(
        client, settings, scripted_llm, workspace, task_queue):
    """The same code on both sides (two build ids): the hand-over's continue-as-new and the
    parked run's take-over are golden histories (`make histories`)."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="a"), final("done")],
        "summary": [SUMMARY]})
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue, TaskInput(
            task="write a", workspace=str(workspace), model=model,
            approval_mode="confirm_writes", enable_reflection=False))
        await wait_until(lambda: _is(handle, "waiting_approval"), "waiting for approval")
        report = await drain(client, "build-a", task_queue, timeout_s=30, poll_s=0.2)
        assert report.asked == [handle.id] and not report.still_running
        assert await status(handle) == "handed_over"
        assert await take_over(client, "build-a", task_queue) == 1  # its own build: ignored
        await asyncio.sleep(1)
        assert await status(handle) == "handed_over"
        assert await take_over(client, "build-b", task_queue) == 1
        await wait_until(lambda: _is(handle, "waiting_approval"), "asked again", 30)
        events = await handle.query(AgentTaskWorkflow.events, 0)
        assert [e.type for e in events].count("approval_required") == 1  # the same call
        await handle.execute_update(AgentTaskWorkflow.decide_approval,
                                    ApprovalDecision(call_id="1.0", approved=True))
        result = await result_of(handle)
        first = await client.get_workflow_handle(
            handle.id, run_id=handle.first_execution_run_id).fetch_history()
        last = await handle.fetch_history()
    assert result.status == "completed" and (workspace / "a.txt").read_text() == "a"
    assert [e["from_build"] for e in events_of(result, "taken_over")] == ["build-a"]
    assert events_of(result, "handed_over")
    assert store_for(settings.effective_database_url).get_task(handle.id).status == "completed"
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):  # `make histories`
        (HISTORIES / "agent_task_handed_over.json").write_text(dump_history(first))
        (HISTORIES / "agent_task_taken_over.json").write_text(dump_history(last))
    for history in (first, last):
        assert not nondeterministic(history)
