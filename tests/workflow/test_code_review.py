"""The code-review supervisor on the real Temporal dev server with scripted Review/Verify
agents."""

from __future__ import annotations

import json
import uuid

from refloop.activities.code_review_activities import mirror_file
from refloop.contract import visibility
from refloop.contract.code_review import CodeReviewInput, CodeReviewResult
from refloop.store.db import CodeReviewContentRecord, store_for
from refloop.worker.main import build_worker
from refloop.workflows.code_review import CodeReviewWorkflow
from tests.llm_fixtures import unique_scenario

DIFF = """diff --git a/src/app.py b/src/app.py
--- a/src/app.py
+++ b/src/app.py
@@ -1,3 +1,4 @@
 import os
+password = "hunter2"
 def main():
     return os.environ["HOME"]
"""


def issue(issue_id: str, line: int = 2, file: str = "src/app.py", severity: str = "High"):
    return {"id": issue_id, "relevantFile": file, "existingCode": 'password = "hunter2"',
            "suggestionContent": "hard-coded secret", "improvedCode": "os.environ['PW']",
            "label": "Security", "suggestionLine": line, "severity": severity}


def review(*issues):
    return {"json": {"task_id": "t", "issues": list(issues),
                     "summary": {"overall_assessment": "one secret"}}}


def verify(score: int = 85, delete: tuple[str, ...] = (), missing: list | None = None,
           weaknesses: list | None = None):
    return {"json": {"task_id": "t", "verification_result": {
        "accuracy_check": [{"issue_id": i, "accuracy_status": "INCORRECT",
                            "deletion_required": True} for i in delete],
        "rule_compliance_check": [],
        "quality_assessment": {"overall_score": score, "quality_level": "GOOD",
                               "weaknesses": weaknesses or [],
                               "missing_issues": missing or []}}}}


async def run_review(client, settings, task_queue, scripted_llm, responses, **request):
    model = unique_scenario(scripted_llm, responses)
    inp = CodeReviewInput(review_type=request.pop("review_type", "diff"),
                          working_directory=request.pop("working_directory", "/tmp"),
                          content=request.pop("content", DIFF), model=model, **request)
    async with build_worker(client, settings, task_queue):
        result = await client.execute_workflow(
            CodeReviewWorkflow.run, inp, id=f"cr-{uuid.uuid4().hex[:8]}", task_queue=task_queue,
            result_type=CodeReviewResult)
    return result, model


def bodies(scripted_llm, model, purpose):
    return [json.dumps(r["body"], ensure_ascii=False)
            for r in scripted_llm.requests(model=model, purpose=purpose)]


async def test_happy_path_detailed(client, settings, scripted_llm, task_queue):
    result, model = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]})
    assert result.status == "completed" and result.attempts == []
    output = result.output
    assert set(output) == {"task_id", "summary", "review_results", "verification_results",
                           "final_recommendations"}
    assert output["summary"]["severity_distribution"]["High"] == 1
    assert [p["agent"] for p in result.provenance] == ["review", "verify"]
    assert all(p["activity_id"] for p in result.provenance)
    # The reviewer saw the unified task JSON and the diff.
    first = bodies(scripted_llm, model, "code_review")[0]
    assert "retry_context" in first and "hunter2" in first
    # Filterable in the Web UI and `temporal workflow list --query`.
    found = [w async for w in client.list_workflows(
        f"RefloopKind = 'code_review' AND RefloopStatus = 'completed' AND "
        f"WorkflowId = '{result.task_id}'")]
    described = await client.get_workflow_handle(result.task_id).describe()
    attributes = described.typed_search_attributes
    assert attributes.get(visibility.KIND) == "code_review" and len(found) <= 1
    assert attributes.get(visibility.STATUS) == "completed"


async def test_error_then_retry_with_context(client, settings, scripted_llm, task_queue):
    error = {"json": {"task_id": "t", "status": "ERROR", "message": "content missing"}}
    result, model = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [error, review(issue("ISSUE-001"))], "code_verify": [verify()]},
        task_desc="review it")
    assert result.status == "completed"
    assert result.attempts[0]["error"] == "content missing"
    second = bodies(scripted_llm, model, "code_review")[1]
    assert "attempt 2" in second and "content missing" in second
    assert '\\"attempt_number\\": 2' in second or "attempt_number" in second


async def test_invalid_json_is_a_supervisor_retry(client, settings, scripted_llm, task_queue):
    result, model = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [{"content": "not json"}, review(issue("ISSUE-001"))],
        "code_verify": [verify()]})
    assert result.status == "completed"
    assert result.attempts[0]["error"].startswith("invalid review output")


async def test_quality_too_low_goes_back_to_review(client, settings, scripted_llm, task_queue):
    result, model = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001")), review(issue("ISSUE-001"))],
        "code_verify": [verify(30, weaknesses=["too shallow"]), verify(80)]})
    assert result.status == "completed"
    assert "QUALITY_TOO_LOW" in result.attempts[0]["error"]
    second_review = bodies(scripted_llm, model, "code_review")[1]
    assert "too shallow" in second_review
    assert [p["agent"] for p in result.provenance] == ["review", "verify", "review", "verify"]


async def test_three_failures_give_the_error_form(client, settings, scripted_llm, task_queue):
    error = {"json": {"task_id": "t", "status": "ERROR", "message": "cannot read"}}
    result, _ = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [error, error, error]})
    assert result.status == "failed"
    assert result.output["status"] == "ERROR" and len(result.output["attempts"]) == 3
    assert "after 3 attempts" in result.output["message"]


async def test_deletion_filter_and_missing_issues(client, settings, scripted_llm, task_queue):
    missing = [{"description": "no input validation", "evidence": "src/app.py:3",
                "suggested_severity": "Medium"}]
    result, _ = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001"), issue("ISSUE-002", line=3))],
        "code_verify": [verify(delete=("ISSUE-002",), missing=missing)]})
    issues = result.output["review_results"]["issues"]
    assert [i["id"] for i in issues] == ["ISSUE-001", "MISSING-001"]
    assert issues[1]["source"] == "verifier_missing_issue"


async def test_hallucinated_findings_are_dropped(client, settings, scripted_llm, task_queue):
    result, model = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001"), issue("ISSUE-X", file="src/nope.py"),
                               issue("ISSUE-Y", line=99))],
        "code_verify": [verify()]})
    assert result.dropped_hallucinations == 2
    assert [i["id"] for i in result.output["review_results"]["issues"]] == ["ISSUE-001"]
    assert "ISSUE-X" not in bodies(scripted_llm, model, "code_verify")[0]


async def test_simple_and_custom_formats(client, settings, scripted_llm, task_queue):
    simple, _ = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]},
        output_format="simple")
    assert simple.output == [{k: issue("ISSUE-001")[k] for k in (
        "relevantFile", "existingCode", "suggestionContent", "improvedCode", "label",
        "suggestionLine")}]
    custom, _ = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()],
        "summary": [{"content": "- ISSUE-001 src/app.py:2 hard-coded secret"}]},
        output_format="a markdown bullet list")
    assert custom.output == "- ISSUE-001 src/app.py:2 hard-coded secret"
    lossy, _ = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()],
        "summary": [{"content": "all good!"}]}, output_format="one line")
    assert isinstance(lossy.output, dict) and "ISSUE-001" in lossy.format_note


async def test_content_record_grows_in_db_and_file(client, settings, scripted_llm, task_queue):
    result, _ = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001"))], "code_verify": [verify()]})
    row = store_for(settings.effective_database_url).get(CodeReviewContentRecord,
                                                         result.task_id)
    assert "src/app.py" in row.content["files"]
    assert row.review_result["issues"][0]["id"] == "ISSUE-001"
    assert row.verification_result["verification_result"]["quality_assessment"][
        "overall_score"] == 85
    mirror = mirror_file(settings.refloop_data_dir / "review_content", result.task_id)
    document = json.loads(mirror.read_text())
    assert list(document) == ["task_id", "review_type", "created_at", "content",
                              "review_result", "verification_result"]


async def test_file_review_reads_inside_the_directory(client, settings, scripted_llm,
                                                      task_queue, workspace):
    (workspace / "m.py").write_text("a = 1\nb = 2\n")
    result, model = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001", file="m.py", line=2))],
        "code_verify": [verify()]},
        review_type="file", working_directory=str(workspace), content=None,
        file_paths=["m.py"])
    assert result.status == "completed" and result.dropped_hallucinations == 0
    assert "b = 2" in bodies(scripted_llm, model, "code_review")[0]


async def test_a_file_past_temporals_payload_limit_is_reviewed_by_reference(
        client, settings, scripted_llm, task_queue, workspace):
    """A 3 MB lockfile (Temporal refuses payloads over 2 MB): the text goes through the
    shared store, so every payload of the review's history stays small, and the agents
    and the content record still read it."""
    line = '    "left-pad": {"version": "1.3.0", "resolved": "https://r/left-pad-1.3.0.tgz"},\n'
    text = line * (3 * 1024 * 1024 // len(line) + 1)
    (workspace / "package-lock.json").write_text(text)
    last = text.count("\n")
    result, model = await run_review(client, settings, task_queue, scripted_llm, {
        "code_review": [review(issue("ISSUE-001", file="package-lock.json", line=last),
                               issue("ISSUE-002", file="package-lock.json", line=last + 5))],
        "code_verify": [verify()]},
        review_type="file", working_directory=str(workspace), content=None,
        file_paths=["package-lock.json"], max_content_lines=10)
    assert result.status == "completed", result
    assert result.dropped_hallucinations == 1  # the line past the file's end
    assert scripted_llm.requests(model=model, purpose="code_review")  # it was asked
    history = await client.get_workflow_handle(result.task_id).fetch_history()
    largest = max(len(event.SerializeToString()) for event in history.events)
    assert largest < 64 * 1024, largest
    row = store_for(settings.effective_database_url).get(CodeReviewContentRecord,
                                                         result.task_id)
    assert row.content["files"]["package-lock.json"] == text
