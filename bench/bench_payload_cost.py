"""What history bytes cost the Temporal server: the bare workflow of the concurrency
benchmark run as it is and with padding on every activity's input and result, batches
alternating, each in a fresh stack (the dev server on SQLite, a stock worker). Prints the
server's CPU a task for each and what a kilobyte more of history a step costs it.

    python -m bench.bench_payload_cost [--tasks 60] [--pad-bytes 2000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid

from temporalio.worker import Worker

from bench.bare_workflow import STEPS, BareStepsWorkflow
from bench.bench_scale import BareActivities, scenario
from bench.common import bench_env, load_average

LATENCY_MS = 100
# Activities of a bare task: intent, plan, an act per step and the last, the summary; a
# tool call per step
ACTIVITIES = 2 + (STEPS + 1) + 1 + STEPS


async def server_cpu_ms(tasks: int, pad_bytes: int) -> float:
    """The dev server's CPU milliseconds a task over `tasks` concurrent bare tasks."""
    async with bench_env(agent_worker=False) as env:
        bare = BareActivities(env)
        names = [f"pad{n}" for n in range(tasks)]
        for name in names:
            env.llm.load(name, scenario(STEPS, LATENCY_MS))
            (env.root / name).mkdir()
        async with Worker(env.client, task_queue=env.queue, workflows=[BareStepsWorkflow],
                          activities=[bare.model, bare.tool]):
            before = env.server_cpu_s()
            await asyncio.gather(*(env.client.execute_workflow(
                BareStepsWorkflow.run, [name, str(env.root / name), str(pad_bytes)],
                id=f"{name}-{uuid.uuid4().hex[:6]}", task_queue=env.queue)
                for name in names))
            return (env.server_cpu_s() - before) * 1000 / tasks


async def main(tasks: int, pad_bytes: int, rounds: int) -> None:
    print(f"payload cost: {tasks} concurrent bare {STEPS}-step tasks, load average "
          f"{load_average()} at the start")
    plain: list[float] = []
    padded: list[float] = []
    for round_number in range(rounds):
        for pad in (0, pad_bytes) if round_number % 2 == 0 else (pad_bytes, 0):
            (padded if pad else plain).append(await server_cpu_ms(tasks, pad))
    extra_kb_a_step = ACTIVITIES * 2 * pad_bytes / 1024 / STEPS
    plain_ms, padded_ms = statistics.median(plain), statistics.median(padded)
    print(f"  server CPU a task: {plain_ms:.0f} ms plain, {padded_ms:.0f} ms with {pad_bytes} "
          f"bytes more on each activity input and result ({extra_kb_a_step:.1f} KB more "
          f"history a step); {(padded_ms - plain_ms) / STEPS / extra_kb_a_step:.2f} ms a "
          f"step for each KB, {padded_ms / plain_ms:.3f} of plain; load average "
          f"{load_average()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--pad-bytes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.pad_bytes, args.rounds))
