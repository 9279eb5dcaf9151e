"""MCP tool servers as durable tools, against real servers nobody here wrote:
mcp-server-git and mcp-server-time (test dependencies), started by the worker's pool."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from refloop.contract.activity_io import ApprovalDecision
from refloop.contract.task import TaskInput
from refloop.mcp.config import tool_name
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    SUMMARY,
    call,
    events_of,
    final,
    result_of,
    run_task,
    run_with_history,
    start,
)
from tests.workflow.test_crash import spawn_worker, wait_for_event

BIN = Path(sys.executable).parent
SECRET = "s3cr3t-mcp-value-7d1f"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def repo(workspace: Path) -> Path:
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "config", "user.email", "t@example.com")
    git(workspace, "config", "user.name", "Tester")
    (workspace / "README.md").write_text("hello\n")
    git(workspace, "add", "README.md")
    git(workspace, "commit", "-q", "-m", "first commit: add the readme")
    (workspace / "new.txt").write_text("untracked\n")
    return workspace


@pytest.fixture
def mcp_settings(settings, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("REFLOOP_TEST_MCP_SECRET", SECRET)
    config = {"mcpServers": {
        "git": {"command": str(BIN / "mcp-server-git"),
                "env": {"GIT_TEST_TOKEN": "${REFLOOP_TEST_MCP_SECRET}"},
                "confirm": ["git_commit", "git_add"]},
        # The server's readOnlyHint is not taken on its word: the operator vouches for its
        # tools, as a deployment would
        "time": {"command": str(BIN / "mcp-server-time"), "timeout_s": 20,
                 "properties": {"get_current_time": {"read_only": True},
                                "convert_time": {"read_only": True}}},
    }}
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(config))
    return settings.model_copy(update={"refloop_mcp_config": str(path)})


def history_text(history) -> str:
    """The history as JSON with every payload decoded (they are base64 in the JSON form)."""
    decoded = []

    def walk(value):
        if isinstance(value, dict):
            if "data" in value and isinstance(value["data"], str) and "metadata" in value:
                decoded.append(base64.b64decode(value["data"]).decode("utf-8", "replace"))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    raw = history.to_json_dict()
    walk(raw)
    assert decoded, "no payloads found"
    return json.dumps(raw) + "\n".join(decoded)


def tool_messages(request: dict) -> list[str]:
    return [m.get("content") or "" for m in request["body"]["messages"] if m["role"] == "tool"]


async def test_git_server_tools_reach_the_model_golden(client, mcp_settings, scripted_llm, repo,
                                                task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [
            call("git__git_status", repo_path=str(repo)),
            call("git__git_log", repo_path=str(repo), max_count=5),
            final("one commit, one untracked file"),
        ],
        "summary": [SUMMARY],
    })
    inp = TaskInput(task="describe the repository", workspace=str(repo), model=model,
                    enable_planning=False, enable_reflection=False, mcp_servers=["git"])
    result, history = await run_with_history(client, mcp_settings, task_queue, inp)
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        (Path(__file__).parent.parent / "histories" / "mcp_git_tools.json").write_text(
            dump_history(history))

    assert result.status == "completed", result.answer
    listed = events_of(result, "mcp_tools")[0]
    assert "git__git_status" in listed["tools"] and "git__git_log" in listed["tools"]
    results = events_of(result, "tool_result")
    assert [r["tool"] for r in results] == ["git__git_status", "git__git_log"]
    assert all(r["ok"] for r in results), results
    acts = scripted_llm.requests(model=model, purpose="act")
    # The server's schemas went to the model as they are, under namespaced names.
    tools = {t["function"]["name"]: t["function"] for t in acts[0]["body"]["tools"]}
    assert tools["git__git_status"]["parameters"]["required"] == ["repo_path"]
    assert "read_file" in tools  # built-ins stay
    # The answers reached the model.
    assert "new.txt" in tool_messages(acts[1])[-1]
    assert "first commit: add the readme" in tool_messages(acts[2])[-1]
    # The secret in the server's env was resolved on the worker only.
    text = history_text(history)
    assert "git__git_status" in text  # payloads are decoded: the check below can fail
    assert SECRET not in text and "${REFLOOP_TEST_MCP_SECRET}" not in text
    assert "refloop.mcp.list_tools" in text and "refloop.mcp.call_tool" in text
    assert '"git: git_status"' in text and '"git: git_log"' in text  # Web UI summaries


async def test_stdio_server_runs_in_the_sandbox(client, mcp_settings, scripted_llm, repo,
                                                tmp_path, task_queue):
    outside = tmp_path / "outside"
    outside.mkdir()
    git(outside, "init", "-q")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [call("git__git_status", repo_path=str(outside)),
                call("git__git_status", repo_path=str(repo)), final("done")],
        "summary": [SUMMARY],
    })
    result = await run_task(client, mcp_settings, task_queue, model, repo,
                            enable_planning=False, mcp_servers=["git"])
    outside_result, inside_result = events_of(result, "tool_result")
    # Only the workspace is bound: a repository beside it does not exist for the server.
    assert not outside_result["ok"], outside_result
    assert inside_result["ok"], inside_result


async def test_bad_arguments_and_tool_errors_go_back_to_the_model(
        client, mcp_settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [
            call("time__get_current_time"),  # `timezone` is required
            call("time__get_current_time", timezone="Nowhere/Atlantis"),  # isError
            final("gave up"),
        ],
        "summary": [SUMMARY],
    })
    result = await run_task(client, mcp_settings, task_queue, model, workspace,
                            enable_planning=False, mcp_servers=["time"])
    # The model gave up on a coding task and changed nothing: not reported as done.
    assert result.status == "incomplete" and result.answer == "gave up", result.answer
    refused, failed = events_of(result, "tool_result")
    assert not refused["ok"] and refused["error"].startswith("E_INVALID_ARGS")
    assert "'timezone' is a required property" in refused["error"]
    assert not failed["ok"] and failed["error"].startswith("E_TOOL")
    assert "Nowhere/Atlantis" in failed["error"]
    # The refused and failed calls were not retried: one attempt each.
    assert result.stats.tool_errors == 2


async def test_confirm_tool_waits_for_approval(client, mcp_settings, scripted_llm, repo,
                                               task_queue):
    (repo / "new.txt").write_text("to add\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [call("git__git_add", repo_path=str(repo), files=["new.txt"]),
                final("not added")],
        "summary": [SUMMARY],
    })
    inp = TaskInput(task="stage new.txt", workspace=str(repo), model=model,
                    enable_planning=False, enable_reflection=False, mcp_servers=["git"],
                    approval_timeout_s=1)
    result, _ = await run_with_history(client, mcp_settings, task_queue, inp)
    # Unanswered, nothing staged: the task is not done, and says which call waited.
    assert result.status == "incomplete" and "(git: git_add" in result.missing[0], \
        result.missing
    required = events_of(result, "approval_required")
    assert [r["tool"] for r in required] == ["git__git_add"]  # even in auto mode
    assert not events_of(result, "tool_result")
    assert "new.txt" not in git(repo, "diff", "--cached", "--name-only")


async def test_unknown_server_fails_the_task_without_retrying(
        client, mcp_settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {"intent": [CODING], "act": [final("x")]})
    result = await run_task(client, mcp_settings, task_queue, model, workspace,
                            enable_planning=False, mcp_servers=["nosuch"])
    assert result.status == "failed"
    assert "unknown MCP server(s) nosuch" in result.answer


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def server_pids(root: int, name: str) -> list[int]:
    pids = []
    for pid in descendants(root):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if name.encode() in cmdline:
            pids.append(pid)
    return pids


async def test_time_server_killed_mid_call_is_retried(client, mcp_settings, scripted_llm,
                                                      workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [
            call("time__get_current_time", timezone="UTC"),
            call("time__get_current_time", timezone="Europe/Paris"),
            final("two times"),
        ],
        "summary": [SUMMARY],
    }, latency_ms=1000)  # time to freeze the server before the next call
    inp = TaskInput(task="what time is it", workspace=str(workspace), model=model,
                    enable_planning=False, enable_reflection=False, mcp_servers=["time"])
    async with build_worker(client, mcp_settings, task_queue):
        handle = await start(client, task_queue, inp)
        await wait_for_event(handle, lambda e: e.type == "tool_result")
        # The server and the sandbox around it (bubblewrap) are stopped, then killed.
        server = server_pids(os.getpid(), "mcp-server-time")
        assert server, "the worker runs no time server"
        for pid in server:
            os.kill(pid, signal.SIGSTOP)  # the next call hangs in it...
        try:
            await wait_for_event(handle, lambda e: e.type == "tool_call"
                                 and e.data["iteration"] == 2)
            await asyncio.sleep(0.5)
        finally:
            for pid in server:  # ...and the server dies mid-call
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        result = await asyncio.wait_for(result_of(handle), timeout=60)
        history = await handle.fetch_history()

    assert result.status == "completed", result.answer
    results = events_of(result, "tool_result")
    assert [r["ok"] for r in results] == [True, True]
    assert "Europe/Paris" in results[1]["output"]
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.HasField("activity_task_started_event_attributes")]
    assert max(attempts) == 2  # the killed call ran again, on a restarted server
    # The worker stopped its servers when it stopped.
    assert server_pids(os.getpid(), "mcp-server-time") == []


@pytest.mark.slow
async def test_worker_killed_during_mcp_call_resumes_without_repeating(
        client, temporal_server, mcp_settings, scripted_llm, repo, task_queue):
    responses = {
        "intent": [CODING],
        "act": [
            call("git__git_create_branch", repo_path=str(repo), branch_name="feature-x"),
            call("git__git_status", repo_path=str(repo)),
            final("branch created"),
        ],
        "summary": [SUMMARY],
    }
    # Model answers take a second: time to freeze the server before the next call.
    model = unique_scenario(scripted_llm, responses, latency_ms=1000)
    # The roots named: the default, the working directory (this checkout), holds the server.
    extra = {"REFLOOP_MCP_CONFIG": mcp_settings.refloop_mcp_config,
             "REFLOOP_WORKSPACE_ROOTS": mcp_settings.refloop_workspace_roots}
    workers = [spawn_worker(temporal_server, mcp_settings, task_queue, extra_env=extra)]
    stopped: list[int] = []
    try:
        handle = await start(client, task_queue, TaskInput(
            task="create a branch", workspace=str(repo), model=model, enable_planning=False,
            enable_reflection=False, mcp_servers=["git"]))
        await wait_for_event(handle, lambda e: e.type == "tool_result")
        # Freeze the worker's git server so the next call is in flight when the worker dies.
        stopped = server_pids(workers[0].pid, "mcp-server-git")
        assert stopped, "the worker runs no git server"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        await wait_for_event(handle, lambda e: e.type == "tool_call"
                             and e.data["iteration"] == 2)
        await asyncio.sleep(0.5)
        os.killpg(workers[0].pid, signal.SIGKILL)
        workers[0].wait()
        workers.append(spawn_worker(temporal_server, mcp_settings, task_queue, extra_env=extra))
        result = await asyncio.wait_for(result_of(handle), timeout=120)
        history = await handle.fetch_history()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    assert result.status == "completed", result.answer
    results = events_of(result, "tool_result")
    assert [(r["tool"], r["ok"]) for r in results] == [
        ("git__git_create_branch", True), ("git__git_status", True)]
    assert "feature-x" in git(repo, "branch", "--list")
    # The status call was in flight when the worker died: it ran again on the new worker.
    calls = {e.event_id for e in history.events
             if e.HasField("activity_task_scheduled_event_attributes")
             and e.activity_task_scheduled_event_attributes.activity_type.name
             == "refloop.mcp.call_tool"}
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.HasField("activity_task_started_event_attributes")
                and e.activity_task_started_event_attributes.scheduled_event_id in calls]
    assert attempts == [1, 2], attempts
    # The finished create_branch call was not run again (it would fail: the branch exists),
    # and no answered model call was asked again.
    for purpose, scripted in responses.items():
        assert len(scripted_llm.requests(model=model, purpose=purpose)) == len(scripted)



async def test_large_arguments_and_results_follow_the_blob_rules(
        client, settings, scripted_llm, repo, tmp_path, task_queue):
    config = tmp_path / "plain.json"
    config.write_text(json.dumps({"mcpServers": {"git": {
        "command": str(BIN / "mcp-server-git")}}}))
    plain = settings.model_copy(update={"refloop_mcp_config": str(config)})
    message = "subject line\n\n" + "a long body line of the commit message\n" * 150
    git(repo, "add", "new.txt")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [call("git__git_commit", repo_path=str(repo), message=message),
                call("git__git_log", repo_path=str(repo), max_count=1),
                final("committed")],
        "summary": [SUMMARY],
    })
    inp = TaskInput(task="commit", workspace=str(repo), model=model, enable_planning=False,
                    enable_reflection=False, mcp_servers=["git"])
    result, history = await run_with_history(client, plain, task_queue, inp)
    assert result.status == "completed", result.answer
    # The server got the whole message, though the history only carries a marker.
    assert git(repo, "log", "-1", "--format=%B").strip() == message.strip()
    text = history_text(history)
    assert "[[blob:" in text and "a long body line" * 3 not in text.replace("\n", "")
    # A large result: a preview in the event, the marker in history, the model reads it.
    log_result = events_of(result, "tool_result")[1]
    assert log_result["ok"] and len(log_result["output"]) < 700
    seen = tool_messages(scripted_llm.requests(model=model, purpose="act")[2])[-1]
    assert seen.count("a long body line") == 150


async def test_plans_supplements_and_children_use_mcp_tools(
        client, mcp_settings, scripted_llm, workspace, task_queue):
    tool = "time__get_current_time"
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [{"json": {"task_type": "research",
                           "steps": [{"goal": "get the time", "tool": tool}]}}],
        "act": [call(tool, timezone="UTC"), final("UTC time noted"),
                call(tool, timezone="Europe/Paris"), final("Paris time noted")],
        "completeness": [
            {"json": {"is_complete": False, "analysis": "Paris missing",
                      "missing_aspects": ["Paris time"],
                      "supplements": [{"action": "get the Paris time", "reason": "asked",
                                       "suggested_tools": [tool]}]}},
            {"json": {"is_complete": True, "analysis": "done", "missing_aspects": [],
                      "supplements": []}}],
        "supplement_plan": [{"json": {"task_type": "research", "steps": [
            {"goal": "get the Paris time", "tool": tool}]}}],
        "summary": [SUMMARY],
    })
    result = await run_task(client, mcp_settings, task_queue, model, workspace,
                            task="research the time in UTC and Paris", mcp_servers=["time"],
                            enable_reflection=True)
    assert result.status == "completed", result.answer
    assert result.plan.steps[0].tool == tool  # a valid plan step
    for purpose in ("plan", "supplement_plan"):
        [request] = scripted_llm.requests(model=model, purpose=purpose)
        assert tool in json.dumps(request["body"]["messages"]), purpose
    [child] = result.supplements
    assert child["status"] == "completed", child
    # Read-only MCP tools join a task type's allowed tools.
    assert tool in result.allowed_tools_snapshot


async def test_an_unset_variable_fails_the_task_at_once_naming_it(
        client, settings, scripted_llm, workspace, tmp_path, task_queue, monkeypatch):
    monkeypatch.delenv("REFLOOP_TEST_UNSET_VAR", raising=False)
    config = tmp_path / "unset.json"
    config.write_text(json.dumps({"mcpServers": {"time": {
        "command": str(BIN / "mcp-server-time"),
        "env": {"TOKEN": "${REFLOOP_TEST_UNSET_VAR}"}}}}))
    broken = settings.model_copy(update={"refloop_mcp_config": str(config)})
    model = unique_scenario(scripted_llm, {"intent": [CODING], "act": [final("x")]})
    inp = TaskInput(task="t", workspace=str(workspace), model=model, enable_planning=False,
                    enable_reflection=False, mcp_servers=["time"])
    result, history = await run_with_history(client, broken, task_queue, inp)
    assert result.status == "failed"
    assert "${REFLOOP_TEST_UNSET_VAR}, which is not set" in result.answer
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.HasField("activity_task_started_event_attributes")]
    assert set(attempts) == {1}  # a configuration problem is not retried
    listings = [e for e in history.events
                if e.HasField("activity_task_scheduled_event_attributes")
                and e.activity_task_scheduled_event_attributes.activity_type.name
                == "refloop.mcp.list_tools"]
    assert len(listings) == 1


async def test_task_rules_forbid_an_mcp_tool_like_a_built_in(
        client, mcp_settings, scripted_llm, workspace, tmp_path, task_queue):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "generation_tools: [write_file]\nread_only_tools: [read_file]\n"
        "types:\n  research:\n    allowed: [read_file]\n    forbidden: [time__convert_time]\n"
        "    keywords: [research]\n")
    settings = mcp_settings.model_copy(update={"refloop_task_rules": str(rules)})
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [{"json": {"task_type": "research", "steps": [
            {"goal": "get the time", "tool": "time__get_current_time"}]}}],
        "act": [call("time__convert_time", source_timezone="UTC", time="12:00",
                     target_timezone="Asia/Tokyo"),
                call("time__get_current_time", timezone="UTC"),
                final("done")],
        "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, workspace,
                            task="research the time", mcp_servers=["time"])
    assert result.status == "completed", result.answer
    forbidden, allowed = events_of(result, "tool_result")
    assert forbidden["error"].startswith("E_FORBIDDEN: 'time__convert_time'")
    assert allowed["ok"]
    assert [v["tool"] for v in result.tool_violations] == ["time__convert_time"]
    assert "time__get_current_time" in result.allowed_tools_snapshot


async def test_listing_caps_the_tools_and_cleans_their_names(
        client, settings, scripted_llm, workspace, tmp_path, task_queue):
    fixtures = Path(__file__).parent.parent / "fixtures"
    config = tmp_path / "many.json"
    config.write_text(json.dumps({"mcpServers": {"many": {
        "command": sys.executable, "args": [str(fixtures / "many_tools_mcp_server.py")],
        "unattended": ["tool000", "read.file/v2"]}}}))  # unannotated: they run unattended
    many = settings.model_copy(update={"refloop_mcp_config": str(config),
                                       "refloop_sandbox_ro_paths": str(fixtures)})
    odd = tool_name("many", "read.file/v2")
    model = unique_scenario(scripted_llm, {"intent": [CODING], "act": [
        call("many__tool000", text="hi"), call(odd, text="odd"), final("done")],
        "summary": [SUMMARY]})
    result = await run_task(client, many, task_queue, model, workspace,
                            enable_planning=False, mcp_servers=["many"])
    assert result.status == "completed", result.answer
    [listed] = events_of(result, "mcp_tools")
    assert len(listed["tools"]) == 96 and len(listed["dropped"]) == 6
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) for name in listed["tools"])
    assert listed["tools"][0].startswith("many__read_file_v2_")
    assert len(listed["tools"][1]) == 64 and listed["dropped"][-1] == "many/tool099"
    plain, cleaned = events_of(result, "tool_result")
    assert plain["output"] == "tool000: hi"
    assert cleaned["output"] == "read.file/v2: odd"  # called by its own name
    [act] = scripted_llm.requests(model=model, purpose="act")[:1]
    assert len(act["body"]["tools"]) <= 128


@pytest.mark.parametrize("network", [False, True])
async def test_a_stdio_server_reaches_the_network_only_when_allowed(
        client, settings, scripted_llm, workspace, tmp_path, task_queue, network):
    fixtures = Path(__file__).parent.parent / "fixtures"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    config = tmp_path / "probe.json"
    config.write_text(json.dumps({"mcpServers": {"probe": {
        "command": sys.executable, "args": [str(fixtures / "net_probe_mcp_server.py")],
        "network": network, "unattended": ["connect"]}}}))  # it says nothing of harm
    probe = settings.model_copy(update={"refloop_mcp_config": str(config),
                                        "refloop_sandbox_ro_paths": str(fixtures)})
    model = unique_scenario(scripted_llm, {"intent": [CODING], "act": [
        call("probe__connect", port=port), final("done")], "summary": [SUMMARY]})
    try:
        result = await run_task(client, probe, task_queue, model, workspace,
                                enable_planning=False, mcp_servers=["probe"])
    finally:
        listener.close()
    [probed] = events_of(result, "tool_result")
    assert probed["ok"], probed
    assert probed["output"].startswith("connected" if network else "refused"), probed


async def test_destructive_and_unannotated_tools_wait_in_auto_mode_unless_allowed(
        client, settings, scripted_llm, workspace, task_queue, tmp_path):
    """`approval_mode: auto`: a tool annotated destructiveHint (`wipe`) and one with no
    annotation (`plain`: destructive, by the MCP specification) wait for a yes, and with
    none they never run; one the operator lists under `unattended` runs without."""
    fixture = Path(__file__).parent.parent / "fixtures" / "annotated_mcp_server.py"
    path = tmp_path / "annotated.json"
    path.write_text(json.dumps({"mcpServers": {"a": {
        "command": sys.executable, "args": [str(fixture)], "unattended": ["create_branch"]}}}))
    configured = settings.model_copy(update={"refloop_mcp_config": str(path)})
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [call("a__wipe"), call("a__plain"), call("a__create_branch"),
                final("done")],
        "summary": [SUMMARY],
    })
    inp = TaskInput(task="clean up", workspace=str(workspace), model=model,
                    enable_planning=False, enable_reflection=False, mcp_servers=["a"],
                    approval_mode="auto")
    async with build_worker(client, configured, task_queue):
        handle = await start(client, task_queue, inp)
        for call_id in ("1.0", "2.0"):  # each waits for a person, who says no
            await wait_for_event(handle, lambda e, key=call_id: e.type == "approval_required"
                                 and e.data["call_id"] == key)
            await handle.execute_update(AgentTaskWorkflow.decide_approval, ApprovalDecision(
                call_id=call_id, approved=False, comment="not here"))
        result = await result_of(handle)
    assert [r["tool"] for r in events_of(result, "approval_required")] == [
        "a__wipe", "a__plain"]
    outcomes = {r["tool"]: r for r in events_of(result, "tool_result")}
    assert outcomes["a__wipe"]["error"].startswith("E_DENIED")
    assert outcomes["a__plain"]["error"].startswith("E_DENIED")
    assert outcomes["a__create_branch"]["ok"], outcomes["a__create_branch"]
