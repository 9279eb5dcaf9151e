"""What a new workflow run costs a worker before its first line runs: the sandbox builds a
fresh instance of the agent workflow, re-importing every module it does not pass through.
A task pays it at its start, at each continue-as-new and each time its run leaves the
worker's cache. Compared: the replayer's strict set and the worker's (workflow modules
passed through; `refloop.worker.plugin`).

    python -m bench.sandbox_imports [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.workflow import _Definition

from bench.common import load_average
from refloop.worker.plugin import SANDBOX_RESTRICTIONS, WORKER_SANDBOX_RESTRICTIONS
from refloop.workflows.agent import AgentTaskWorkflow


async def per_run(restrictions: SandboxRestrictions, runs: int) -> tuple[float, float]:
    """CPU-ms and wall ms of one sandboxed instance of the agent workflow."""
    runner = SandboxedWorkflowRunner(restrictions=restrictions)
    defn = _Definition.must_from_class(AgentTaskWorkflow)
    runner.prepare_workflow(defn)  # the first imports what is passed through
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(runs):
        runner.prepare_workflow(defn)
    return ((time.process_time() - cpu) * 1000 / runs,
            (time.perf_counter() - wall) * 1000 / runs)


async def main(runs: int) -> None:
    strict = await per_run(SANDBOX_RESTRICTIONS, runs)
    worker = await per_run(WORKER_SANDBOX_RESTRICTIONS, runs)
    print(f"a new sandboxed run of the agent workflow, {runs} runs, load {load_average()}")
    print(f"  replayer (workflow modules re-imported): {strict[0]:.1f} CPU-ms, {strict[1]:.1f} ms")
    print(f"  worker (workflow modules passed through): {worker[0]:.1f} CPU-ms, "
          f"{worker[1]:.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
