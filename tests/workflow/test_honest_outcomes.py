"""Honest outcomes and a complete ledger, on the real Temporal test server with the scripted
model emulating a stock llama-cpp-python endpoint over HTTP."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from refloop.activities.llm_activities import LLMActivities
from refloop.contract import activity_calls
from refloop.contract.activity_io import ClassifyIntentInput, ClassifyIntentResult
from refloop.llm.gateway import LLMGateway
from refloop.llm.prompts import is_tool_pick
from refloop.store.db import store_for
from refloop.workflows import accounting
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, event_types, events_of, final, plan_of
from tests.workflow.helpers import run_task as run_agent_task

UNCERTAIN = {"json": {"intent": "UNCERTAIN", "confidence": 0.3, "reason": "?"}}
BAD_PLAN = {"json": {"task_type": "other", "steps": [{"goal": "think", "tool": "calculator"}]}}


def quirky(scripted_llm, responses: dict, **endpoint) -> str:
    name = unique_scenario(scripted_llm, responses)
    scripted_llm.load(name, {"name": name, "endpoint": endpoint, "responses": responses})
    return name


async def run(client, settings, task_queue, model, workspace, task="do the task", **kw):
    return await run_agent_task(client, settings, task_queue, model, workspace, task=task, **kw)


async def test_golden_no_edit_where_the_plan_needs_one_is_incomplete(
        client, settings, scripted_llm, workspace, task_queue):
    """"Create hello.txt": the model only talks about the file; the run must not claim
    success."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [final("I created hello.txt with a greeting.")],
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace,
                       task="Create hello.txt saying hi", record_as="agent_task_incomplete")
    assert result.status == "incomplete" and result.stop_reason == "work_missing"
    assert "no edit succeeded" in result.missing[0] and "write_file" in result.missing[0]
    assert not (workspace / "hello.txt").exists()
    assert event_types(result)[-1] == "incomplete"
    row = store_for(settings.effective_database_url).get_task(result.task_id)
    assert row.status == "incomplete" and "no edit succeeded" in row.error
    assert row.finished_at is not None


async def test_an_unplanned_task_to_create_a_file_that_wrote_none_is_incomplete(
        client, settings, scripted_llm, workspace, task_queue):
    """Planning off: "create hello.txt", and the model only says it did. Seen with a small
    local model, whose run ended `completed` without the file."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "act": [final("I created hello.txt.")], "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace,
                       task="Create hello.txt saying hi", enable_planning=False)
    assert result.status == "incomplete" and result.stop_reason == "work_missing", result
    assert "no call that changes the workspace succeeded" in result.missing[0]
    assert not (workspace / "hello.txt").exists()


async def test_golden_an_unplanned_task_whose_intent_failed_and_wrote_nothing_is_incomplete(
        client, settings, scripted_llm, workspace, task_queue):
    """Planning off, the intent classification fails open, and the model answers in text.
    Seen with a small local model in the real-model lane: the run ended `completed`
    without the file its task named."""
    model = unique_scenario(scripted_llm, {
        "intent": [{"content": "not json"}] * 3,
        "act": [final("Sure! Here is hello.txt: hi")], "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace,
                       task="Create a file hello.txt containing the word hi.",
                       enable_planning=False, record_as="agent_task_unknown_intent_incomplete")
    assert events_of(result, "intent")[0]["fail_open"]
    assert result.status == "incomplete" and result.stop_reason == "work_missing", result
    assert "no call that changes the workspace succeeded" in result.missing[0]
    assert not (workspace / "hello.txt").exists()


async def test_an_unplanned_task_whose_intent_failed_and_asked_no_change_completes(
        client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [{"content": "not json"}] * 3,
        "act": [final("The notes are about testing.")], "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace,
                       task="Summarise the notes in one line", enable_planning=False)
    assert events_of(result, "intent")[0]["fail_open"]
    assert result.status == "completed" and result.missing == [], result.missing


async def test_golden_an_unplanned_task_done_by_a_command_completes(
        client, settings, scripted_llm, workspace, task_queue):
    """Recorded: its end decides from the changes counted in the state."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [call("run_cmd", command="echo hi > hello.txt"), final("created")],
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace,
                       task="Create hello.txt saying hi", enable_planning=False,
                       record_as="agent_task_decides_from_state")
    assert result.status == "completed" and result.missing == [], result.missing
    assert (workspace / "hello.txt").read_text() == "hi\n"


async def test_a_long_unplanned_task_whose_change_came_before_continue_as_new_completes(
        client, settings, scripted_llm, workspace, task_queue):
    """The only change is the first call; 110 reads follow, and continue-as-new trims its
    events away. The run decides from its state, so it still completes."""
    reads = {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}] * 110}
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "act": [call("run_cmd", command="echo hi > hello.txt"), reads, final("created")],
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace,
                       task="Create hello.txt saying hi", enable_planning=False,
                       max_iterations=10, triggers={"enabled": False},
                       continue_as_new_after_events=200)
    assert "continued_as_new" in event_types(result)
    assert not any(e["tool"] == "run_cmd" for e in events_of(result, "tool_call"))  # trimmed
    assert result.status == "completed" and result.missing == [], result.missing
    assert (workspace / "hello.txt").read_text() == "hi\n"


async def test_a_successful_edit_completes(client, settings, scripted_llm, workspace,
                                           task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="hello.txt", content="hi\n"), final("written")],
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace)
    assert result.status == "completed" and result.missing == []


async def test_golden_question_that_cannot_be_planned_is_answered_directly(
        client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [UNCERTAIN], "plan": [BAD_PLAN] * 3,
        "act": [final("2 + 2 = 4")], "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace, task="What is 2+2?",
                       record_as="agent_task_direct_answer")
    assert result.status == "completed", result.answer
    assert result.answer == "2 + 2 = 4"
    skipped = events_of(result, "plan_skipped")[0]
    assert skipped["direct_answer"] and "calculator" in skipped["reason"]
    act = scripted_llm.requests(model=model, purpose="act")[0]["body"]
    assert "tools" not in act and "No tools" in act["messages"][0]["content"]


async def test_a_task_that_needs_tools_still_fails_on_a_bad_plan(
        client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {"intent": [UNCERTAIN], "plan": [BAD_PLAN] * 3})
    result = await run(client, settings, task_queue, model, workspace,
                       task="Write the answer to 2+2 into answer.txt")
    assert result.status == "failed" and result.stop_reason == "invalid_plan"


async def test_stock_llama_cpp_endpoint_negotiates_and_counts_every_request(
        client, settings, scripted_llm, workspace, task_queue):
    """json_schema answered with a 500 naming response_format, tool calls only when
    tool_choice is sent, one transport error: every request in the ledger."""
    model = quirky(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [{"status": 503},
                call("write_file", path="hello.txt", content="hi\n"), final("written")],
        "summary": [SUMMARY],
    }, reject_json_schema=500, tools_need_choice=True)
    result = await run(client, settings, task_queue, model, workspace)
    assert result.status == "completed", result.answer
    assert (workspace / "hello.txt").read_text() == "hi\n"
    sent = scripted_llm.requests(model=model)
    # intent: rejected + answered; plan: straight to the remembered mode; act: 503 + 2.
    assert [r["purpose"] for r in sent] == ["intent", "intent", "plan", "act", "act", "act",
                                            "summary"]
    assert [r["status"] for r in sent][:2] == [500, 200]
    stats = result.stats
    assert stats.llm_calls == len(sent) == 7
    assert stats.llm_failed_calls == 2
    assert stats.usage_by_purpose["act"].calls == 3
    assert stats.usage_by_purpose["act"].failed_calls == 1
    assert stats.usage_by_model[model].calls == 7


async def test_a_model_ignoring_max_tokens_is_cut_and_the_task_goes_on(
        client, settings, scripted_llm, workspace, task_queue):
    """llama-cpp-python 0.3.36's flaws, emulated over HTTP: a tool call it chooses itself
    cannot stream and, unstreamed, ignores max_tokens. So the endpoint is asked which tool,
    then for the call with it named, both streamed; a call whose arguments run on is hung
    up at its cap, counted with its overrun and told to the model. No request goes
    unstreamed, none passes its cap by more than a chunk, and the task completes."""
    settings = settings.model_copy(update={"refloop_max_tokens": "act=48"})
    write = {"name": "write_file", "arguments": {"path": "hello.txt", "content": "hi\n"}}
    model = quirky(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [{"runaway": True, "token_ms": 10, "tool_calls": [write]},
                call("write_file", path="hello.txt", content="hi\n"), final("written")],
        "summary": [SUMMARY],
    }, stream_tools_break=True, unstreamed_tools_run_away=True,
       stream_repeats_call_fields=True)
    result = await run(client, settings, task_queue, model, workspace)
    assert result.status == "completed", result.answer
    assert (workspace / "hello.txt").read_text() == "hi\n"
    acts = scripted_llm.requests(model=model, purpose="act")
    picks = [is_tool_pick(r["body"]) for r in acts]
    # The stream that ended without a chunk; then each answer is a pick and a named call.
    assert picks == [False, True, False, True, False, True, False]
    assert all(r["body"]["stream"] for r in acts)
    assert [r["chunks"] for r in acts][0] == 0
    assert all(r["chunks"] <= r["body"]["max_tokens"] + 2 for r in acts)
    runaway = acts[2]
    assert runaway["body"]["tool_choice"]["function"]["name"] == "write_file"
    # The cap, the token the server was on, and one more a loaded machine may send
    # before the hang-up reaches it.
    assert runaway["hung_up"] and 48 <= runaway["chunks"] <= 50
    assert "cut off at the limit of 48 tokens" in acts[4]["body"]["messages"][-1]["content"]
    act = result.stats.usage_by_purpose["act"]
    assert act.calls == len(acts) == 7 and act.cut_calls == 1
    assert act.failed_calls == 2  # the empty stream, the cut answer
    assert act.completion_tokens >= 48
    assert result.stats.llm_calls == len(scripted_llm.requests(model=model))


async def test_requests_of_a_call_that_gave_up_are_counted(client, settings, scripted_llm,
                                                           workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [{"status": 500}, {"status": 404, "body": {"error": {"message": "no model"}}}],
    })
    result = await run(client, settings, task_queue, model, workspace)
    assert result.status == "failed"
    assert result.stats.llm_calls == 4 and result.stats.llm_failed_calls == 2
    assert result.stats.usage_by_purpose["act"].calls == 2


async def test_failed_intent_attempts_are_counted_though_it_fails_open(
        client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [{"content": "not json"}] * 3,
        "plan": [plan_of("read_file")], "act": [final("nothing to do")],
        "summary": [SUMMARY],
    })
    (workspace / "a.txt").write_text("x")
    result = await run(client, settings, task_queue, model, workspace)
    assert events_of(result, "intent")[0]["fail_open"]
    assert result.stats.usage_by_purpose["intent"].calls == 3
    assert result.stats.usage_by_purpose["intent"].failed_calls == 3


async def test_each_failed_attempt_is_one_readable_line(client, settings, scripted_llm,
                                                        workspace, task_queue, caplog):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [{"status": 404, "body": {"error": {"message": "no such model"}}}],
    })
    (workspace / "a.txt").write_text("x")
    with caplog.at_level("WARNING", logger="refloop.attempts"):
        await run(client, settings, task_queue, model, workspace)
    lines = [r.getMessage() for r in caplog.records if r.name == "refloop.attempts"]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith(f"act attempt 1 failed: HTTP 404 from {scripted_llm.base_url}")
    assert "no such model" in lines[0] and lines[0].endswith("giving up")


async def test_golden_question_planned_as_an_edit_is_answered_directly(
        client, settings, scripted_llm, workspace, task_queue):
    """"What is 2+2?" with a valid plan that writes a file: no tools, no stray file, and not
    `incomplete` for a missing edit the question never asked for."""
    model = unique_scenario(scripted_llm, {
        "intent": [UNCERTAIN], "plan": [plan_of("write_file")],
        "act": [final("4")], "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace, task="What is 2+2?",
                       record_as="agent_task_question_planned_as_edit")
    assert result.status == "completed" and result.answer == "4", result.missing
    skipped = events_of(result, "plan_skipped")[0]
    assert skipped["direct_answer"] and "write_file" in skipped["reason"]
    act = scripted_llm.requests(model=model, purpose="act")[0]["body"]
    assert "tools" not in act and "No tools" in act["messages"][0]["content"]
    assert list(workspace.iterdir()) == []


@workflow.defn(name="TimedOutIntentLedgerTest")
class TimedOutIntentWorkflow:
    """One intent call whose attempts the server times out; returns the usage the workflow
    can recover from the failure, as the agent workflow's accounting does."""

    @workflow.run
    async def run(self, model: str) -> dict | None:
        try:
            await workflow.execute_activity(
                activity_calls.CLASSIFY_INTENT.name, ClassifyIntentInput(task="hi", model=model),
                result_type=ClassifyIntentResult, start_to_close_timeout=timedelta(seconds=2),
                retry_policy=RetryPolicy(maximum_attempts=2,
                                         initial_interval=timedelta(milliseconds=100)))
        except ActivityError as err:
            if isinstance(err.cause, ActivityTimeout):
                record = accounting.failed_usage(err.cause.last_heartbeat_details)
                return record.model_dump(mode="json") if record else None
        return None


async def test_requests_of_an_attempt_temporal_timed_out_are_counted(
        client, settings, scripted_llm, task_queue):
    """An attempt the server times out (start-to-close) never reports: its requests reach
    the workflow through the ledger it heartbeated as each request went out."""
    model = unique_scenario(scripted_llm, {"intent": [{"content": "{}", "delay_ms": 8000}] * 2})
    gateway = LLMGateway(settings)
    llm = LLMActivities(gateway, store_for(settings.effective_database_url))
    async with Worker(client, task_queue=task_queue, workflows=[TimedOutIntentWorkflow],
                      activities=[llm.classify_intent],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        record = await client.execute_workflow(
            TimedOutIntentWorkflow.run, model, id=f"timeout-ledger-{uuid.uuid4()}",
            task_queue=task_queue, execution_timeout=timedelta(seconds=90))
    assert record is not None, "no usage reached the workflow"
    usage = record["usage"]
    assert (usage["calls"], usage["failed_calls"], usage["abandoned_calls"]) == (2, 2, 2)
    assert usage["abandoned_max_tokens"] == 2 * gateway.max_tokens["intent"]
