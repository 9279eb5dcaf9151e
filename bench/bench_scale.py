"""Scale figures, each measured in one run on the embedded Temporal dev server
(`BENCH_TEMPORAL=sqlite` by default, or `memory`; see bench/common.py):

1. concurrency: N concurrent 10-step agent tasks on one worker, beside a bare workflow
   making the same activity calls (the agent's 14 model calls: intent, plan, an act per
   step plus the final answer, summary; one tool activity per step), batches of each
   alternating, each in a fresh stack;
2. prompt tokens per step over a 100-step task (flat thanks to trimming);
3. replay speed of a history of 1,000+ events.

    python -m bench.bench_scale [--tasks 100] [--latency-ms 200] [--no-sandbox] [--rounds 4]
    python -m bench.bench_scale --sandbox-cost --rounds 2   # the agent, sandbox off vs on
    python -m bench.bench_scale --levels 10,50,200   # tasks/min, CPU a step, retries

The bare workflow runs on a stock Temporal worker (the floor an SDK user gets) and, to
show what the agent's own orchestration costs, also on refloop's sandboxed runner
(`worker/runner.py`), which skips per-payload context lookups.
--no-sandbox runs both the agent (REFLOOP_WORKFLOW_SANDBOX=false) and the bare workflow
without Temporal's workflow sandbox, so the two stay comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.converter import DataConverter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bench.bare_workflow import STEPS, BareStepsWorkflow
from bench.common import BenchEnv, bench_env, load_average
from refloop.contract.activity_io import RunToolInput
from refloop.contract.messages import ChatMessage, Purpose
from refloop.contract.tool_catalog import tool_specs
from refloop.llm.gateway import LLMGateway
from refloop.llm.prompts import intent_messages, plan_messages, summary_messages
from refloop.tools.registry import execute_tool
from refloop.worker.plugin import SANDBOX_RESTRICTIONS
from refloop.worker.replay import replay_files
from refloop.worker.runner import sandbox_runner
from refloop.workflows.logic import system_prompt

TASK = "bench task"


def scenario(steps: int, latency_ms: int) -> dict:
    acts = [{"tool_calls": [{"name": "write_file", "arguments": {
        "path": f"f{n}.txt", "content": f"step {n}\n" * 20}}]} for n in range(steps)]
    return {"latency_ms": latency_ms, "responses": {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
        "plan": [{"json": {"task_type": "coding",
                           "steps": [{"goal": "write", "tool": "write_file"}]}}],
        "act": [*acts, {"content": "done"}],
        "summary": [{"content": "done"}],
    }}


class BareActivities:
    """The floor's activities send the agent's requests (its prompts and tool schemas, the
    conversation growing by each call and result), kept in memory: what differs is only
    the agent's orchestration (state, events, blob store, trimming, checks)."""

    def __init__(self, env: BenchEnv) -> None:
        self.gateway = LLMGateway(env.settings)
        self.settings = env.settings
        self.conversations: dict[str, list[ChatMessage]] = {}
        # Activities run at least once: a second execution of a model call (seen here
        # under load on the server) reuses the answer instead of finding the
        # scripted response consumed. Counted and printed, never hidden.
        self.answers: dict[tuple[str, str], str] = {}
        self.repeated_calls = 0

    def _messages(self, name: str, purpose: Purpose, last_output: str) -> list[ChatMessage]:
        if purpose is Purpose.intent:
            return intent_messages(TASK)
        if purpose is Purpose.plan:
            return plan_messages(TASK, tool_specs(), None)
        if purpose is Purpose.summary:
            return summary_messages(TASK, "\n".join(
                str(m.content or m.tool_calls) for m in self.conversations.pop(name)))
        conversation = self.conversations.setdefault(name, [
            ChatMessage(role="system", content=system_prompt(None, tool_specs(), name, None)),
            ChatMessage(role="user", content=TASK)])
        if last_output:
            conversation.append(ChatMessage(role="tool", tool_call_id=conversation[-1]
                                            .tool_calls[0].id, content=last_output))
        return conversation

    @activity.defn(name="bare.model")
    async def model(self, args: list[str]) -> str | list[str]:
        return padded(await self._model(args[:3]), args[3:])

    async def _model(self, args: list[str]) -> str:
        info = activity.info()
        key = (info.workflow_id, info.activity_id)
        if key in self.answers:
            self.repeated_calls += 1
            return self.answers[key]
        name, purpose_name, last_output = args
        purpose = Purpose(purpose_name)
        messages = self._messages(name, purpose, last_output)
        out = await self.gateway.chat(purpose, messages, model=name,
                                      tools=tool_specs() if purpose is Purpose.act else None)
        answer = ""
        if out.tool_calls:
            messages.append(ChatMessage(role="assistant", tool_calls=out.tool_calls))
            answer = out.tool_calls[0].arguments["content"]
        self.answers[key] = answer
        return answer

    @activity.defn(name="bare.tool")
    async def tool(self, args: list[str]) -> str | list[str]:
        workspace, call_id, content, *padding = args
        result = await execute_tool(RunToolInput(
            call_id=call_id, name="write_file", workspace=workspace,
            arguments={"path": f"{call_id}.txt", "content": content}), self.settings)
        return padded(result.output, padding)


def padded(value: str, padding: list[str]) -> str | list[str]:
    """A bare activity's result, with the padding its input carried (bench_payload_cost)."""
    return [value, padding[0]] if padding else value


Handle = WorkflowHandle[Any, Any]


class Timing(NamedTuple):
    wall_s: float
    cpu_s: float  # this process: the worker (the model and Temporal run elsewhere)
    server_cpu_s: float = 0.0  # the Temporal dev server's
    retries: int = 0  # activity attempts after the first, from the histories
    duplicates: int = 0  # model requests repeating one already made (same task, same body)
    collector_s: float = 0.0  # of cpu_s, in the garbage collector


class CollectorTime:
    """CPU seconds this process has spent in the garbage collector (a gc callback)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds += time.process_time() - self._started


COLLECTOR = CollectorTime()


@contextlib.asynccontextmanager
async def timed(into: list[Timing], env: BenchEnv) -> AsyncIterator[None]:
    wall, cpu, server = time.perf_counter(), time.process_time(), env.server_cpu_s()
    collector = COLLECTOR.seconds
    yield
    into.append(Timing(time.perf_counter() - wall, time.process_time() - cpu,
                       env.server_cpu_s() - server, collector_s=COLLECTOR.seconds - collector))


async def retried_attempts(handles: list[Handle]) -> int:
    """Attempts after the first of every activity the workflows ran (a started event
    records the attempt it began)."""
    retries = 0
    for handle in handles:
        async for event in handle.fetch_history_events():
            if event.HasField("activity_task_started_event_attributes"):
                retries += event.activity_task_started_event_attributes.attempt - 1
    return retries


def duplicate_requests(env: BenchEnv, names: list[str]) -> int:
    """Model requests that repeat an earlier request of the same task word for word: a
    call asked again after a retry, or a second execution of one activity."""
    wanted = set(names)
    bodies = [(request["model"], json.dumps(request["body"], sort_keys=True))
              for request in env.llm.requests() if request["model"] in wanted]
    return len(bodies) - len(set(bodies))


async def counted(timing: Timing, env: BenchEnv, handles: list[Handle],
                  names: list[str]) -> Timing:
    return timing._replace(retries=await retried_attempts(handles),
                           duplicates=duplicate_requests(env, names))


async def agent_batch(tasks: int, latency_ms: int, sandbox: bool) -> Timing:
    async with bench_env(refloop_workflow_sandbox=sandbox) as env:

        async def run(batch: str, size: int, timing: list[Timing]) -> list[Handle]:
            async def agent(n: int) -> Handle:
                result, _, handle = await env.run(f"{batch}{n}", None)
                assert result.status == "completed", result.answer
                return handle

            # Loaded before the clock starts, as for the bare workflow (a load is a blocking
            # HTTP call on the worker's event loop).
            for n in range(size):
                env.prepare(f"{batch}{n}", scenario(STEPS, latency_ms))
            async with timed(timing, env):
                return await asyncio.gather(*(agent(n) for n in range(size)))

        await run("warm", tasks // 5, [])
        timing: list[Timing] = []
        handles = await run("timed", tasks, timing)
        return await counted(timing[0], env, handles, [f"timed{n}" for n in range(tasks)])


BARE_RUNNERS = {True: ("stock", "refloop"), False: ("stock",)}  # by `sandbox`


def bare_runner(label: str, converter: DataConverter, sandbox: bool) -> WorkflowRunner:
    """The bare workflow's runner: the stock sandbox, or refloop's."""
    if not sandbox:
        return UnsandboxedWorkflowRunner()
    if label == "stock":
        return SandboxedWorkflowRunner()
    return sandbox_runner(converter, SANDBOX_RESTRICTIONS)


async def bare_batch(tasks: int, latency_ms: int, sandbox: bool, runner: str,
                     eager: bool = True) -> Timing:
    """`eager=False`: the server dispatches the bare workflow's activities through its task
    queue, as it does refloop's tool calls (they go to the workspace's host)."""
    async with bench_env(agent_worker=False) as env:
        bare = BareActivities(env)
        workflow_runner = bare_runner(runner, env.client.data_converter, sandbox)

        async def run(batch: str, size: int, timing: list[Timing]) -> list[Handle]:
            names = [f"{batch}{n}" for n in range(size)]
            for name in names:
                env.llm.load(name, scenario(STEPS, latency_ms))
                (env.root / name).mkdir()

            async def bare_task(name: str) -> Handle:
                handle = await env.client.start_workflow(
                    BareStepsWorkflow.run, [name, str(env.root / name)],
                    id=f"{name}-{uuid.uuid4().hex[:6]}", task_queue=env.queue)
                await handle.result()
                return handle

            async with timed(timing, env):
                return await asyncio.gather(*(bare_task(name) for name in names))

        async with Worker(env.client, task_queue=env.queue, workflows=[BareStepsWorkflow],
                          activities=[bare.model, bare.tool], workflow_runner=workflow_runner,
                          disable_eager_activity_execution=not eager):
            await run("warm", tasks // 5, [])
            timing: list[Timing] = []
            handles = await run("timed", tasks, timing)
            if bare.repeated_calls:
                print(f"  (bare on the {runner} runner: {bare.repeated_calls} model calls ran "
                      "again and reused their answer)")
        return await counted(timing[0], env, handles, [f"timed{n}" for n in range(tasks)])


async def concurrency(tasks: int, latency_ms: int, rounds: int, sandbox: bool) -> None:
    """Agent and bare batches alternate, each in a fresh stack (Temporal dev server,
    worker, database, model process) after a warm-up of its own, so neither inherits the
    other's state. Every other round runs in reverse order, so a drift in the machine's
    load weighs on both alike; the ratio is of the summed times, beside the median of
    the per-round ratios."""
    runners = BARE_RUNNERS[sandbox]
    agent_times: list[Timing] = []
    bare_times: dict[str, list[Timing]] = {runner: [] for runner in runners}
    batches = ["agent", *runners]
    for round_number in range(rounds):
        for batch in batches if round_number % 2 == 0 else reversed(batches):
            if batch == "agent":
                agent_times.append(await agent_batch(tasks, latency_ms, sandbox))
            else:
                bare_times[batch].append(await bare_batch(tasks, latency_ms, sandbox, batch))
    label = "sandboxed" if sandbox else "unsandboxed"
    print(f"concurrency ({label}): {tasks} x {STEPS}-step tasks")
    for runner, times in bare_times.items():
        rounds_text = ", ".join(f"{a.wall_s:.1f}s/{b.wall_s:.1f}s={a.wall_s / b.wall_s:.2f}"
                                for a, b in zip(agent_times, times, strict=True))
        wall = sum(t.wall_s for t in agent_times) / sum(t.wall_s for t in times)
        median = statistics.median(a.wall_s / b.wall_s
                                   for a, b in zip(agent_times, times, strict=True))
        cpu = sum(t.cpu_s for t in agent_times) / sum(t.cpu_s for t in times)
        target = " (target <= 1.25)" if runner == "stock" else ""
        print(f"  bare on the {runner} runner: agent/bare wall per round {rounds_text}; "
              f"wall ratio {wall:.3f}{target}, median round {median:.2f}, "
              f"worker CPU ratio {cpu:.3f}")


async def levels(sizes: list[int], latency_ms: int) -> None:
    """At each level, one agent batch and one bare batch (stock worker) of `size`
    concurrent tasks, each in a fresh stack, bare first at odd levels: tasks a minute,
    worker and Temporal CPU a step, retries and repeated model requests of each."""
    print(f"levels: {STEPS}-step tasks, {latency_ms} ms model latency, "
          f"load average {load_average()} at the start")
    print("| tasks | agent tasks/min | bare tasks/min | agent/bare | worker CPU ms/step "
          "agent (bare) | Temporal CPU ms/step agent (bare) | retries agent (bare) | "
          "repeated model requests agent (bare) | garbage collector s agent (bare) | "
          "load average |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for index, size in enumerate(sizes):
        order = ["agent", "bare"] if index % 2 == 0 else ["bare", "agent"]
        timings = {}
        for batch in order:
            timings[batch] = (await agent_batch(size, latency_ms, True) if batch == "agent"
                              else await bare_batch(size, latency_ms, True, "stock"))
        agent, bare = timings["agent"], timings["bare"]
        steps = size * STEPS
        rate = {batch: size * 60 / timing.wall_s for batch, timing in timings.items()}
        print(f"| {size} | {rate['agent']:.1f} | {rate['bare']:.1f} | "
              f"{rate['agent'] / rate['bare']:.2f} | "
              f"{agent.cpu_s * 1000 / steps:.1f} ({bare.cpu_s * 1000 / steps:.1f}) | "
              f"{agent.server_cpu_s * 1000 / steps:.1f} "
              f"({bare.server_cpu_s * 1000 / steps:.1f}) | "
              f"{agent.retries} ({bare.retries}) | {agent.duplicates} ({bare.duplicates}) | "
              f"{agent.collector_s:.1f} ({bare.collector_s:.1f}) | {load_average()} |",
              flush=True)


async def eager_cost(tasks: int, latency_ms: int, rounds: int) -> None:
    """The bare workflow with its activities dispatched eagerly (in the workflow task's
    answer) against through the task queue (a poll, a match, a start of their own),
    rounds alternating: what the dev server pays for an activity it has to match."""
    times: dict[bool, list[Timing]] = {True: [], False: []}
    for round_number in range(rounds):
        for eager in (True, False) if round_number % 2 == 0 else (False, True):
            times[eager].append(await bare_batch(tasks, latency_ms, True, "stock", eager))
    activities = tasks * STEPS * 2  # a model call and a tool call a step
    print(f"eager dispatch: {tasks} concurrent bare tasks x {STEPS} steps, {rounds} rounds, "
          f"load average {load_average()}")
    for eager, label in ((True, "eager"), (False, "matched")):
        runs = times[eager]
        print(f"  {label}: tasks/min {', '.join(f'{tasks * 60 / t.wall_s:.1f}' for t in runs)}; "
              f"Temporal CPU ms/step "
              f"{', '.join(f'{t.server_cpu_s * 1000 / (tasks * STEPS):.1f}' for t in runs)}")
    extra = (sum(t.server_cpu_s for t in times[False])
             - sum(t.server_cpu_s for t in times[True])) / rounds
    print(f"  Temporal CPU for each matched activity: {extra * 1000 / activities:.1f} ms")


async def sandbox_cost(tasks: int, latency_ms: int, rounds: int) -> None:
    """REFLOOP_WORKFLOW_SANDBOX off against on, agent batches only, rounds alternating."""
    times: dict[bool, list[Timing]] = {True: [], False: []}
    for round_number in range(rounds):
        for sandbox in (True, False) if round_number % 2 == 0 else (False, True):
            times[sandbox].append(await agent_batch(tasks, latency_ms, sandbox))
    wall, cpu = (sum(getattr(t, field) for t in times[False])
                 / sum(getattr(t, field) for t in times[True]) for field in ("wall_s", "cpu_s"))
    print(f"sandbox cost: {tasks} x {STEPS}-step agent tasks, unsandboxed/sandboxed wall "
          f"{wall:.3f}, worker CPU {cpu:.3f} over {rounds} rounds")


async def tokens_per_step(env: BenchEnv) -> str:
    result, _, handle = await env.run("long", scenario(100, 0), max_iterations=101,
                                      triggers={"enabled": False})
    assert result.status == "completed"
    prompts = [r["body"]["messages"] for r in env.llm.requests(model="long", purpose="act")]
    sizes = [sum(len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or ""))
                 for m in messages) // 4 for messages in prompts]
    print(f"prompt tokens per step over 100 steps: step 10={sizes[9]}, step 50={sizes[49]}, "
          f"step 100={sizes[99]}, max={max(sizes)}")
    history = await handle.fetch_history()
    path = env.root / "long-history.json"
    from refloop.worker.replay import dump_history

    path.write_text(dump_history(history))
    return str(path)


async def replay_speed(path: str) -> None:
    from pathlib import Path

    from refloop.worker.replay import load_history

    events = len(load_history(Path(path)).events)
    started = time.perf_counter()
    failures = await replay_files([Path(path)])
    seconds = time.perf_counter() - started
    assert not failures, failures
    print(f"replay: {events} events in {seconds:.2f}s ({events / seconds:.0f} events/s)")


async def main(tasks: int, latency_ms: int, sandbox: bool, rounds: int,
               only_sandbox_cost: bool, level_sizes: list[int] | None,
               only_eager_cost: bool = False) -> None:
    if only_eager_cost:
        await eager_cost(tasks, latency_ms, rounds)
        return
    if level_sizes:
        await levels(level_sizes, latency_ms)
        return
    if only_sandbox_cost:
        await sandbox_cost(tasks, latency_ms, rounds)
        return
    async with bench_env(refloop_workflow_sandbox=sandbox) as env:
        await env.run("warmup", scenario(2, 0))
        path = await tokens_per_step(env)
        await replay_speed(path)
    await concurrency(tasks, latency_ms, rounds, sandbox)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sandbox-cost", action="store_true",
                        help="only measure the agent with the sandbox off against on")
    parser.add_argument("--levels", type=lambda text: [int(n) for n in text.split(",")],
                        help="only the agent against the bare workflow at each of these "
                             "concurrent task counts, e.g. 10,50,200")
    parser.add_argument("--eager-cost", action="store_true",
                        help="only measure the bare workflow with its activities dispatched "
                             "eagerly against through the task queue")
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.latency_ms, sandbox=not args.no_sandbox,
                     rounds=args.rounds, only_sandbox_cost=args.sandbox_cost,
                     level_sizes=args.levels, only_eager_cost=args.eager_cost))
