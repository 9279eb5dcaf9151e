"""Completeness reflection and supplement child workflows, on the real server."""

from __future__ import annotations

import json

import pytest

from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, event_types, events_of, final, plan_of
from tests.workflow.helpers import run_task as run_agent_task

COMPLETE = {"json": {"is_complete": True, "analysis": "all done", "missing_aspects": [],
                     "supplements": []}}
SAVE_SUMMARY = {"json": {
    "is_complete": False, "analysis": "the summary was never saved",
    "missing_aspects": ["persist the summary"],
    "supplements": [{"action": "save the summary to summary.md", "reason": "asked for",
                     "suggested_tools": ["write_file", "send_email"]}],
}}
SUPPLEMENT_PLAN = {"json": {"task_type": "creation",
                            "steps": [{"goal": "save summary.md", "tool": "write_file"}]}}


async def run(client, settings, task_queue, model, workspace, **overrides):
    overrides.setdefault("enable_reflection", True)
    return await run_agent_task(client, settings, task_queue, model, workspace,
                                task="read data.txt and save a summary", **overrides)


def requests(scripted_llm, model, purpose):
    return scripted_llm.requests(model=model, purpose=purpose)


def base_acts(answer: str = "summarised the data") -> list:
    return [call("read_file", path="data.txt"), final(answer)]


async def test_complete_on_first_check_costs_one_call(client, settings, scripted_llm,
                                                      workspace, task_queue):
    (workspace / "data.txt").write_text("value=42\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")], "act": base_acts(),
        "completeness": [COMPLETE], "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace)
    assert result.status == "completed"
    assert len(requests(scripted_llm, model, "completeness")) == 1
    reflection = events_of(result, "reflection")
    assert reflection == [{"trigger": "completeness", "round": 1, "is_complete": True,
                           "analysis": "all done", "missing_count": 0, "supplements_count": 0,
                           "missing_aspects": [],
                           # advisory only: an unmarked step does not decide on its own
                           "evidence": ["plan step 1: use read_file was not marked complete"],
                           "fail_open": False}]
    assert "reflection_exec" not in event_types(result) and result.supplements == []
    # The judge saw the condensed history, not raw outputs, and the available tools.
    judge = json.dumps(requests(scripted_llm, model, "completeness")[0]["body"]["messages"])
    assert "read_file" in judge and "write_file" in judge


async def test_incomplete_runs_a_child_that_writes_the_missing_file(
    client, settings, scripted_llm, workspace, task_queue
):
    (workspace / "data.txt").write_text("value=42\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [*base_acts(),
                call("write_file", path="summary.md", content="# Summary\nvalue=42\n"),
                final("saved summary.md")],
        "completeness": [SAVE_SUMMARY, COMPLETE],
        "supplement_plan": [SUPPLEMENT_PLAN],
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace,
                       record_as="agent_task_with_supplement")

    assert result.status == "completed"
    assert (workspace / "summary.md").read_text() == "# Summary\nvalue=42\n"
    types = event_types(result)
    order = [t for t in types if t.startswith("reflection")]
    assert order == ["reflection", "reflection_plan", "reflection_exec", "reflection"]
    first, second = events_of(result, "reflection")
    assert first["is_complete"] is False and first["supplements_count"] == 1
    assert second["is_complete"] is True and second["round"] == 2
    execution = events_of(result, "reflection_exec")[0]
    assert execution["child_workflow_id"] == f"{result.workflow_id}-supplement-1"
    assert (execution["attempted"], execution["succeeded"], execution["success_rate"]) == (
        1, 1, 1.0)
    # The plan request carried the supplement objective's marker; unavailable tools were
    # filtered out.
    plan_request = json.dumps(requests(scripted_llm, model, "supplement_plan")[0]["body"])
    assert "Missing actions to supplement:" in plan_request
    assert "send_email" not in plan_request
    # Global stats cover parent and child: 2 parent acts + 2 child acts, 2 tool calls.
    assert result.stats.tool_calls == 2 and result.stats.usage_by_purpose["act"].calls == 4
    assert result.supplements[0]["status"] == "completed"
    # The child saw the parent's results without redoing them.
    child_first_act = json.dumps(requests(scripted_llm, model, "act")[2]["body"]["messages"])
    assert "Results of the earlier run" in child_first_act and "value=42" in child_first_act
    summary_request = json.dumps(requests(scripted_llm, model, "summary")[0]["body"])
    assert "supplement" in summary_request
    # The Web UI's summary and details of the child: English, never the judge's marker.
    child = await client.get_workflow_handle(execution["child_workflow_id"]).fetch_history()
    metadata = child.events[0].user_metadata
    summary, details = (json.loads(metadata.summary.data), json.loads(metadata.details.data))
    assert summary.startswith("supplement 1: ") and "【" not in summary + details
    assert "reason:" in details


async def test_unparseable_judge_fails_open(client, settings, scripted_llm, workspace,
                                            task_queue):
    (workspace / "data.txt").write_text("x\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")], "act": base_acts(),
        "completeness": [{"content": "I think it is fine"}] * 3, "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace)
    assert result.status == "completed"
    reflection = events_of(result, "reflection")[0]
    assert reflection["is_complete"] is True and reflection["fail_open"] is True
    assert len(requests(scripted_llm, model, "completeness")) == 3  # 1 + FC retries (2)


async def test_supplements_are_capped(client, settings, scripted_llm, workspace, task_queue):
    (workspace / "data.txt").write_text("x\n")
    many = {"json": {"is_complete": False, "analysis": "lots missing", "missing_aspects": ["a"],
                     "supplements": [{"action": f"do thing {n}", "reason": "r",
                                      "suggested_tools": []} for n in range(5)]}}
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [*base_acts(), final("did the things")],
        "completeness": [many, COMPLETE], "supplement_plan": [SUPPLEMENT_PLAN],
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace,
                       reflection_max_supplements=2)
    assert events_of(result, "reflection")[0]["supplements_count"] == 2
    plan_request = json.dumps(requests(scripted_llm, model, "supplement_plan")[0]["body"])
    assert "do thing 1" in plan_request and "do thing 2" not in plan_request


async def test_reflection_off_makes_no_judge_call(client, settings, scripted_llm, workspace,
                                                  task_queue):
    (workspace / "data.txt").write_text("x\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")], "act": base_acts(),
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace, enable_reflection=False)
    assert result.status == "completed"
    assert requests(scripted_llm, model, "completeness") == []
    assert "reflection" not in event_types(result)


async def test_failing_child_does_not_fail_the_parent(client, settings, scripted_llm,
                                                      workspace, task_queue):
    (workspace / "data.txt").write_text("x\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [*base_acts(), {"status": 404, "body": {"error": {"message": "no such model"}}}],
        "completeness": [SAVE_SUMMARY], "supplement_plan": [SUPPLEMENT_PLAN],
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace)
    # Not failed, but not completed either: the judge's missing items are still missing.
    assert result.status == "incomplete" and result.missing
    assert event_types(result)[-1] == "incomplete"
    execution = events_of(result, "reflection_exec")[0]
    assert execution["succeeded"] == 0 and "error" in execution
    assert result.supplements[0]["status"] == "failed"
    summary_request = json.dumps(requests(scripted_llm, model, "summary")[0]["body"])
    assert "failed" in summary_request


async def test_claimed_but_missing_file_is_caught_without_the_judge(
    client, settings, scripted_llm, workspace, task_queue
):
    (workspace / "data.txt").write_text("x\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": base_acts("I saved the summary to summary.md."),
        # The judge is fooled, the deterministic check is not.
        "completeness": [COMPLETE, COMPLETE],
        "supplement_plan": [SUPPLEMENT_PLAN],
        "summary": [SUMMARY],
    })
    # One check only: the evidence alone makes the task incomplete.
    result = await run(client, settings, task_queue, model, workspace, reflection_max_rounds=1)
    reflection = events_of(result, "reflection")[0]
    assert reflection["is_complete"] is False
    assert any("summary.md" in item for item in reflection["evidence"])
    judge = json.dumps(requests(scripted_llm, model, "completeness")[0]["body"])
    assert "summary.md" in judge and "does not exist" in judge


@pytest.mark.slow
async def test_judge_sees_tool_calls_made_before_a_continue_as_new(
    client, settings, scripted_llm, workspace, task_queue
):
    """Continue-as-new carries only the recent events, and the state keeps only the latest
    tool records (the rest are in the blob store); the judge still sees the first call."""
    (workspace / "early-marker.txt").write_text("first\n")
    fillers = [{"name": "list_dir", "arguments": {"path": "."}}] * 210
    turns = [{"tool_calls": fillers[n:n + 30]} for n in range(0, len(fillers), 30)]
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [call("read_file", path="early-marker.txt"), *turns, final("done")],
        "completeness": [COMPLETE], "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace, max_iterations=200,
                       triggers={"enabled": False}, continue_as_new_after_events=200)
    assert result.status == "completed"
    assert "continued_as_new" in event_types(result)
    # The first call's events were trimmed away before the judge ran ...
    assert not any(e.data.get("args", {}).get("path") == "early-marker.txt"
                   for e in result.events if e.type == "tool_call")
    # ... and the judge still saw it, with every later call.
    judge = json.dumps(requests(scripted_llm, model, "completeness")[0]["body"]["messages"])
    assert "early-marker.txt" in judge
    assert judge.count("list_dir") >= len(fillers)


async def test_a_claimed_file_found_missing_is_incomplete_even_when_the_judge_fails(
        client, settings, scripted_llm, workspace, task_queue):
    """The judge failing open never undoes what the disk said: an answer claiming a file
    that is not there ends `incomplete`, naming it."""
    (workspace / "data.txt").write_text("x\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [call("read_file", path="data.txt"), call("complete_step", step=1,
                                                           summary="read it"),
                final("Done: I wrote summary.md with the summary.")],
        "completeness": [{"status": 400, "body": {"error": {"message": "no"}}}],
        "summary": [SUMMARY],
    })
    result = await run(client, settings, task_queue, model, workspace)
    assert result.status == "incomplete", result.answer
    assert any("summary.md" in item for item in result.missing), result.missing
    assert not (workspace / "summary.md").exists()
