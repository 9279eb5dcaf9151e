"""Overload queues in Temporal: a worker short of CPU (busy processes pinned to its cores)
still runs every task to the end, each model request asked once and no call timed out by
its heartbeat, because its slots (`refloop.worker.admission`) keep the rest of the work
waiting on the server instead of inside its event loop."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
from temporalio.api.enums.v1 import EventType

from refloop.contract.task import TaskInput
from refloop.worker.admission import usable_cpus
from refloop.worker.main import build_worker
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, result_of, start

pytestmark = pytest.mark.slow

TASKS = 50
MODEL_LATENCY_MS = 300
WRITES = 5
# Model requests of one task: intent, plan, a call a write, the answer, the summary.
REQUESTS_PER_TASK = {"intent": 1, "plan": 1, "act": WRITES + 1, "summary": 1}


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """Busy processes on this process's cores (they inherit its affinity), at its priority."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def writes(n: int) -> dict:
    """Task `n`: WRITES steps, each writing one file."""
    return {"intent": [CODING], "plan": [plan_of(*["write_file"] * WRITES)],
            "act": [*(call("write_file", path=f"out{step}.txt", content=f"task {n}\n")
                      for step in range(WRITES)), final(f"task {n} written")],
            "summary": [SUMMARY]}


async def test_a_worker_beside_a_cpu_hog_finishes_every_task_without_a_retry(
        client, settings, scripted_llm, tmp_path, task_queue):
    models, inputs = [], []
    for n in range(TASKS):
        workspace = tmp_path / f"ws{n}"
        workspace.mkdir()
        model = unique_scenario(scripted_llm, writes(n), latency_ms=MODEL_LATENCY_MS)
        models.append(model)
        inputs.append(TaskInput(task=f"write out{n}.txt", workspace=str(workspace),
                                model=model, enable_reflection=False,
                                enable_quality_review=False))
    with cpu_hog(2 * usable_cpus()):
        async with build_worker(client, settings, task_queue):
            handles = await asyncio.gather(*(start(client, task_queue, inp)
                                             for inp in inputs))
            results = await asyncio.wait_for(
                asyncio.gather(*(result_of(handle) for handle in handles)), timeout=600)
    assert [r.status for r in results] == ["completed"] * TASKS, \
        [r.answer for r in results if r.status != "completed"]
    for n, model in enumerate(models):
        for step in range(WRITES):
            assert (tmp_path / f"ws{n}" / f"out{step}.txt").read_text() == f"task {n}\n"
        asked = {purpose: len(scripted_llm.requests(model, purpose))
                 for purpose in REQUESTS_PER_TASK}
        assert asked == REQUESTS_PER_TASK, (model, asked)  # no model request twice
    for handle in handles:
        history = await handle.fetch_history()
        timed_out = [e for e in history.events
                     if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]
        assert timed_out == [], timed_out
        retried = [e.activity_task_started_event_attributes for e in history.events
                   if e.HasField("activity_task_started_event_attributes")
                   and e.activity_task_started_event_attributes.attempt > 1]
        assert retried == [], retried
