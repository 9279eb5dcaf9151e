"""A model outage on one endpoint must not slow tasks on another, measured in one run on the
embedded dev server (SQLite) with one worker:

1. before: rounds of `--b-tasks` concurrent 3-step tasks on endpoint B; their latency;
2. the outage: endpoint A answers 503 and `--waiting` tasks wait on it (waiting_for_model)
   for `--outage-min` minutes while B's rounds go on; their latency, and what the waiting
   costs the Temporal server (its own request counters, per second);
3. A comes back: how long until no task row says waiting_for_model any more, and until
   every A task has completed.

    python -m bench.bench_outage_isolation [--waiting 200] [--outage-min 12] [--b-tasks 10]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
import uuid
from collections.abc import Callable

import httpx

from bench.common import BenchEnv, bench_env, load_average
from refloop.contract.activity_io import ModelEndpoint
from refloop.contract.task import TaskInput
from refloop.llm.scripted import ScriptedLLMProcess
from refloop.runtime.net import free_port
from refloop.store.db import store_for
from refloop.workflows.agent import AgentTaskWorkflow

# The Temporal server's requests that waiting calls cost.
OPERATIONS = ("RecordActivityTaskHeartbeat", "RespondActivityTaskFailed",
              "PollActivityTaskQueue", "SignalWorkflowExecution", "UpdateWorkflowExecution",
              "RespondWorkflowTaskCompleted")


def scenario(latency_ms: int) -> dict:
    acts = [{"tool_calls": [{"name": "write_file", "arguments": {
        "path": f"f{n}.txt", "content": f"{n}\n"}}]} for n in range(3)]
    return {"latency_ms": latency_ms, "repeat": True, "responses": {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
        "plan": [{"json": {"task_type": "coding",
                           "steps": [{"goal": "write", "tool": "write_file"}]}}],
        "act": [*acts, {"content": "done"}], "summary": [{"content": "done"}]}}


async def server_requests(metrics_url: str) -> dict[str, float]:
    """The server's request counts by operation, from its Prometheus endpoint."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(metrics_url, timeout=10)).text
    counts = dict.fromkeys(OPERATIONS, 0.0)
    for line in text.splitlines():
        if not line.startswith("service_requests{"):
            continue
        found = re.search(r'operation="(\w+)"', line)
        if found and found.group(1) in counts:
            counts[found.group(1)] += float(line.rsplit(" ", 1)[1])
    return counts


def set_fault(base_url: str, fault: dict) -> None:
    root = base_url.removesuffix("/v1")
    httpx.post(f"{root}/_admin/fault", json=fault, timeout=10).raise_for_status()


async def poll_until(condition: Callable[[], bool], timeout_s: float, every_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(every_s)


async def b_round(env: BenchEnv, tasks: int, latency_ms: int) -> list[float]:
    names = [f"b-{uuid.uuid4().hex[:8]}" for _ in range(tasks)]
    for name in names:
        env.prepare(name, scenario(latency_ms))
    runs = await asyncio.gather(*(env.run(name, None) for name in names))
    assert all(result.status == "completed" for result, _, _ in runs)
    return [seconds for _, seconds, _ in runs]


async def main(args: argparse.Namespace) -> None:
    metrics_port = free_port()
    with ScriptedLLMProcess() as endpoint_a:
        async with bench_env(server={"metrics_port": metrics_port}) as env:
            metrics = f"http://127.0.0.1:{metrics_port}/metrics"
            before = []
            for _ in range(args.rounds):
                before += await b_round(env, args.b_tasks, args.latency_ms)
            set_fault(endpoint_a.base_url, {"status": 503})
            handles = []
            for n in range(args.waiting):
                name = f"a-{n}-{uuid.uuid4().hex[:6]}"
                endpoint_a.load(name, scenario(args.latency_ms))
                (env.root / name).mkdir()
                handles.append(await env.client.start_workflow(
                    AgentTaskWorkflow.run, TaskInput(
                        task="bench task", workspace=str(env.root / name),
                        endpoint=ModelEndpoint(model=name, base_url=endpoint_a.base_url),
                        enable_reflection=False),
                    id=f"bench-{name}", task_queue=env.queue))
            store = store_for(env.settings.effective_database_url)

            def waiting() -> int:
                counts = store.count_by_status()
                return counts.get("waiting_for_model", (0, None))[0]

            started = time.monotonic()
            await poll_until(lambda: waiting() >= args.waiting, 300, 1.0)
            print(f"{waiting()} of {args.waiting} A tasks waiting_for_model after "
                  f"{time.monotonic() - started:.0f} s")
            counts0, t0 = await server_requests(metrics), time.monotonic()
            during = []
            while time.monotonic() - t0 < args.outage_min * 60:
                during += await b_round(env, args.b_tasks, args.latency_ms)
            counts1, t1 = await server_requests(metrics), time.monotonic()
            back = time.monotonic()
            set_fault(endpoint_a.base_url, {})
            await poll_until(lambda: not waiting(), 300, 0.25)
            rows_clear = time.monotonic() - back
            results = await asyncio.gather(*(h.result() for h in handles))
            all_done = time.monotonic() - back
        completed = sum(result.status == "completed" for result in results)
    b_before, b_during = statistics.median(before), statistics.median(during)
    print(f"load average {load_average()}")
    print(f"B task latency, median: before {b_before:.2f} s ({len(before)} tasks), during the "
          f"outage {b_during:.2f} s ({len(during)} tasks): ratio {b_during / b_before:.2f} "
          f"(p90 during {statistics.quantiles(during, n=10)[-1]:.2f} s)")
    print(f"A back: no row waiting_for_model after {rows_clear:.1f} s; all {args.waiting} A "
          f"tasks ended after {all_done:.1f} s ({completed} completed)")
    seconds = t1 - t0
    print(f"Temporal server requests per second during {seconds:.0f} s of the outage:")
    for operation in OPERATIONS:
        print(f"  {operation:32} {(counts1[operation] - counts0[operation]) / seconds:8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=200)
    parser.add_argument("--outage-min", type=float, default=12.0)
    parser.add_argument("--b-tasks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=int, default=300)
    asyncio.run(main(parser.parse_args()))
