"""Where a step's milliseconds go on the dev server (SQLite, as `refloop up` runs it).

A 10-step task with a 200 ms scripted model runs as AgentTaskWorkflow; in the same run,
as calibration, the bare workflow (bench/bare_workflow.py: the same model and tool calls,
no agent logic, on a stock worker) and a plain asyncio loop making the same calls. The
overhead ratio is the model's own timestamps: first request arrived to last answer sent,
over the time the model spent answering. Runs alternate between every column; medians.

Per step (per model call: the unit of the overhead figure) it prints the workflow task
round trips, schedule-to-start and start-to-close of the activities (from the history),
the payload encoding (the run's payloads through the worker's converter) and blob store
calls (timed in the worker), and the dev server's SQLite time (its persistence metrics);
and per step (a model call and its tool call) the history's events and bytes.

    python -m bench.bench_steps [--runs 5] [--steps 10] [--latency-ms 200]
                                [--configs default,wal-no-fsync,no-eager]
                                [--llm-rate-per-s N]

`--configs` adds dev servers run otherwise, each with its own worker: `wal-no-fsync`
(the SQLite setting refloop used before: no fsync per commit), `no-eager` (eager
activity dispatch off: what an activity on another task queue than its workflow's pays).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bench.bare_workflow import STEPS, BareStepsWorkflow
from bench.bench_core import plain_loop, scenario
from bench.bench_scale import BareActivities
from bench.common import BenchEnv, bench_env, load_average
from bench.step_breakdown import (
    Timer,
    history_times,
    median,
    metrics_delta,
    model_overhead,
    parse_metrics,
    payload_seconds,
    step_history,
    timed_methods,
)
from refloop.contract.task import TaskInput
from refloop.llm.gateway import LLMGateway
from refloop.runtime.net import free_port
from refloop.store.db import Store
from refloop.worker.temporal_server import DYNAMIC_CONFIG
from refloop.workflows.agent import AgentTaskWorkflow

# Server settings by name ({}: as EmbeddedTemporal starts it).
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "wal-no-fsync": {"pragmas": ("journal_mode=wal", "synchronous=off")},
    "no-eager": {"dynamic_config": {**DYNAMIC_CONFIG,
                                    "system.enableActivityEagerExecution": "false"}},
}
METRICS = ("persistence_latency_sum", "persistence_latency_count",
           "visibility_persistence_latency_sum", "service_latency_sum",
           "service_latency_count", "activity_eager_execution")
WRITES = ("Update", "Create", "Append", "Complete", "Delete", "Upsert")
STORE_METHODS = ["put_blob", "get_blob", "record_task"]
RPCS = ("RespondWorkflowTaskCompleted", "RespondActivityTaskCompleted",
        "RecordActivityTaskHeartbeat")


@dataclass
class Run:
    ratio: float
    ms_per_call: float
    figures: dict[str, float] = field(default_factory=dict)


async def scrape(port: int) -> dict:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return parse_metrics(text, METRICS)


def breakdown(history: Any, delta: dict, calls: int) -> dict[str, float]:
    """Per model call: where the run's time went."""
    times = history_times(history)
    payload_s, payload_bytes = payload_seconds(history)
    sqlite_s = sum(value for (metric, _), value in delta.items()
                   if metric in ("persistence_latency_sum", "visibility_persistence_latency_sum"))
    writes = sum(value for (metric, op), value in delta.items()
                 if metric == "persistence_latency_count" and op.startswith(WRITES))
    step_events, step_bytes = step_history(history)
    figures = {
        # a step: a model call and its tool call (the goal: at most 13 events, 2.5 KB)
        "history events a step": step_events,
        "history bytes a step": step_bytes,
        "workflow tasks": times.workflow_tasks / calls,
        "workflow task schedule-to-start ms": times.wft_schedule_to_start / calls,
        "workflow task start-to-close ms": times.wft_start_to_close / calls,
    }
    for kind in sorted(times.activities):
        figures[f"{kind} activities"] = times.activities[kind] / calls
        figures[f"{kind} schedule-to-start ms"] = times.schedule_to_start[kind] / calls
        figures[f"{kind} start-to-close ms"] = times.start_to_close[kind] / calls
    figures |= {
        "payload encode+decode ms": payload_s * 1000 / calls,
        "payload KB": payload_bytes / 1024 / calls,
        "SQLite (Temporal) ms": sqlite_s * 1000 / calls,
        "SQLite (Temporal) writes": writes / calls,
        "eager activity starts": sum(value for (metric, _), value in delta.items()
                                     if metric == "activity_eager_execution") / calls,
    }
    for op in RPCS:
        count = delta.get(("service_latency_count", op), 0)
        if count:
            figures[f"{op} calls"] = count / calls
            figures[f"{op} ms each (server)"] = delta[("service_latency_sum", op)] / count * 1000
    return figures


async def measured(env: BenchEnv, port: int, name: str, start: Any) -> Run:
    """Run one workflow (`start()` returns its handle) and break its time down."""
    before = await scrape(port)
    handle = await start()
    await handle.result()
    await asyncio.sleep(0.3)  # the run's last writes reach the metrics
    delta = metrics_delta(before, await scrape(port))
    span, model_s, calls = model_overhead(env.llm.requests(model=name))
    figures = breakdown(await handle.fetch_history(), delta, calls)
    return Run(span / model_s, (span - model_s) * 1000 / calls, figures)


async def agent_run(env: BenchEnv, port: int, name: str, steps: int, latency_ms: int,
                    timer: Timer) -> Run:
    env.llm.load(name, scenario(steps, latency_ms))
    workspace = env.root / name
    workspace.mkdir()
    timer.reset()

    async def start() -> Any:
        return await env.client.start_workflow(
            AgentTaskWorkflow.run, TaskInput(task="bench task", workspace=str(workspace),
                                             model=name, enable_reflection=False),
            id=f"steps-{name}-{uuid.uuid4().hex[:6]}", task_queue=env.queue)

    run = await measured(env, port, name, start)
    run.figures["blob store and task record ms"] = (sum(timer.seconds.values()) * 1000
                                                    / (steps + 4))
    return run


async def bare_run(env: BenchEnv, port: int, name: str, latency_ms: int) -> Run:
    env.llm.load(name, scenario(STEPS, latency_ms))
    (env.root / name).mkdir()
    return await measured(env, port, name, lambda: env.client.start_workflow(
        BareStepsWorkflow.run, [name, str(env.root / name)],
        id=f"bare-{name}-{uuid.uuid4().hex[:6]}", task_queue=f"{env.queue}-bare"))


async def plain_run(env: BenchEnv, name: str, steps: int, latency_ms: int) -> Run:
    env.llm.load(name, scenario(steps, latency_ms))
    workspace = env.root / name
    workspace.mkdir()
    await plain_loop(LLMGateway(env.settings), name, workspace, env.settings)
    span, model_s, calls = model_overhead(env.llm.requests(model=name))
    return Run(span / model_s, (span - model_s) * 1000 / calls)


async def main(runs: int, steps: int, latency_ms: int, configs: list[str],
               llm_rate_per_s: float | None = None) -> None:
    timer = Timer()
    bare = steps == STEPS
    columns = [*configs, *(["bare"] if bare else []), "plain"]
    results: dict[str, list[Run]] = {name: [] for name in columns}
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(timed_methods(Store, STORE_METHODS, timer))
        envs: dict[str, tuple[BenchEnv, int]] = {}
        for config in configs:
            port = free_port()
            env = await stack.enter_async_context(
                bench_env(server={**CONFIGS[config], "metrics_port": port},
                          refloop_llm_rate_per_s=llm_rate_per_s))
            await agent_run(env, port, f"warm-{config}", steps, latency_ms, timer)
            envs[config] = (env, port)
        first, first_port = envs[configs[0]]
        if bare:  # on the first configuration's server, a stock worker of its own
            activities = BareActivities(first)
            await stack.enter_async_context(Worker(
                first.client, task_queue=f"{first.queue}-bare", workflows=[BareStepsWorkflow],
                activities=[activities.model, activities.tool],
                workflow_runner=SandboxedWorkflowRunner()))
            await bare_run(first, first_port, "warm-bare", latency_ms)
        for n in range(runs):
            for column in columns if n % 2 == 0 else list(reversed(columns)):
                if column == "bare":
                    run = await bare_run(first, first_port, f"bare-{n}", latency_ms)
                elif column == "plain":
                    run = await plain_run(first, f"plain-{n}", steps, latency_ms)
                else:
                    env, port = envs[column]
                    run = await agent_run(env, port, f"{column}-{n}", steps, latency_ms, timer)
                results[column].append(run)
            print(f"run {n + 1}: " + ", ".join(
                f"{name} {rs[-1].ratio:.3f}" for name, rs in results.items()), flush=True)
    report(results, steps, latency_ms, configs[0])


def report(results: dict[str, list[Run]], steps: int, latency_ms: int, agent: str) -> None:
    plain = results["plain"]
    print(f"\n{steps}-step task, {latency_ms} ms scripted model, {steps + 4} model calls; "
          f"medians of {len(plain)} runs. Overhead ratio: first model request to last answer "
          "over the model's own time (its timestamps). Per model call below.")
    print(f"{'':44s}" + "".join(f"{name:>14s}" for name in results))

    def row(label: str, get: Any) -> None:
        values = [[get(r) for r in rs] for rs in results.values()]
        print(f"{label:44s}" + "".join(
            f"{median([v for v in vs if v is not None]):14.3f}"
            if any(v is not None for v in vs) else f"{'-':>14s}" for vs in values))

    row("overhead ratio", lambda r: r.ratio)
    row("overhead ms per model call", lambda r: r.ms_per_call)
    for name, rs in results.items():
        if name != "plain":
            pairs = [a.ratio / p.ratio for a, p in zip(rs, plain, strict=True)]
            print(f"{name + ' / plain (same run)':44s}{median(pairs):14.3f}")
    if "bare" in results:
        pairs = [a.ratio / b.ratio for a, b in zip(results[agent], results["bare"], strict=True)]
        print(f"{agent + ' / bare (same run)':44s}{median(pairs):14.3f}")
    keys: list[str] = []
    for rs in results.values():
        for r in rs:
            keys += [key for key in r.figures if key not in keys]
    for key in keys:
        row(key, lambda r, key=key: r.figures.get(key))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--llm-rate-per-s", type=float, default=None,
                        help="a fleet rate limit for refloop's workers: model calls then go "
                             "through the model queue (without one: eager, on the "
                             "workflow's queue)")
    parser.add_argument("--configs", default="default",
                        help=f"comma-separated, the first is measured against bare and plain: "
                             f"{', '.join(CONFIGS)}")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"fleet rate limit: {args.llm_rate_per_s or 'none'}; load average at start: "
          f"{load_average()}")
    asyncio.run(main(args.runs, args.steps, args.latency_ms, args.configs.split(","),
                     args.llm_rate_per_s))
    print(f"({time.perf_counter() - started:.0f} s; load average at end: {load_average()})")
