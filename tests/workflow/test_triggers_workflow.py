"""Early reflection in the running workflow: guidance reaches the next act; constraints
enforced."""

from __future__ import annotations

import json

from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, event_types, events_of, final, plan_of
from tests.workflow.helpers import run_task as run_agent_task


def act_text(scripted_llm, model, index):
    return json.dumps(scripted_llm.requests(model=model, purpose="act")[index]["body"],
                      ensure_ascii=False)


def repeated_read(scripted_llm, workspace) -> str:
    """A scenario that reads the same file twice, then answers."""
    (workspace / "a.txt").write_text("x\n")
    return unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [call("read_file", path="a.txt"), call("read_file", path="a.txt"),
                final("done")],
        "summary": [SUMMARY],
    })


async def test_repetition_guidance_reaches_the_next_act(client, settings, scripted_llm,
                                                        workspace, task_queue):
    model = repeated_read(scripted_llm, workspace)
    result = await run_agent_task(client, settings, task_queue, model, workspace)
    reflections = events_of(result, "reflection")
    assert [r["trigger"] for r in reflections] == ["repetition"]
    assert reflections[0]["iteration"] == 2 and "called 2 times" in reflections[0]["evidence"]
    assert "Reflection triggered" not in act_text(scripted_llm, model, 1)
    assert "Stop repeating this call" in act_text(scripted_llm, model, 2)
    types = event_types(result)
    second_result = [i for i, kind in enumerate(types) if kind == "tool_result"][1]
    assert types.index("reflection") == second_result + 1


async def test_triggers_off_inject_nothing(client, settings, scripted_llm, workspace,
                                           task_queue):
    model = repeated_read(scripted_llm, workspace)
    result = await run_agent_task(client, settings, task_queue, model, workspace,
                                  triggers={"enabled": False})
    assert "reflection" not in event_types(result)
    assert "Reflection triggered" not in act_text(scripted_llm, model, 2)


async def test_forbidden_tool_refused_then_justified_once(client, settings, scripted_llm,
                                                          workspace, task_queue):
    (workspace / "a.txt").write_text("x\n")
    patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-x\n+y\n"
    research_plan = {"json": {"task_type": "research",
                              "steps": [{"goal": "look into it", "tool": "grep"}]}}
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [research_plan],
        "act": [call("apply_patch", patch=patch),
                call("apply_patch", patch=patch, justification="the user asked for the fix"),
                call("apply_patch", patch=patch, justification="again"),
                final("patched")],
        "summary": [SUMMARY],
    })
    result = await run_agent_task(client, settings, task_queue, model, workspace,
                                  task="investigate the trend in a.txt",
                                  triggers={"cooldown_iterations": 10})
    constraints = events_of(result, "constraints")[0]
    assert constraints["task_type"] == "research" and "apply_patch" in constraints["forbidden"]
    outcomes = [r for r in events_of(result, "tool_result") if r["tool"] == "apply_patch"]
    assert outcomes[0]["ok"] is False and "E_FORBIDDEN" in outcomes[0]["error"]
    assert "grep" in outcomes[0]["error"]  # the refusal names the allowed tools
    assert outcomes[1]["ok"] is True and (workspace / "a.txt").read_text() == "y\n"
    assert outcomes[2]["ok"] is False  # the exception is allowed once only
    assert [(v["tool"], v["justified"]) for v in result.tool_violations] == [
        ("apply_patch", False), ("apply_patch", True), ("apply_patch", False)]
    assert "grep" in result.allowed_tools_snapshot


async def test_forbidden_tool_in_plan_is_sent_back(client, settings, scripted_llm, workspace,
                                                   task_queue):
    bad = {"json": {"task_type": "research", "steps": [{"goal": "fix", "tool": "apply_patch"}]}}
    good = {"json": {"task_type": "research", "steps": [{"goal": "look", "tool": "grep"}]}}
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [bad, good], "act": [final("looked")],
        "summary": [SUMMARY],
    })
    result = await run_agent_task(client, settings, task_queue, model, workspace,
                                  task="research the trend")
    rejected = events_of(result, "plan_rejected")[0]
    assert "forbidden for research" in rejected["violations"][0]
    replan = json.dumps(scripted_llm.requests(model=model, purpose="plan")[1]["body"])
    assert "forbidden for research" in replan and "Never use: apply_patch" in replan
    assert result.plan.steps[0].tool == "grep"


async def test_golden_violations_and_review_caps_stay_bounded(client, settings, scripted_llm,
                                                               workspace, task_queue):
    """More violations than a task carries: the recent ones, and how many were left out; a
    file capped by its failed review is skipped when edited again (state of bounded lists,
    recorded as `agent_task_bounded_lists.json`)."""
    from refloop.contract.policies import VIOLATIONS_CARRIED

    (workspace / "a.txt").write_text("x\n")
    patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-x\n+y\n"
    refused = VIOLATIONS_CARRIED + 2
    research_plan = {"json": {"task_type": "research", "steps": [
        {"goal": "look into it", "tool": "grep"}, {"goal": "write it up", "tool": "write_file"}]}}
    fail = {"json": {"pass": False, "reasons": ["no Summary"], "suggestions": "add one",
                     "summary": "missing summary"}}
    write = call("write_file", path="r.md", content="# R\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [research_plan],
        "act": [{"tool_calls": [{"name": "apply_patch", "arguments": {"patch": patch}}] * refused},
                write, write, final("wrote r.md")],
        "quality_review": [fail],
        "summary": [SUMMARY],
    })
    result = await run_agent_task(client, settings, task_queue, model, workspace,
                                  task="investigate the trend in a.txt",
                                  record_as="agent_task_bounded_lists",
                                  enable_quality_review=True, quality_review_max_rounds=1,
                                  triggers={"cooldown_iterations": 10})
    assert result.status != "failed", result.stop_reason
    assert len(events_of(result, "tool_violation")) == refused  # each one told as it came
    assert len(result.tool_violations) == VIOLATIONS_CARRIED
    assert result.tool_violations_left_out == refused - VIOLATIONS_CARRIED
    assert all(v["tool"] == "apply_patch" and not v["justified"] for v in result.tool_violations)
    assert (workspace / "a.txt").read_text() == "x\n"  # every one refused
    assert [r["cap_reached"] for r in events_of(result, "quality_review")] == [True]
    assert [s["file_path"] for s in events_of(result, "quality_review_skipped")] == ["r.md"]
    assert len(scripted_llm.requests(model=model, purpose="quality_review")) == 1
