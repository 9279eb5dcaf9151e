"""AgentTaskWorkflow on the real Temporal dev server with the scripted model over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refloop.store.db import store_for
from refloop.worker.main import build_worker
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CHAT,
    CODING,
    SUMMARY,
    call,
    event_types,
    events_of,
    final,
    plan_of,
    run_task,
    run_with_history,
    start,
)

HISTORIES = Path(__file__).parent.parent / "histories"


def act_requests(scripted_llm, model: str, purpose: str = "act") -> list[dict]:
    return scripted_llm.requests(model=model, purpose=purpose)


async def test_full_task_plans_edits_and_completes(client, settings, scripted_llm, workspace,
                                                   task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("write_file", "read_file")],
        "act": [
            call("write_file", path="notes/hello.md", content="# Hello\n"),
            call("complete_step", step=1, summary="written"),
            final('{"tool": "read_file", "args": {"path": "notes/hello.md"}}'),
            call("complete_step", step=2, summary="checked"),
            final("hello.md is written"),
        ],
        "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, workspace)

    assert result.status == "completed", result.answer
    assert result.answer == "hello.md is written"
    assert result.summary == "summary of the run"
    assert (workspace / "notes" / "hello.md").read_text() == "# Hello\n"
    assert result.completed_steps == [1, 2]
    types = event_types(result)
    assert types[0] == "intent" and types[-1] == "completed"
    assert types.index("plan") < types.index("step") < types.index("tool_call")
    calls = [e["tool"] for e in events_of(result, "tool_call")]
    assert calls == ["write_file", "complete_step", "read_file", "complete_step"]
    # The text-parsed read_file call ran like a native one.
    assert events_of(result, "tool_result")[2]["ok"] is True
    stats = result.stats
    assert stats.iterations == 5 and stats.tool_calls == 4
    assert stats.llm_calls == 1 + 1 + 5 + 1
    assert set(stats.usage_by_purpose) == {"intent", "plan", "act", "summary"}
    assert stats.usage.total_tokens > 0
    # The DB row (real PostgreSQL) holds the run.
    row = store_for(settings.effective_database_url).get_task(result.task_id)
    assert row.status == "completed" and row.result["answer"] == "hello.md is written"
    assert row.usage["llm_calls"] == 8 and row.finished_at is not None


async def test_path_escape_is_refused_and_the_task_continues(client, settings, scripted_llm,
                                                             workspace, task_queue):
    secret = workspace.parent / "secret.txt"
    secret.write_text("top secret")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("read_file")],
        "act": [call("read_file", path="../secret.txt"), final("could not read it")],
        "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, workspace)

    assert result.status == "completed"
    refused = events_of(result, "tool_result")[0]
    assert refused["ok"] is False and "E_PATH_ESCAPE" in refused["error"]
    # The refusal was fed back to the model on its next turn, without the secret.
    second = act_requests(scripted_llm, model)[1]["body"]["messages"]
    fed_back = json.dumps(second)
    assert "E_PATH_ESCAPE" in fed_back and "top secret" not in fed_back


async def test_malformed_plan_json_is_reasked_then_fails_clearly(client, settings, scripted_llm,
                                                                 workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [{"content": "no json here"}, {"content": '{"steps": "x"}'},
                 {"content": "```json\n{broken\n```"}],
    })
    result = await run_task(client, settings, task_queue, model, workspace)

    assert result.status == "failed"
    assert "plan" in result.answer.lower() or "valid" in result.answer.lower()
    plan_calls = act_requests(scripted_llm, model, "plan")
    assert len(plan_calls) == 3  # first ask + 2 re-asks, then no Temporal retry
    reask = json.dumps(plan_calls[1]["body"]["messages"])
    assert "valid" in reask.lower()  # the validation error was quoted back
    assert event_types(result)[-1] == "failed"
    row = store_for(settings.effective_database_url).get_task(result.task_id)
    assert row.status == "failed" and row.error


async def test_model_500_is_waited_out_and_only_the_failed_request_is_sent_again(
        client, settings, scripted_llm, workspace, task_queue):
    """A 500 is an outage, not a failure: the task shows waiting_for_model, the failed
    request alone is sent again in the call's next attempt (the wait holds no worker slot;
    nothing answered is asked twice), and the wait is in the stats."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("list_dir")],
        "act": [{"status": 500, "body": {"error": {"message": "boom"}}},
                call("list_dir", path="."), final("listed")],
        "summary": [SUMMARY],
    })
    inp_workspace = workspace
    async with build_worker(client, settings, task_queue):
        from refloop.contract.task import TaskInput
        handle = await start(client, task_queue, TaskInput(
            task="list", workspace=str(inp_workspace), model=model, enable_reflection=False))
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.status == "completed" and result.answer == "listed"
    statuses = [r["status"] for r in act_requests(scripted_llm, model)]
    assert statuses == [500, 200, 200]
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert max(attempts) == 2  # the wait is between two attempts of the one call
    waiting = events_of(result, "waiting_for_model")
    assert len(waiting) == 1 and waiting[0]["endpoint"] == scripted_llm.base_url
    assert "HTTP 500" in waiting[0]["error"]
    assert len(events_of(result, "model_back")) == 1
    assert result.stats.model_wait_s > 0


async def test_model_not_found_fails_at_once_naming_the_endpoint(
        client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("list_dir")],
        "act": [{"status": 404, "body": {"error": {"message": "no such model",
                                                   "code": "model_not_found"}}}],
    })
    result = await run_task(client, settings, task_queue, model, workspace)

    assert result.status == "failed"
    assert f"HTTP 404 from {scripted_llm.base_url} (model_not_found)" in result.answer
    assert len(act_requests(scripted_llm, model)) == 1
    assert "waiting_for_model" not in event_types(result)


async def test_max_iterations_stops_with_a_clear_outcome(client, settings, scripted_llm,
                                                         workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("list_dir")],
        "act": [call("list_dir", path=".")] * 3,
    })
    result = await run_task(client, settings, task_queue, model, workspace, max_iterations=3)

    assert result.status == "failed" and result.stop_reason == "max_iterations"
    assert result.answer.startswith("stopped: max iterations (3)")
    assert result.stats.iterations == 3
    assert events_of(result, "failed")[0]["stop_reason"] == "max_iterations"


async def test_chat_intent_skips_planning(client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CHAT],
        "act": [final("Hello! I can edit files and run commands.")],
        "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, workspace, task="hi there")

    assert result.status == "completed"
    assert result.answer.startswith("Hello!")
    assert result.plan is None and "plan" not in event_types(result)
    assert act_requests(scripted_llm, model, "plan") == []


async def test_unknown_tool_and_bad_step_are_fed_back(client, settings, scripted_llm, workspace,
                                                      task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("list_dir")],
        "act": [call("teleport", to="mars"), call("complete_step", step=9),
                final("gave up")],
        "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, workspace)

    assert result.status == "completed"
    errors = [r["error"] for r in events_of(result, "tool_result")]
    assert "unknown tool 'teleport'" in errors[0] and "between 1 and 1" in errors[1]
    assert result.stats.tool_errors == 2


async def test_golden_history_recorded(client, settings, scripted_llm, workspace, task_queue):
    """Runs the demo-shaped task; with REFLOOP_RECORD_HISTORIES=1 saves its history."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="a"),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, workspace, task="write a",
                            record_as="agent_task_with_search_attributes")
    assert result.status == "completed"


async def test_task_rows_are_written_by_local_activities(client, settings, scripted_llm,
                                                        workspace, task_queue):
    """DB writes need no task-queue round trip: markers in history, never scheduled tasks."""
    from refloop.contract import activity_calls
    from refloop.contract.task import TaskInput

    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="a"), final("ok")],
        "summary": [SUMMARY],
    })
    result, history = await run_with_history(client, settings, task_queue, TaskInput(
        task="write a", workspace=str(workspace), model=model, enable_reflection=False))
    row = store_for(settings.effective_database_url).get_task(result.task_id)
    assert row.status == "completed" and row.result["answer"] == "ok"
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]
    assert activity_calls.RECORD_TASK.name not in scheduled and "refloop.llm.act" in scheduled
    markers = [e.marker_recorded_event_attributes.marker_name for e in history.events
               if e.HasField("marker_recorded_event_attributes")]
    # the tool catalogue, the model route, then the row: running, completed
    assert markers.count("core_local_activity") == 4


async def test_secrets_never_reach_history_or_events(client, settings, scripted_llm,
                                                     workspace, task_queue, monkeypatch):
    secret = "sk-refloop-secret-4242"
    monkeypatch.setenv("MY_SERVICE_TOKEN", secret)
    secret_settings = settings.model_copy(update={"openai_api_key": secret})
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("run_cmd")],
        "act": [call("run_cmd", command="env"), final("listed the environment")],
        "summary": [SUMMARY],
    })
    from refloop.contract.task import TaskInput

    result, history = await run_with_history(client, secret_settings, task_queue, TaskInput(
        task="show env", workspace=str(workspace), model=model, enable_reflection=False))
    assert result.status == "completed"
    assert secret not in history.to_json()
    assert secret not in result.model_dump_json()
    assert scripted_llm.requests(model=model)[0]["body"]  # the key went only to the header


async def test_token_budget_pauses_the_task_and_ends_it_incomplete_unraised(
        client, settings, scripted_llm, workspace, task_queue):
    """`token_budget`, the earlier name of `max_tokens`: at the limit the task waits for a
    raise (tests/workflow/test_budget.py), and ends incomplete when none comes."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")],
        "act": [call("list_dir", path=".")] * 5 + [final("done")],
    })
    result = await run_task(client, settings, task_queue, model, workspace, token_budget=300,
                            budget_wait_s=1)
    assert result.status == "incomplete" and result.stop_reason == "budget_wait_expired"
    assert result.missing[0].startswith("token limit: ")
    assert result.stats.usage.total_tokens > 0
    assert set(result.stats.usage_by_model) == {model}
    assert result.stats.usage_by_model[model].calls == result.stats.llm_calls


@pytest.mark.slow
async def test_long_task_continues_as_new_with_identical_results(
    client, settings, scripted_llm, workspace, task_queue
):
    """A 75-iteration task spans several runs (continue-as-new past 120 history events:
    more than six runs) and ends like a single run would. `make long-task` runs thousands
    of calls (tests/workflow/test_long_task.py)."""
    iterations, can_events = 75, 120
    steps = iterations - 1
    acts = [call("write_file", path=f"f{n % 7}.txt", content=str(n)) for n in range(steps)]
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [*acts, final("all written")], "summary": [SUMMARY],
    })
    from refloop.contract.task import TaskInput

    result, history = await run_with_history(client, settings, task_queue, TaskInput(
        task="write many", workspace=str(workspace), model=model, max_iterations=iterations,
        enable_reflection=False, triggers={"enabled": False},
        continue_as_new_after_events=can_events))
    assert result.status == "completed" and result.answer == "all written"
    assert result.stats.iterations == iterations and result.stats.tool_calls == steps
    assert result.stats.usage_by_purpose["act"].calls == iterations
    assert len(history.events) < can_events + 100  # the last run's own history stays short
    continued = [e for e in result.events if e.type == "continued_as_new"]
    assert len(continued) >= 5 and result.events[-1].type == "completed", len(continued)
    seqs = [e.seq for e in result.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert (workspace / "f0.txt").read_text() == str(max(n for n in range(steps) if n % 7 == 0))
    row = store_for(settings.effective_database_url).get_task(result.task_id)
    assert row.status == "completed" and row.result["stats"]["iterations"] == iterations


async def test_history_stays_lean_with_megabyte_files(client, settings, scripted_llm,
                                                      workspace, task_queue):
    """A 1 MB write and read: the file is exact, the history carries only markers."""
    from refloop.contract.task import TaskInput

    body = "".join(f"row {n:07d}\n" for n in range(80_000))  # ~1 MB
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="big.txt", content=body),
                call("read_file", path="big.txt"), final("done")],
        "summary": [SUMMARY],
    })
    # Writing a megabyte takes a cap that large: refloop hangs up on a stream at its cap.
    big = settings.model_copy(update={"refloop_max_read_bytes": 2_000_000,
                                      "refloop_max_tokens": "act=300000"})
    result, history = await run_with_history(client, big, task_queue, TaskInput(
        task="write and read", workspace=str(workspace), model=model,
        enable_reflection=False))
    assert result.status == "completed"
    assert (workspace / "big.txt").read_text() == body
    stored = sum(event.ByteSize() for event in history.events)
    # 1 MB went in and out; the history never saw it. What it holds besides: the run's tool
    # catalogue and model route, the workspace's checkpoint after the write, and a marker
    # for each of the 29 patches a run settles at its start (about 400 bytes each).
    assert stored < 52_000, stored
    step_types = {"refloop.llm.act", "refloop.tool.write_file", "refloop.tool.read_file"}
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")}
    per_step = sum(
        e.ByteSize() for e in history.events
        if scheduled.get(e.event_id) in step_types or (
            e.HasField("activity_task_completed_event_attributes") and scheduled.get(
                e.activity_task_completed_event_attributes.scheduled_event_id) in step_types))
    assert per_step / result.stats.iterations <= 8_000, per_step
    # The model read a capped view of the output, not the megabyte.
    third = json.dumps(scripted_llm.requests(model=model, purpose="act")[2]["body"])
    assert "row 0000000" in third and "more characters not shown" in third
    assert len(third) < 60_000


async def test_unsandboxed_worker_runs_the_same_task_and_its_history_replays_sandboxed(
        client, settings, scripted_llm, workspace, task_queue, tmp_path):
    """REFLOOP_WORKFLOW_SANDBOX=false trades the sandbox's guard for throughput; the
    run must be the same and replay under the sandboxed replayer."""
    from temporalio.worker import UnsandboxedWorkflowRunner

    from refloop.contract.task import TaskInput
    from refloop.worker.replay import dump_history, replay_files
    from tests.workflow.helpers import result_of, start

    results, runners = [], []
    for sandboxed in (True, False):
        config = settings.model_copy(update={"refloop_workflow_sandbox": sandboxed})
        model = unique_scenario(scripted_llm, {
            "intent": [CODING], "plan": [plan_of("write_file")],
            "act": [call("write_file", path=f"{sandboxed}.txt", content="a"),
                    call("complete_step", step=1, summary="ok"), final("ok")],
            "summary": [SUMMARY],
        })
        inp = TaskInput(task="write a", workspace=str(workspace), model=model,
                        enable_reflection=False)
        async with build_worker(client, config, task_queue) as worker:
            runners.append(type(worker.config(active_config=True)["workflow_runner"]))
            handle = await start(client, task_queue, inp)
            results.append(await result_of(handle))
            history = await handle.fetch_history()
    assert runners[1] is UnsandboxedWorkflowRunner and runners[0] is not runners[1]
    assert [e.type for e in results[0].events] == [e.type for e in results[1].events]
    assert results[0].stats.tool_calls == results[1].stats.tool_calls == 2
    assert (workspace / "False.txt").read_text() == "a"
    saved = tmp_path / "unsandboxed.json"
    saved.write_text(dump_history(history))
    assert await replay_files([saved]) == {}
