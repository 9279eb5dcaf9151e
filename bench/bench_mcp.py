"""The cost of MCP tools, measured in one run on the embedded Temporal test server.

A git repository is the workspace. The same work - `git status` N times - runs as
(a) N calls of the git MCP server's `git_status` tool (mcp-server-git over stdio, pooled
by the worker, in the OS sandbox) and (b) N calls of the built-in `run_cmd` with
`git status` (a fresh sandboxed process per call). Per call: from the activity's
scheduling to its completion, read from the workflow histories. Listing: the
`refloop.mcp.list_tools` activity of the first task on a fresh worker (cold: the server
starts) and of later tasks on the same workspace (warm: pooled; a server is started per
workspace, which its sandbox binds). The model answers at once.

    python -m bench.bench_mcp [--calls 20] [--warm-runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import bench_env
from refloop.contract import activity_calls

INTENT = {"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}


def scenario(calls: list[dict]) -> dict:
    return {"responses": {
        "intent": [INTENT],
        "act": [*({"tool_calls": [call]} for call in calls), {"content": "done"}],
        "summary": [{"content": "done"}],
    }}


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for args in (["init", "-q"], ["config", "user.email", "b@example.com"],
                 ["config", "user.name", "Bench"]):
        subprocess.run(["git", "-C", str(path), *args], check=True)
    (path / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(path), "add", "a.txt"], check=True)
    subprocess.run(["git", "-C", str(path), "commit", "-qm", "one"], check=True)
    return path


def activity_seconds(history, activity_type: str) -> list[float]:
    """Scheduled-to-completed seconds of every activity of one type in a history."""
    scheduled, spans = {}, []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == activity_type:
                scheduled[event.event_id] = event.event_time.ToDatetime()
        elif event.HasField("activity_task_completed_event_attributes"):
            start = scheduled.get(
                event.activity_task_completed_event_attributes.scheduled_event_id)
            if start is not None:
                spans.append((event.event_time.ToDatetime() - start).total_seconds())
    return spans


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f} ms (p90 " \
           f"{sorted(values)[int(len(values) * 0.9) - 1 if len(values) > 1 else 0] * 1000:.1f})"


async def main(calls: int, warm_runs: int) -> dict:
    async with bench_env(agent_worker=False) as env:
        config = env.root / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"git": {
            "command": str(Path(sys.executable).parent / "mcp-server-git")}}}))
        env.settings = env.settings.model_copy(update={"refloop_mcp_config": str(config)})
        from refloop.worker.main import build_worker

        listings, mcp_calls, builtin_calls, totals = [], [], [], {}
        async with build_worker(env.client, env.settings, env.queue):
            repo = make_repo(env.root / "mcp-repo")
            for run in range(1 + warm_runs):  # later tasks on the same workspace: pooled
                name = f"mcp{run}"
                work = [{"name": "git__git_status", "arguments": {"repo_path": str(repo)}}
                        ] * (calls if run == 0 else 1)
                env.llm.load(name, scenario(work))
                result, seconds, handle = await run_in(env, name, repo, mcp_servers=["git"])
                assert result.status == "completed", result.answer
                history = await handle.fetch_history()
                listings += activity_seconds(history, activity_calls.MCP_LIST_TOOLS.name)
                if run == 0:
                    mcp_calls = activity_seconds(history, activity_calls.MCP_CALL_TOOL.name)
                    totals["mcp"] = seconds
            name = "builtin"
            repo = make_repo(env.root / "builtin-repo")
            env.llm.load(name, scenario(
                [{"name": "run_cmd", "arguments": {"command": "git status"}}] * calls))
            result, seconds, handle = await run_in(env, name, repo)
            assert result.status == "completed", result.answer
            builtin_calls = activity_seconds(await handle.fetch_history(),
                                             activity_calls.run_tool("run_cmd").name)
            totals["builtin"] = seconds
    report = {
        "calls": calls,
        "mcp_call_ms_median": statistics.median(mcp_calls) * 1000,
        "builtin_call_ms_median": statistics.median(builtin_calls) * 1000,
        "list_tools_cold_ms": listings[0] * 1000,
        "list_tools_warm_ms_median": statistics.median(listings[1:]) * 1000,
        "task_s": totals,
    }
    print(f"git status x{calls}, one activity per call (scheduled -> completed):")
    print(f"  MCP git__git_status (pooled stdio server) {ms(mcp_calls)}")
    print(f"  built-in run_cmd 'git status'           {ms(builtin_calls)}")
    print(f"  whole task: MCP {totals['mcp']:.2f} s, built-in {totals['builtin']:.2f} s")
    print("list tools at task start (refloop.mcp.list_tools):")
    print(f"  cold (server starts)  {listings[0] * 1000:7.1f} ms")
    print(f"  warm (pooled)         {statistics.median(listings[1:]) * 1000:7.1f} ms "
          f"(median of {len(listings) - 1})")
    return report


async def run_in(env, name: str, workspace: Path, **task: object):
    import time
    import uuid

    from refloop.contract.task import TaskInput
    from refloop.workflows.agent import AgentTaskWorkflow

    started = time.perf_counter()
    handle = await env.client.start_workflow(
        AgentTaskWorkflow.run,
        TaskInput(task="bench task", workspace=str(workspace), model=name,
                  enable_planning=False, enable_reflection=False, max_iterations=500,
                  **task),
        id=f"bench-{name}-{uuid.uuid4().hex[:6]}", task_queue=env.queue)
    result = await handle.result()
    return result, time.perf_counter() - started, handle


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = asyncio.run(main(args.calls, args.warm_runs))
    if args.json:
        print(json.dumps(out))
