"""Long tasks within the model's context window, end to end: a scripted endpoint that
enforces a window (refusing a longer prompt as llama.cpp or OpenAI words it), a task that
reads far more than the window holds, and what every request sent looked like."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from refloop.api.branching import fork
from refloop.contract.task import TaskResult
from refloop.llm.scripted import ScriptedLLMServer
from refloop.settings import Settings
from refloop.store.db import store_for
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history, replay_files
from refloop.workflows.agent import AgentTaskWorkflow
from tests.workflow.helpers import (
    CODING,
    SUMMARY,
    activity_starts,
    events_of,
    final,
    plan_of,
    result_of,
    run_task,
    run_with_history,
)

FACT = "Noted: the code word in f1.txt is PLUM-42."
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda",
         "sigma", "omega", "river", "stone", "cloud", "ledger", "window", "budget", "signal")


def write_files(workspace: Path, count: int, chars: int, seed: int = 7) -> None:
    """`count` files of `chars` characters of words, in lines of about 78."""
    rng = random.Random(seed)
    for n in range(count):
        lines, size = [], 0
        while size < chars:
            line = " ".join(rng.choice(WORDS) for _ in range(12))[:77]
            lines.append(line)
            size += len(line) + 1
        (workspace / f"f{n}.txt").write_text("\n".join(lines)[:chars])


def reads(count: int) -> list[dict[str, Any]]:
    """One read a turn; the model notes a fact at the second."""
    turns = []
    for n in range(count):
        turn: dict[str, Any] = {"tool_calls": [{"name": "read_file",
                                                "arguments": {"path": f"f{n}.txt"}}]}
        if n == 1:
            turn["content"] = FACT
        turns.append(turn)
    return turns


def summaries(count: int) -> list[dict[str, Any]]:
    return [{"content": f"Summary {n}: read the files in order; {FACT}"} for n in range(count)]


def window_scenario(window: int, wording: str, acts: list[dict[str, Any]],
                    compacts: int) -> dict[str, Any]:
    return {"name": "windowed", "endpoint": {"context_tokens": window,
                                             "context_refusal": wording},
            "responses": {"intent": [CODING], "plan": [plan_of("read_file")],
                          "act": acts, "compact": summaries(compacts), "summary": [SUMMARY]}}


def on(server: ScriptedLLMServer, settings: Settings, **more: Any) -> Settings:
    return settings.model_copy(update={"openai_base_url": server.base_url, **more})


def sent(server: ScriptedLLMServer, status: int) -> list[dict[str, Any]]:
    return [r for r in server.requests() if r.get("status") == status]


def assert_within(server: ScriptedLLMServer, window: int) -> None:
    for request in sent(server, 200):
        assert request["prompt_tokens"] + request["body"]["max_tokens"] <= window, (
            request["purpose"], request["prompt_tokens"], request["body"]["max_tokens"])


@pytest.mark.parametrize("wording,default", [("llama_cpp", 8192), ("openai", 32768)],
                         ids=["llama_cpp_props", "openai_no_props"])
async def test_a_task_reading_far_more_than_the_window_completes(
        client, settings, workspace, task_queue, wording, default):
    """12,000 tokens; 40 files of 7,800 characters (about 90,000 tokens). llama.cpp states
    its window in /props; the OpenAI-style endpoint states it nowhere, and the deployment's
    default (32,768) is larger: its one refusal teaches it."""
    write_files(workspace, 40, 7_800)
    scenario = window_scenario(12_000, wording, [*reads(40), final("read all 40; PLUM-42")],
                               compacts=20)
    with ScriptedLLMServer(scenario) as server:
        result = await run_task(client, on(server, settings,
                                           refloop_model_context_default=default),
                                task_queue, "windowed", workspace,
                                task="read f0.txt to f39.txt and report the code word",
                                max_iterations=50)
        assert result.status == "completed", (result.stop_reason, result.answer)
        assert result.stats.tool_calls == 40
        refused = sent(server, 400)
        assert len(refused) == (1 if wording == "openai" else 0), refused
        assert_within(server, 12_000)
        acts = [r for r in sent(server, 200) if r["purpose"] == "act"]
        assert FACT in json.dumps(acts[-1]["body"]["messages"])
    assert events_of(result, "compacted")


@pytest.mark.slow
async def test_a_300_step_task_stays_within_its_window_compacting_a_bounded_number_of_times(
        client, settings, workspace, task_queue, tmp_path: Path):
    """Every request under the 16,000-token window; the compactions bounded (each folds
    the turns of at least a quarter of the window, so about one in 25 steps here); their
    events in the history, which replays."""
    steps = 300
    write_files(workspace, 30, 2_400)
    acts = [{"tool_calls": [{"name": "read_file", "arguments": {"path": f"f{n % 30}.txt"}}],
             **({"content": FACT} if n == 1 else {})} for n in range(steps)]
    scenario = window_scenario(16_000, "llama_cpp", [*acts, final("done; PLUM-42")],
                               compacts=steps // 10)
    with ScriptedLLMServer(scenario) as server:
        result, history = await run_with_history(
            client, on(server, settings), task_queue, task_input(
                workspace, "read the files, again and again", max_iterations=steps + 5))
        assert result.status == "completed", (result.stop_reason, result.answer)
        assert not sent(server, 400)
        assert_within(server, 16_000)
        compacts = [r for r in sent(server, 200) if r["purpose"] == "compact"]
        acts_sent = [r for r in sent(server, 200) if r["purpose"] == "act"]
        assert FACT in json.dumps(acts_sent[-1]["body"]["messages"])
        write_cost_curve(acts_sent, compacts)
    # One compaction in about 25 steps here, each its own activity in the history
    assert 1 <= len(compacts) <= steps // 20, len(compacts)
    assert len(activity_starts(history, "refloop.llm.compact")) == len(compacts)
    summaries_done = [e for e in events_of(result, "compacted") if e["kind"] == "summary"]
    assert summaries_done  # the recent ones: a long task's result carries its last events
    assert all(e["tokens_after"] < e["tokens_before"] for e in summaries_done)
    (tmp_path / "long.json").write_text(dump_history(history))
    assert await replay_files([tmp_path / "long.json"]) == {}


def task_input(workspace: Path, task: str, **overrides: Any):
    from refloop.contract.task import TaskInput
    return TaskInput(task=task, workspace=str(workspace), model="windowed",
                     enable_reflection=False, **overrides)


def write_cost_curve(acts: list[dict[str, Any]], compacts: list[dict[str, Any]]) -> None:
    """Prompt tokens of each step's request, for the docs' cost curve."""
    report = Path(".refloop-data/window-cost-curve.json")
    report.parent.mkdir(exist_ok=True)
    report.write_text(json.dumps({"act_prompt_tokens": [r["prompt_tokens"] for r in acts],
                                  "compact_prompt_tokens": [r["prompt_tokens"]
                                                            for r in compacts]}))


async def test_a_compacted_task_golden_history(client, settings, workspace, task_queue):
    """A short task on a small window that masks and summarises: its golden history."""
    write_files(workspace, 12, 2_000)
    scenario = window_scenario(6_000, "llama_cpp", [*reads(12), final("done; PLUM-42")],
                               compacts=6)
    with ScriptedLLMServer(scenario) as server:
        result: TaskResult = await run_task(client, on(server, settings), task_queue,
                                            "windowed", workspace, task="read the 12 files",
                                            record_as="agent_task_compacted")
        assert result.status == "completed", (result.stop_reason, result.answer)
        assert_within(server, 6_000)
    kinds = {e["kind"] for e in events_of(result, "compacted")}
    assert "summary" in kinds and "masked" in kinds
    summary = next(e for e in events_of(result, "compacted") if e["kind"] == "summary")
    assert summary["by_model"] and summary["summary_tokens"] > 0
    summaries_done = [e for e in events_of(result, "compacted") if e["kind"] == "summary"]
    assert result.stats.usage_by_purpose["compact"].calls == len(summaries_done)


async def test_a_fork_before_a_compaction_reads_the_conversation_of_its_step(
        client, settings, workspace, task_queue, tmp_path: Path):
    """Compaction writes a new conversation; every step's own stays as it was. A fork at the
    first step of a task that compacted later reads that step's conversation, unfolded."""
    write_files(workspace, 12, 2_000)
    write = {"tool_calls": [{"name": "write_file",
                             "arguments": {"path": "notes.md", "content": "first\n"}}]}
    scenario = window_scenario(6_000, "llama_cpp",
                               [write, *reads(12), final("done"), final("fork done")],
                               compacts=6)
    scenario["responses"]["summary"] = [SUMMARY, SUMMARY]
    settings = settings.model_copy(update={"refloop_task_queue": task_queue})
    with ScriptedLLMServer(scenario) as server:
        settings = on(server, settings)
        async with build_worker(client, settings, task_queue):
            handle = await client.start_workflow(
                AgentTaskWorkflow.run, task_input(workspace, "write notes, read the files"),
                id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)
            original = await result_of(handle)
            assert original.status == "completed", (original.stop_reason, original.answer)
            assert [e for e in events_of(original, "compacted") if e["kind"] == "summary"]
            forked = await fork(client, store_for(settings.effective_database_url), settings,
                                handle.id, 1, workspace=str(tmp_path / "forked"))
            result = await result_of(
                client.get_workflow_handle_for(AgentTaskWorkflow.run, forked.task_id))
        assert result.status == "completed", (result.stop_reason, result.answer)
        first = json.dumps(sent(server, 200)[-2]["body"]["messages"])  # before its summary
    assert "notes.md" in first and "f0.txt" not in first
    assert "Earlier turns were compacted" not in first
