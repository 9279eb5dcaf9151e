"""The `refloop` command as a user runs it: a fresh process, embedded stack, offline model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from refloop.llm.scripted import ScriptedLLMProcess
from refloop.runtime.net import free_port

HISTORIES = Path(__file__).parent.parent / "histories"


def free_temporal_ports() -> dict[str, str]:
    """Never the conventional ports: other Temporal servers run on this machine."""
    return {"REFLOOP_TEMPORAL_PORT": str(free_port()), "REFLOOP_UI_PORT": str(free_port())}


def refloop(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OPENAI_BASE_URL", "TEMPORAL_ADDRESS", "DATABASE_URL")}
    clean.update({"REFLOOP_DATA_DIR": str(tmp_path / "data"), **free_temporal_ports(), **env})
    return subprocess.run([sys.executable, "-m", "refloop", *args], env=clean,
                          capture_output=True, text=True, timeout=180)


def test_run_json_offline_demo(tmp_path: Path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    history = tmp_path / "history.json"
    done = refloop("run", "write a report", "--workspace", str(workspace), "--json",
                   "--save-history", str(history), tmp_path=tmp_path, COLUMNS="80")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) >= {"workflow_id", "status", "answer", "events", "stats", "quality_reviews"}
    assert out["status"] == "completed"
    assert [e["type"] for e in out["events"]][-1] == "completed"
    reflection = [e["data"] for e in out["events"] if e["type"] == "reflection"]
    assert [r["trigger"] for r in reflection] == ["completeness"]  # no false trigger
    assert reflection[0]["is_complete"] and not reflection[0]["fail_open"]
    assert (workspace / "report.md").read_text().startswith("# refloop")
    assert "SCRIPTED" in done.stderr  # the offline model says what it is
    assert "embedded Temporal: started dev server (SQLite" in done.stderr
    # The task's Web UI page, which `refloop up` serves from the same data dir later:
    # whole, on a line of its own, at 80 columns too.
    links = [line for line in done.stderr.splitlines() if "/namespaces/default/" in line]
    assert links and all(line.startswith("http://") and line.endswith(out["workflow_id"])
                         for line in links), links
    # Progress lines fit the 80 columns and are never cut mid-word (a cut one ends "…").
    progress = [line for line in done.stderr.splitlines() if line.startswith(("→", "←"))]
    assert progress and all(len(line) <= 80 for line in progress), progress
    # The saved history replays cleanly through the CLI.
    replay = refloop("replay", str(history), tmp_path=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert "1 history replayed cleanly" in replay.stderr


def test_bad_inputs_fail_with_one_clear_line(tmp_path: Path):
    missing = refloop("run", "x", "--workspace", str(tmp_path / "nope"), tmp_path=tmp_path)
    assert missing.returncode == 2 and "--workspace: not a directory" in missing.stderr
    workspace = tmp_path / "ws"  # beside the data dir (a workspace holding it is refused)
    workspace.mkdir()
    rules = refloop("run", "x", "--workspace", str(workspace), "--review-rules",
                    "@nofile.txt", tmp_path=tmp_path)
    assert rules.returncode == 2 and "--review-rules: file not found" in rules.stderr
    bad_env = refloop("run", "x", "--workspace", str(workspace), tmp_path=tmp_path,
                      TEMPORAL_ADDRESS="nohostport")
    assert bad_env.returncode == 2 and "TEMPORAL_ADDRESS" in bad_env.stderr


def test_replay_flags_a_tampered_history(tmp_path: Path):
    tampered = tmp_path / "t.json"
    # an agent task's history (a code review's calls no `act`)
    source = next(text for path in sorted(HISTORIES.glob("agent_task_*.json"))
                  if "refloop.llm.act" in (text := path.read_text()))
    tampered.write_text(source.replace("refloop.llm.act", "refloop.llm.renamed"))
    done = refloop("replay", str(tampered), tmp_path=tmp_path)
    assert done.returncode == 1 and "NON-DETERMINISTIC" in done.stderr


def test_review_snippet_offline(tmp_path: Path):
    done = refloop("review", "--snippet", "eval(user_input)", "--format", "simple", "--json",
                   tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed"
    assert result["output"][0]["label"] == "Security"
    assert [p["agent"] for p in result["provenance"]] == ["review", "verify"]
    empty = tmp_path / "empty.diff"
    empty.write_text("")
    bad = refloop("review", "--diff", str(empty), tmp_path=tmp_path)
    assert bad.returncode == 2 and "the diff is empty" in bad.stderr


def test_scripted_llm_without_a_file_serves_scenarios_loaded_over_http():
    """`refloop scripted-llm` in its own process (how benchmarks run it): scenarios arrive
    over HTTP, every request is logged, and a model naming no scenario fails loudly."""
    with ScriptedLLMProcess() as llm:
        client = openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no scripted scenario is loaded"):
            client.chat.completions.create(model="nothing", messages=[],
                                           extra_headers={"X-Refloop-Purpose": "act"})
        llm.load("greeter", {"responses": {"act": [{"content": "hello"}]}})
        answer = client.chat.completions.create(
            model="greeter", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Refloop-Purpose": "act"})
        assert answer.choices[0].message.content == "hello"
        logged = llm.requests(model="greeter", purpose="act")
        assert [r["body"]["messages"] for r in logged] == [[{"role": "user", "content": "hi"}]]
        with pytest.raises(ValueError):
            llm.load("broken", {"responses": {"no_such_purpose": []}})
    assert llm.process.returncode is not None  # stopped with the block


def test_sigterm_stops_refloop_up_and_its_embedded_temporal(tmp_path: Path):
    """`docker stop` or systemd sends SIGTERM: the embedded Temporal server must go with
    `refloop up`, not be orphaned (it runs in its own session)."""
    import re
    import signal
    import socket

    from tests.http_wait import wait_until_healthy

    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_BASE_URL", "TEMPORAL_ADDRESS", "DATABASE_URL")}
    env.update({"REFLOOP_DATA_DIR": str(tmp_path / "data"), **free_temporal_ports()})
    log = tmp_path / "up.log"
    with log.open("w") as stderr:
        up = subprocess.Popen([sys.executable, "-m", "refloop", "up", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}")
        found = re.search(r"embedded Temporal: .* at 127\.0\.0\.1:(\d+)", log.read_text())
        assert found, log.read_text()
        temporal_port = int(found.group(1))
        socket.create_connection(("127.0.0.1", temporal_port), timeout=2).close()
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 143
    finally:
        if up.poll() is None:
            up.kill()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", temporal_port), timeout=2).close()
    assert "Traceback" not in log.read_text()


def test_sigterm_stops_refloop_api_within_its_grace_period(tmp_path: Path, temporal_server):
    """`refloop api` (as docker-compose runs it) exits 143 promptly on SIGTERM."""
    import signal
    import time

    from tests.http_wait import wait_until_healthy

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL",)}
    env.update({"REFLOOP_DATA_DIR": str(tmp_path / "data"), "TEMPORAL_ADDRESS": temporal_server,
                "REFLOOP_GRACEFUL_SHUTDOWN_S": "3", "REFLOOP_API_TOKEN": "t"})
    api = subprocess.Popen([sys.executable, "-m", "refloop", "api", "--port", str(port)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}")
        started = time.monotonic()
        api.send_signal(signal.SIGTERM)
        assert api.wait(timeout=3 + 5) == 143
        assert time.monotonic() - started < 3 + 5
    finally:
        if api.poll() is None:
            api.kill()
    assert "Traceback" not in api.stderr.read()


@pytest.mark.slow
def test_run_with_mcp_servers(tmp_path: Path):
    """`refloop run --mcp git`: the git server's tools are listed for the task (the offline
    demo model does not call them); unknown names and a missing config are one line."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"git": {
        "command": str(Path(sys.executable).parent / "mcp-server-git")}}}))
    # The roots are the test's: the server's command (this venv's) must lie outside them
    done = refloop("run", "write a report", "--workspace", str(workspace), "--json",
                   "--no-reflection", "--mcp", "git", tmp_path=tmp_path,
                   REFLOOP_MCP_CONFIG=str(config), REFLOOP_WORKSPACE_ROOTS=str(tmp_path))
    assert done.returncode == 0, done.stderr
    listed = [e["data"] for e in json.loads(done.stdout)["events"] if e["type"] == "mcp_tools"]
    assert listed[0]["servers"] == ["git"] and "git__git_status" in listed[0]["tools"]
    unknown = refloop("run", "x", "--workspace", str(workspace), "--mcp", "git,nosuch",
                      tmp_path=tmp_path, REFLOOP_MCP_CONFIG=str(config))
    assert unknown.returncode != 0 and "unknown MCP server(s) nosuch; known: git" in (
        unknown.stderr)
    unset = refloop("run", "x", "--workspace", str(workspace), "--mcp", "git",
                    tmp_path=tmp_path)
    assert unset.returncode != 0 and "REFLOOP_MCP_CONFIG" in unset.stderr


async def test_refloop_mcp_on_its_own_embedded_stack(tmp_path: Path):
    """`refloop mcp` with nothing configured: its embedded stack runs the offline demo task
    for an MCP client over stdio, and nothing but protocol reaches stdout."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_BASE_URL", "TEMPORAL_ADDRESS", "DATABASE_URL")}
    env["REFLOOP_DATA_DIR"] = str(tmp_path / "data")
    env["REFLOOP_WORKSPACE_ROOTS"] = str(tmp_path)  # MCP tasks obey the roots like the API's
    params = StdioServerParameters(command=sys.executable, args=["-m", "refloop", "mcp"],
                                   env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        started = await session.call_tool("start_task", {
            "task": "write a report", "workspace": str(workspace)})
        task_id = json.loads(started.content[0].text)["task_id"]
        seen, ended = 0, False
        for _ in range(120):
            page = json.loads((await session.call_tool("task_events", {
                "task_id": task_id, "after_seq": seen, "wait_s": 2})).content[0].text)
            seen = max([seen, *(e["seq"] for e in page["events"])])
            if page["ended"]:
                ended = True
                break
        assert ended
        state = json.loads((await session.call_tool("get_task", {"task_id": task_id}))
                           .content[0].text)
        assert state["status"] == "completed", state
    assert (workspace / "report.md").exists()
