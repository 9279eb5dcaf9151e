"""Scale figures, each measured in one run on the embedded test server:

1. concurrency: N concurrent 10-step agent tasks on one worker, beside a bare workflow
   making the same activity calls (the agent's 14 model calls: intent, plan, an act per
   step plus the final answer, summary; one tool activity per step), batches of each
   alternating after a warm-up of both;
2. prompt tokens per step over a 100-step task (flat thanks to trimming);
3. replay speed of a history of 1,000+ events.

    python -m bench.bench_scale [--tasks 100] [--latency-ms 200] [--no-sandbox] [--rounds 2]

--no-sandbox runs both the agent (REFLOOP_WORKFLOW_SANDBOX=false) and the bare workflow
without Temporal's workflow sandbox, so the two stay comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
import uuid

from temporalio import activity
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.bare_workflow import STEPS, BareStepsWorkflow
from bench.common import BenchEnv, bench_env
from refloop.llm import LLMGateway
from refloop.models import ChatMessage, Purpose, RunToolInput
from refloop.tools import execute_tool
from worker.replay import replay_files


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
    def __init__(self, env: BenchEnv) -> None:
        self.gateway = LLMGateway(env.settings)
        self.settings = env.settings

    @activity.defn(name="bare.model")
    async def model(self, args: list[str]) -> str:
        name, purpose = args
        out = await self.gateway.chat(Purpose(purpose), [ChatMessage(role="user", content="go")],
                                      model=name)
        return out.tool_calls[0].arguments["content"] if out.tool_calls else ""

    @activity.defn(name="bare.tool")
    async def tool(self, args: list[str]) -> str:
        workspace, call_id, content = args
        result = await execute_tool(RunToolInput(
            call_id=call_id, name="write_file", workspace=workspace,
            arguments={"path": f"{call_id}.txt", "content": content}), self.settings)
        return result.output


async def concurrency(env: BenchEnv, tasks: int, latency_ms: int, rounds: int) -> None:
    """Agent and bare batches alternate after a warm-up of both, so neither gains from
    running second (the test server's JIT, caches); the ratio is of the summed times."""
    runner = {} if env.settings.refloop_workflow_sandbox else {
        "workflow_runner": UnsandboxedWorkflowRunner()}
    bare = BareActivities(env)
    queue = f"bare-{uuid.uuid4().hex[:6]}"
    batches = itertools.count()

    async def agent_batch(size: int) -> float:
        batch = next(batches)

        async def agent(n: int) -> None:
            result, _, _ = await env.run(f"agent{batch}-{n}", scenario(STEPS, latency_ms))
            assert result.status == "completed", result.answer

        started = time.perf_counter()
        await asyncio.gather(*(agent(n) for n in range(size)))
        return time.perf_counter() - started

    async def bare_batch(size: int) -> float:
        batch = next(batches)
        names = [f"bare{batch}-{n}" for n in range(size)]
        for name in names:
            env.llm.load(name, scenario(STEPS, latency_ms))
            (env.root / name).mkdir()
        started = time.perf_counter()
        await asyncio.gather(*(env.client.execute_workflow(
            BareStepsWorkflow.run, [name, str(env.root / name)],
            id=f"{name}-{uuid.uuid4().hex[:6]}", task_queue=queue) for name in names))
        return time.perf_counter() - started

    async with Worker(env.client, task_queue=queue, workflows=[BareStepsWorkflow],
                      activities=[bare.model, bare.tool], **runner):
        await asyncio.gather(agent_batch(tasks // 5), bare_batch(tasks // 5))  # warm-up
        agent_times, bare_times = [], []
        for _ in range(rounds):
            agent_times.append(await agent_batch(tasks))
            bare_times.append(await bare_batch(tasks))
    sandbox = "sandboxed" if env.settings.refloop_workflow_sandbox else "unsandboxed"
    rounds_text = ", ".join(f"{a:.1f}s/{b:.1f}s={a / b:.2f}"
                            for a, b in zip(agent_times, bare_times, strict=True))
    ratio = sum(agent_times) / sum(bare_times)
    print(f"concurrency ({sandbox}): {tasks} x {STEPS}-step tasks, agent/bare per round: "
          f"{rounds_text}; ratio {ratio:.3f} (target <= 1.25)")


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
    from worker.replay import dump_history

    path.write_text(dump_history(history))
    return str(path)


async def replay_speed(path: str) -> None:
    from pathlib import Path

    from worker.replay import load_history

    events = len(load_history(Path(path)).events)
    started = time.perf_counter()
    failures = await replay_files([Path(path)])
    seconds = time.perf_counter() - started
    assert not failures, failures
    print(f"replay: {events} events in {seconds:.2f}s ({events / seconds:.0f} events/s)")


async def main(tasks: int, latency_ms: int, sandbox: bool, rounds: int) -> None:
    async with bench_env(refloop_workflow_sandbox=sandbox) as env:
        await env.run("warmup", scenario(2, 0))
        path = await tokens_per_step(env)
        await replay_speed(path)
        await concurrency(env, tasks, latency_ms, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.latency_ms, sandbox=not args.no_sandbox,
                     rounds=args.rounds))
