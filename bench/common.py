"""Shared set-up for benchmarks: embedded Temporal, the scripted model in its own process
(as a real endpoint would be), one worker.

`BENCH_TEMPORAL=sqlite` (default) runs the dev server as `refloop up` does, persisting to
SQLite; `BENCH_TEMPORAL=memory` runs it in memory, the floor a persisting server pays over."""

from __future__ import annotations

import compileall
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from refloop.contract.task import TaskInput, TaskResult
from refloop.llm.scripted import ScriptedLLMProcess
from refloop.runtime.client import connect
from refloop.runtime.net import free_port
from refloop.settings import Settings
from refloop.worker.admission import collector_tuned
from refloop.worker.main import build_worker
from refloop.worker.temporal_server import EmbeddedTemporal
from refloop.workflows.agent import AgentTaskWorkflow


@dataclass
class BenchEnv:
    client: Client
    llm: ScriptedLLMProcess
    root: Path
    settings: Settings
    queue: str
    server_pid: int | None = None  # the dev server's process, for its CPU time

    def server_cpu_s(self) -> float:
        """CPU seconds the dev server has used so far (0 when it is not ours)."""
        return process_cpu_s(self.server_pid) if self.server_pid else 0.0

    def prepare(self, name: str, scenario: dict) -> None:
        """Load scenario `name` into the scripted model and make its workspace."""
        self.llm.load(name, scenario)
        (self.root / name).mkdir()

    async def run(self, name: str, scenario: dict | None, **task: object
                  ) -> tuple[TaskResult, float, WorkflowHandle]:
        """Run one agent task on scenario `name` in a fresh workspace; (result, seconds, handle).
        `scenario` None: loaded already, and the workspace made (`prepare`)."""
        if scenario is not None:
            self.prepare(name, scenario)
        task.setdefault("enable_reflection", False)  # benches that measure it turn it on
        workspace = self.root / name
        started = time.perf_counter()
        handle = await self.client.start_workflow(
            AgentTaskWorkflow.run,
            TaskInput(task="bench task", workspace=str(workspace), model=name, **task),
            id=f"bench-{name}-{uuid.uuid4().hex[:6]}", task_queue=self.queue,
        )
        result = await handle.result()
        return result, time.perf_counter() - started, handle


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compile_bytecode() -> None:
    """The workflow sandbox imports workflow modules afresh for every run. An installed
    wheel (the Dockerfile's `pip install .`) ships their bytecode; an editable checkout
    may not (PYTHONDONTWRITEBYTECODE), and would then measure the compiler instead."""
    root = Path(__file__).resolve().parent.parent
    for package in ("workflows", "bench"):
        compileall.compile_dir(root / package, quiet=1)


# The database a bench may use only when told: an operator's DATABASE_URL names a real one
# (benches register hosts and write task rows), so it is never read from there.
BENCH_DATABASE_ENV = "REFLOOP_BENCH_DATABASE_URL"


def bench_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for a bench's own stack: its database is SQLite under `data_dir` unless
    REFLOOP_BENCH_DATABASE_URL names another, whatever DATABASE_URL says."""
    return Settings(refloop_data_dir=data_dir,
                    database_url=os.environ.get(BENCH_DATABASE_ENV) or None, **overrides)


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, for the figures beside them."""
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def bench_server() -> str:
    """Which dev server the benches run on: `sqlite` or `memory`."""
    server = os.environ.get("BENCH_TEMPORAL", "sqlite")
    if server not in ("sqlite", "memory"):
        raise SystemExit("BENCH_TEMPORAL must be sqlite or memory")
    return server


@contextlib.asynccontextmanager
async def bench_env(agent_worker: bool = True, server: dict[str, Any] | None = None,
                    **overrides: Any) -> AsyncIterator[BenchEnv]:
    """A fresh stack; `agent_worker=False` leaves the queue to a bench's own worker;
    `server`: EmbeddedTemporal's options (SQLite pragmas, dynamic config, metrics port)."""
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmp, ScriptedLLMProcess() as llm:
        root = Path(tmp)
        # Orchestration is measured here; indexing has its own bench (bench_semantic).
        settings = bench_settings(root / "data", openai_base_url=llm.base_url,
                                  openai_api_key="bench", refloop_semantic_index=False,
                                  **overrides)
        temporal = EmbeddedTemporal(root / "temporal", port=free_port(), ui_port=None,
                                    persistent=bench_server() == "sqlite", **(server or {}))
        client = await connect(await temporal.start(), "default")
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        env = BenchEnv(client, llm, root, settings, queue,
                       temporal.process.pid if temporal.process else None)
        try:
            if agent_worker:  # as `refloop worker` serves (the bare floor: a stock worker)
                with collector_tuned():
                    async with build_worker(client, settings, queue):
                        yield env
            else:
                yield env
        finally:
            temporal.stop()
