"""The quality review loop on the real Temporal dev server with the scripted reviewer."""

from __future__ import annotations

import asyncio
import json

from refloop.store.db import store_for
from tests.llm_fixtures import unique_scenario
from tests.proxy import DatabaseProxy
from tests.workflow.helpers import CODING, SUMMARY, call, event_types, events_of, final, plan_of
from tests.workflow.helpers import run_task as run_agent_task

RULES = "Every report must have a Summary section."
FAIL = {"json": {"pass": False, "reasons": ["no Summary section"],
                 "suggestions": "add '## Summary'", "summary": "missing summary"}}
PASS = {"json": {"pass": True, "reasons": [], "suggestions": "", "summary": "looks good"}}


def scenario(act: list, reviews: list | None = None) -> dict:
    responses = {"intent": [CODING], "plan": [plan_of("write_file")], "act": act,
                 "summary": [SUMMARY]}
    if reviews:
        responses["quality_review"] = reviews
    return responses


async def run_reviewed(client, settings, task_queue, model, workspace, **overrides):
    overrides.setdefault("enable_quality_review", True)
    overrides.setdefault("quality_review_rules", RULES)
    return await run_agent_task(client, settings, task_queue, model, workspace, **overrides)


def review_calls(scripted_llm, model):
    return scripted_llm.requests(model=model, purpose="quality_review")


def act_text(scripted_llm, model, index):
    return json.dumps(scripted_llm.requests(model=model, purpose="act")[index]["body"])


async def test_fail_then_fix_then_pass(client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, scenario(
        act=[call("write_file", path="report.md", content="# Report\n\nBody.\n"),
             call("str_replace_based_edit_tool", command="str_replace", path="report.md",
                  old_str="Body.", new_str="Body.\n\n## Summary\n\nDone."),
             final("report fixed")],
        reviews=[FAIL, PASS],
    ))
    result = await run_reviewed(client, settings, task_queue, model, workspace)

    assert result.status == "completed"
    assert [(r.file_path, r.outcome) for r in result.quality_reviews] == [
        ("report.md", "failed"), ("report.md", "passed")]
    reviews = events_of(result, "quality_review")
    assert reviews[0]["pass"] is False and reviews[0]["reasons"] == ["no Summary section"]
    reflections = events_of(result, "reflection")
    assert len(reflections) == 1 and reflections[0]["trigger"] == "quality_review"
    # The reviewer saw the task, the path, the numbered snippet and the delimited rules.
    first_review = json.dumps(review_calls(scripted_llm, model)[0]["body"])
    assert "report.md" in first_review and RULES in first_review
    assert "REVIEW_RULES" in first_review and "1\\t# Report" in first_review
    # The review and the reflection reach the model right after the edit.
    second_act = act_text(scripted_llm, model, 1)
    assert "[quality_review] report.md: FAIL" in second_act
    assert "Fix report.md" in second_act and "add '## Summary'" in second_act
    third_act = act_text(scripted_llm, model, 2)
    assert third_act.count("Reflection on the quality reviews") == 1  # none added on pass
    stats = result.stats
    assert (stats.reviews.total, stats.reviews.passed, stats.reviews.failed) == (2, 1, 1)
    assert stats.usage_by_purpose["quality_review"].calls == 2
    rows = store_for(settings.effective_database_url).list_quality_reviews(
        task_id=result.task_id)
    assert [(r.file_path, r.passed) for r in rows] == [("report.md", False), ("report.md", True)]
    assert rows[0].reasons == ["no Summary section"] and rows[0].suggestions


async def test_pass_produces_no_reflection(client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, scenario(
        act=[call("write_file", path="r.md", content="# R\n\n## Summary\n\nok\n"), final()],
        reviews=[PASS],
    ))
    result = await run_reviewed(client, settings, task_queue, model, workspace)
    assert result.stats.reviews.passed == 1
    assert "reflection" not in event_types(result)
    assert "Reflection" not in act_text(scripted_llm, model, 1)
    assert "[quality_review] r.md: PASS" in act_text(scripted_llm, model, 1)


async def test_reads_views_and_failed_edits_are_not_reviewed(client, settings, scripted_llm,
                                                             workspace, task_queue):
    (workspace / "a.md").write_text("# A\n")
    model = unique_scenario(scripted_llm, scenario(act=[
        call("read_file", path="a.md"),
        call("str_replace_based_edit_tool", command="view", path="a.md"),
        call("str_replace_based_edit_tool", command="str_replace", path="a.md",
             old_str="not there", new_str="x"),
        call("run_cmd", command="echo hi > a.md"),
        final(),
    ]))
    result = await run_reviewed(client, settings, task_queue, model, workspace)
    # The planned edit never succeeded: the run says so instead of claiming completion.
    assert result.status == "incomplete"
    assert review_calls(scripted_llm, model) == [] and result.quality_reviews == []


async def test_json_edit_is_reviewed_with_its_path(client, settings, scripted_llm, workspace,
                                                   task_queue):
    (workspace / "conf.json").write_text('{"retries": 1}')
    model = unique_scenario(scripted_llm, scenario(
        act=[call("json_edit_tool", operation="set", file_path="conf.json",
                  json_path="$.retries", value=3), final()],
        reviews=[PASS],
    ))
    result = await run_reviewed(client, settings, task_queue, model, workspace)
    assert [r.file_path for r in result.quality_reviews] == ["conf.json"]
    assert "set $.retries = 3" in json.dumps(review_calls(scripted_llm, model)[0]["body"])


async def test_invalid_json_fails_deterministically_without_a_model_call(
    client, settings, scripted_llm, workspace, task_queue
):
    model = unique_scenario(scripted_llm, scenario(
        act=[call("write_file", path="bad.json", content='{"a": 1,'), final()]))
    result = await run_reviewed(client, settings, task_queue, model, workspace)
    review = result.quality_reviews[0]
    assert review.outcome == "deterministic_failed" and review.reasons[0].startswith(
        "invalid JSON")
    assert review_calls(scripted_llm, model) == []
    assert "Fix bad.json" in act_text(scripted_llm, model, 1)


async def test_garbage_and_outage_fail_open(client, settings, scripted_llm, workspace,
                                            task_queue):
    model = unique_scenario(scripted_llm, scenario(
        act=[call("write_file", path="a.md", content="# A\n"),
             call("write_file", path="b.md", content="# B\n"), final()],
        reviews=[{"content": "garbage"}] * 3 + [{"status": 503}] * 3,
    ))
    result = await run_reviewed(client, settings, task_queue, model, workspace)
    assert result.status == "completed"
    assert [r.outcome for r in result.quality_reviews] == ["unavailable", "unavailable"]
    assert result.stats.reviews.unavailable == 2
    assert "review unavailable" in act_text(scripted_llm, model, 1)
    assert "reflection" not in event_types(result)


async def test_reviewer_timeout_fails_open(client, settings, scripted_llm, workspace,
                                           task_queue):
    settings = settings.model_copy(update={"refloop_llm_timeout_s": 0.5})
    model = unique_scenario(scripted_llm, scenario(
        act=[call("write_file", path="a.md", content="# A\n"), final()],
        reviews=[{**PASS, "delay_ms": 2000}] * 3,
    ))
    result = await run_reviewed(client, settings, task_queue, model, workspace)
    assert result.status == "completed"
    assert result.quality_reviews[0].outcome == "unavailable"
    assert "timed out" in result.quality_reviews[0].summary.lower() or \
        "unreachable" in result.quality_reviews[0].summary.lower()


async def test_review_rounds_are_capped_per_file(client, settings, scripted_llm, workspace,
                                                 task_queue):
    write = call("write_file", path="r.md", content="# R\n")
    model = unique_scenario(scripted_llm, scenario(act=[write, write, write, final()],
                                                   reviews=[FAIL, FAIL]))
    result = await run_reviewed(client, settings, task_queue, model, workspace,
                                quality_review_max_rounds=2)
    assert result.status == "completed"
    assert len(review_calls(scripted_llm, model)) == 2  # the third edit is not reviewed
    assert events_of(result, "quality_review")[1]["cap_reached"] is True
    assert events_of(result, "quality_review_skipped")[0]["file_path"] == "r.md"
    assert "review round limit" in act_text(scripted_llm, model, 2)


async def test_two_edits_in_one_response_are_reviewed_in_order(client, settings, scripted_llm,
                                                               workspace, task_queue):
    both = {"tool_calls": [
        {"name": "write_file", "arguments": {"path": "one.md", "content": "# 1\n"}},
        {"name": "write_file", "arguments": {"path": "two.md", "content": "# 2\n"}},
    ]}
    model = unique_scenario(scripted_llm, scenario(act=[both, final()], reviews=[PASS, FAIL]))
    result = await run_reviewed(client, settings, task_queue, model, workspace)
    sequence = [(e.type, e.data.get("tool") or e.data.get("file_path")) for e in result.events
                if e.type in ("tool_call", "quality_review")]
    assert sequence == [("tool_call", "write_file"), ("quality_review", "one.md"),
                        ("tool_call", "write_file"), ("quality_review", "two.md")]
    first_act = scripted_llm.requests(model=model, purpose="act")[0]["body"]
    assert first_act["parallel_tool_calls"] is False


async def test_review_off_makes_no_review_calls(client, settings, scripted_llm, workspace,
                                                task_queue):
    model = unique_scenario(scripted_llm, scenario(
        act=[call("write_file", path="r.md", content="# R\n"), final()]))
    result = await run_reviewed(client, settings, task_queue, model, workspace,
                                enable_quality_review=False)
    assert review_calls(scripted_llm, model) == [] and result.quality_reviews == []
    assert "parallel_tool_calls" not in scripted_llm.requests(model=model, purpose="act")[0][
        "body"]


async def test_db_outage_during_persistence_loses_no_review(client, settings, scripted_llm,
                                                            workspace, task_queue):
    proxy = DatabaseProxy()  # down when the task starts, up 3 s later
    outage = settings.model_copy(update={"database_url": settings.database_url.replace(
        "127.0.0.1:5432", f"127.0.0.1:{proxy.port}")})
    model = unique_scenario(scripted_llm, scenario(
        act=[call("write_file", path="r.md", content="# R\n"), final()], reviews=[FAIL]))

    async def come_back() -> None:
        await asyncio.sleep(3)
        await proxy.start()

    later = asyncio.create_task(come_back())
    try:
        result = await run_reviewed(client, outage, task_queue, model, workspace)
    finally:
        await later
        await proxy.stop()
    assert result.status == "completed"
    rows = store_for(settings.effective_database_url).list_quality_reviews(
        task_id=result.task_id)
    assert [(r.file_path, r.passed) for r in rows] == [("r.md", False)]
