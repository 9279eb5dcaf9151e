"""50 concurrent agent tasks on one host and on two hosts: wall-clock and worker CPU.

Each host is a `refloop worker` process (its own host id, data dir and workspace root) on
one embedded Temporal dev server; every task names its host, so its workspace activities
run on that host's queue; the scripted model (its own process) answers each call after a
delay, as a remote model would. Worker CPU is the workers' user + system time
(/proc/<pid>/stat), summed over the hosts.

    python -m bench.bench_hosts [--tasks 50] [--steps 5] [--latency-ms 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.bench_scale import scenario
from bench.common import bench_settings, compile_bytecode, load_average, process_cpu_s
from refloop.contract.task import TaskInput
from refloop.llm.scripted import ScriptedLLMProcess
from refloop.runtime.client import connect
from refloop.runtime.net import free_port
from refloop.store import hosts as host_rows
from refloop.store.db import store_for
from refloop.worker.temporal_server import EmbeddedTemporal
from refloop.workflows.agent import AgentTaskWorkflow


def spawn(address: str, queue: str, llm: str, db: str, host: str, root: Path) -> subprocess.Popen:
    env = {**os.environ, "TEMPORAL_ADDRESS": address, "REFLOOP_TASK_QUEUE": queue,
           "OPENAI_BASE_URL": llm, "OPENAI_API_KEY": "bench", "DATABASE_URL": db,
           "REFLOOP_DATA_DIR": str(root / "data"), "REFLOOP_HOST_ID": host,
           "REFLOOP_WORKSPACE_ROOTS": str(root / "ws"), "REFLOOP_SEMANTIC_INDEX": "false",
           "REFLOOP_SANDBOX": os.environ.get("REFLOOP_SANDBOX", "bwrap")}
    return subprocess.Popen([sys.executable, "-m", "refloop", "worker"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def registered(store, names: set[str]) -> None:
    """Until every host's worker has recorded itself (it polls from then on)."""
    for _ in range(600):
        if {h.host_id for h in host_rows.list_hosts(store) if h.live} >= names:
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"hosts {sorted(names)} never registered")


async def run_round(hosts: int, tasks: int, steps: int, latency_ms: int) -> tuple[float, float]:
    """(wall-clock seconds, worker CPU seconds) of `tasks` tasks spread over `hosts` hosts."""
    with tempfile.TemporaryDirectory() as tmp, ScriptedLLMProcess() as llm:
        root = Path(tmp)
        temporal = EmbeddedTemporal(root / "temporal", port=free_port(), ui_port=None,
                                    persistent=True)
        address = await temporal.start()
        db = bench_settings(root / "shared").effective_database_url
        store = store_for(db)
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        names = [f"host{n}" for n in range(hosts)]
        workers = []
        try:
            for name in names:
                (root / name / "ws").mkdir(parents=True)
                workers.append(spawn(address, queue, llm.base_url, db, name, root / name))
            await registered(store, set(names))
            client = await connect(address, "default")
            before = sum(process_cpu_s(w.pid) for w in workers)
            started = time.perf_counter()
            handles = []
            for n in range(tasks):
                name = f"t{n}-{uuid.uuid4().hex[:6]}"
                llm.load(name, scenario(steps, latency_ms))
                host = names[n % hosts]
                workspace = root / host / "ws" / name
                workspace.mkdir()
                handles.append(await client.start_workflow(
                    AgentTaskWorkflow.run, TaskInput(task="bench task", workspace=str(workspace),
                                                     model=name, host=host,
                                                     enable_reflection=False),
                    id=f"bench-{name}", task_queue=queue))
            results = await asyncio.gather(*(h.result() for h in handles))
            wall = time.perf_counter() - started
            cpu = sum(process_cpu_s(w.pid) for w in workers) - before
            assert all(r.status == "completed" for r in results), [r.status for r in results]
            return wall, cpu
        finally:
            for worker in workers:
                worker.terminate()
                worker.wait()
            temporal.stop()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--latency-ms", type=int, default=300)
    args = parser.parse_args()
    compile_bytecode()
    print(f"{args.tasks} concurrent tasks, {args.steps} edits each, model delay "
          f"{args.latency_ms} ms, {os.cpu_count()} cores; load average {load_average()}")
    print("| hosts | wall-clock s | worker CPU s |")
    print("| --- | --- | --- |")
    for hosts in (1, 2):
        wall, cpu = await run_round(hosts, args.tasks, args.steps, args.latency_ms)
        print(f"| {hosts} | {wall:.1f} | {cpu:.1f} |")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    asyncio.run(main())
