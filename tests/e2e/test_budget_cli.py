"""Spend limits as a person drives them from a shell: `refloop run --max-cost-usd` pauses
its task in `waiting_for_budget`, `refloop budget` (a fresh process, finding the run's
server through the data dir) raises it twice and the run ends with its cost; the stock
`temporal` CLI's update raises a limit the same way. Every call of the scripted model costs
exactly $0.01 at the configured price."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.client import Client

from refloop.contract.task import TaskInput
from refloop.worker.main import build_worker
from tests.e2e.test_cli import free_temporal_ports
from tests.e2e.test_temporal_cli import atemporal
from tests.workflow.helpers import CODING, SUMMARY, plan_of, result_of, start
from tests.workflow.test_budget import PRICE, answered, cent_scenario, listing, paused, priced


def refloop_env(tmp_path: Path, scripted_llm, model: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_BASE_URL", "TEMPORAL_ADDRESS", "DATABASE_URL")}
    env.update({"REFLOOP_DATA_DIR": str(tmp_path / "data"), "OPENAI_BASE_URL":
                scripted_llm.base_url, "OPENAI_API_KEY": "test", "COLUMNS": "200",
                "REFLOOP_MODEL_PRICES": json.dumps({model: PRICE}),
                "REFLOOP_SEMANTIC_INDEX": "false", **free_temporal_ports()})
    return env


def refloop(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "refloop", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def waiting_task(env: dict[str, str]) -> str | None:
    listed = refloop(env, "tasks", "--status", "waiting_for_budget", "--json")
    tasks = json.loads(listed.stdout or "[]") if listed.returncode == 0 else []
    return tasks[0]["task_id"] if tasks else None


def until_waiting(env: dict[str, str], run: subprocess.Popen[str], timeout_s: float = 90,
                  asked: Callable[[], bool] = lambda: True) -> str:
    """The task `refloop tasks` lists as waiting for budget. `asked`: a cheap test of the
    model calls the pause follows; each look runs a `refloop` process, which the run's
    start would otherwise share the cores with, so none starts before `asked` holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert run.poll() is None, "refloop run ended before it waited for budget"
        if asked() and (task := waiting_task(env)) is not None:
            return task
        time.sleep(0.5)
    raise AssertionError("the task never waited for budget")


@pytest.mark.slow  # `refloop run`'s own stack and a process per command
def test_refloop_run_pauses_and_refloop_budget_raises(tmp_path: Path, scripted_llm):
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")], "act": listing(7),
        "summary": [SUMMARY]})
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = refloop_env(tmp_path, scripted_llm, model)
    run = subprocess.Popen(
        [sys.executable, "-m", "refloop", "run", "list the files", "--workspace",
         str(workspace), "--model", model, "--no-reflection", "--max-cost-usd", "0.05"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        task = until_waiting(env, run, asked=lambda: answered(scripted_llm, model) >= 5)
        calls = answered(scripted_llm, model)
        assert calls == 5
        shown = refloop(env, "show", task)
        assert "cost: $0.0500" in shown.stdout and "a higher spend limit" in shown.stdout
        inbox = refloop(env, "inbox")
        assert f"refloop budget {task}" in inbox.stdout
        refused = refloop(env, "budget", task, "--max-cost-usd", "0.01")
        assert refused.returncode != 0 and "$0.05" in refused.stderr
        raised = refloop(env, "budget", task, "--max-cost-usd", "0.08", "--json")
        assert raised.returncode == 0, raised.stderr
        assert json.loads(raised.stdout)["max_cost_usd"] == 0.08
        deadline = time.monotonic() + 60
        while answered(scripted_llm, model) < 8:  # three more calls, then the next pause
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert until_waiting(env, run) == task
        time.sleep(1)
        assert answered(scripted_llm, model) == 8
        assert refloop(env, "budget", task, "--max-cost-usd", "1").returncode == 0
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err
    assert "status: completed" in out
    calls = answered(scripted_llm, model)
    assert calls == 11 and f"cost: ${0.01 * calls:.4f}" in out
    assert "waiting for budget: spend limit: $0.05 spent of $0.05" in err


@pytest.mark.usefixtures("scripted_llm")
async def test_the_stock_temporal_cli_raises_a_limit(
        client: Client, temporal_server: str, settings, scripted_llm, workspace, task_queue):
    model = cent_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")], "act": listing(3),
        "summary": [SUMMARY]})
    inp = TaskInput(task="list", workspace=str(workspace), model=model,
                    enable_reflection=False, max_cost_usd=0.03)
    async with build_worker(client, priced(settings, model), task_queue):
        handle = await start(client, task_queue, inp)
        await paused(handle)
        out = await atemporal(temporal_server, "workflow", "update", "execute",
                              "--workflow-id", handle.id, "--name", "raise_budget",
                              "--input", '{"max_cost_usd": 1.0}')
        assert "max_cost_usd" in out  # the update's answer: the task's budget now
        result = await asyncio.wait_for(result_of(handle), 60)
    assert result.status == "completed"
    assert result.stats.usage.cost_usd == pytest.approx(0.01 * answered(scripted_llm, model))
