"""A fresh `refloop worker`: from launch to the first model request of a task that was
already waiting on its queue, in wall time and the worker's CPU time (defaults on: the
semantic index warm-up included). The model's own arrival timestamp ends the clock.

As installed: refloop's modules have their bytecode compiled (pip compiles it at install;
a checkout writes it on first run unless PYTHONDONTWRITEBYTECODE is set), so one untimed
start comes first, with bytecode writing on.

    python -m bench.bench_worker_start [--runs 3] [--no-semantic-index] [--python PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.bench_core import scenario
from bench.common import bench_server
from refloop.contract.task import TaskInput
from refloop.llm.scripted import ScriptedLLMProcess
from refloop.runtime.client import connect
from refloop.runtime.net import free_port
from refloop.worker.temporal_server import EmbeddedTemporal
from refloop.workflows.agent import AgentTaskWorkflow

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process (and its waited-for children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except OSError:
        return None
    return sum(int(value) for value in fields[11:15]) / TICK


async def one_start(root: Path, address: str, llm: ScriptedLLMProcess, semantic: bool,
                    n: int, python: str = sys.executable) -> tuple[float, float]:
    """(wall s, CPU s) from launch to the model's arrival of the first request."""
    client = await connect(address, "default")
    name, queue = f"start{n}", f"fresh-{uuid.uuid4().hex[:6]}"
    llm.load(name, scenario(1, 0))
    workspace = root / name
    workspace.mkdir()
    await client.start_workflow(
        AgentTaskWorkflow.run, TaskInput(task="bench task", workspace=str(workspace), model=name,
                                         enable_reflection=False),
        id=f"fresh-{name}-{uuid.uuid4().hex[:6]}", task_queue=queue)
    installed = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = {**installed, "TEMPORAL_ADDRESS": address, "OPENAI_BASE_URL": llm.base_url,
           "OPENAI_API_KEY": "bench", "REFLOOP_DATA_DIR": str(root / f"data{n}"),
           "REFLOOP_TASK_QUEUE": queue, "REFLOOP_WORKSPACE_ROOTS": str(root),
           "REFLOOP_SEMANTIC_INDEX": "true" if semantic else "false"}
    samples: list[tuple[float, float]] = []
    launched = time.time()
    log = root / f"worker{n}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: ASYNC220 (returns at once; polled below)
            [python, "-m", "refloop", "worker"], env=env, stdout=out, stderr=out, cwd=root)
    try:
        while True:
            cpu = cpu_seconds(process.pid)
            if cpu is not None:
                samples.append((time.time(), cpu))
            requests = llm.requests(model=name)
            if requests:
                arrived = min(r["time"] for r in requests)
                break
            if process.poll() is not None:
                raise RuntimeError(f"the worker exited with {process.returncode}:\n"
                                   + log.read_text(errors="replace")[-3000:])
            if time.time() - launched > 120:
                raise RuntimeError("no model request within 120 s")
            await asyncio.sleep(0.02)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # The CPU clock read last before the request arrived (sampled every ~20 ms).
    cpu_at = max((cpu for at, cpu in samples if at <= arrived), default=0.0)
    return arrived - launched, cpu_at


async def main(runs: int, semantic: bool, python: str) -> None:
    with tempfile.TemporaryDirectory() as tmp, ScriptedLLMProcess() as llm:
        root = Path(tmp)
        temporal = EmbeddedTemporal(root / "temporal", port=free_port(), ui_port=None,
                                    persistent=bench_server() == "sqlite")
        address = await temporal.start()
        try:
            await one_start(root, address, llm, semantic, runs, python)  # untimed
            results = [await one_start(root, address, llm, semantic, n, python)
                       for n in range(runs)]
        finally:
            temporal.stop()
    for wall, cpu in results:
        print(f"  launch -> first model request {wall:.2f} s wall, {cpu:.2f} CPU-s")
    print(f"fresh worker (semantic index {'on' if semantic else 'off'}), median of {runs}: "
          f"{statistics.median(w for w, _ in results):.2f} s wall, "
          f"{statistics.median(c for _, c in results):.2f} CPU-s (target <= 1.5 s, <= 1.2 CPU-s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-semantic-index", action="store_true")
    parser.add_argument("--python", default=sys.executable,
                        help="the worker's interpreter (another checkout's venv, to compare)")
    args = parser.parse_args()
    asyncio.run(main(args.runs, not args.no_semantic_index, args.python))
