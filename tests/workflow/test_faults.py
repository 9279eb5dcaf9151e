"""Fault injection: a model endpoint that misbehaves on ~20% of calls never fails a task."""

from __future__ import annotations

import asyncio
import random

import pytest

from refloop.worker.main import build_worker
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, plan_of, result_of, start

FAULTS = [
    {"status": 429, "retry_after": 0.2, "body": {"error": {"message": "slow down"}}},
    {"status": 500, "body": {"error": {"message": "boom"}}},
    {"status": 503, "body": {"error": {"message": "unavailable"}}},
    # Far past the client timeout below, so a loaded machine cannot deliver it in time
    # (a delivered "x" would read as the final answer and end the task early).
    {"content": "x", "delay_ms": 10000},
]


def flaky(entries: list[dict], rng: random.Random, rate: float = 0.2) -> list[dict]:
    """Put a transport fault before ~rate of the entries."""
    out = []
    for entry in entries:
        if rng.random() < rate:
            out.append(rng.choice(FAULTS))
        out.append(entry)
    return out


@pytest.mark.slow  # the retries' back-offs and the 2.5 s timeouts, six tasks at once
async def test_tasks_complete_through_429_500_timeouts_and_garbage(
    client, settings, scripted_llm, tmp_path, task_queue
):
    from refloop.contract.task import TaskInput

    rng = random.Random(7)
    # Long enough that a healthy answer arrives in time on a loaded 2-core machine.
    settings = settings.model_copy(update={"refloop_llm_timeout_s": 2.5})
    handles, workspaces, models = [], [], []
    async with build_worker(client, settings, task_queue):
        for n in range(6):
            acts = [{"tool_calls": [{"name": "write_file", "arguments": {
                "path": f"f{step}.txt", "content": str(step)}}]} for step in range(4)]
            model = unique_scenario(scripted_llm, {
                "intent": flaky([CODING], rng, 0.5),
                # Garbage JSON is re-asked by the gateway, not retried by Temporal.
                "plan": [{"content": "not json"}, plan_of("write_file")],
                "act": flaky([*acts, {"content": "done"}], rng),
                "summary": flaky([SUMMARY], rng),
            })
            models.append(model)
            workspace = tmp_path / f"ws{n}"
            workspace.mkdir()
            workspaces.append(workspace)
            handles.append(await start(client, task_queue, TaskInput(
                task="write four files", workspace=str(workspace), model=model,
                enable_reflection=False, triggers={"enabled": False})))
        results = await asyncio.wait_for(
            asyncio.gather(*(result_of(h) for h in handles)), timeout=240)
    outcomes = [(r.stop_reason, r.answer[:200]) for r in results]
    assert [r.status for r in results] == ["completed"] * 6, outcomes
    faults = [r["status"] for m in models for r in scripted_llm.requests(model=m)
              if r["status"] != 200]
    assert {429, 500, 503} & set(faults) and len(faults) >= 3  # the faults really happened
    for workspace in workspaces:
        assert sorted(p.name for p in workspace.glob("f*.txt")) == [
            "f0.txt", "f1.txt", "f2.txt", "f3.txt"]
