"""Code-review supervisor logic and content handling, without Temporal."""

from __future__ import annotations

import json

from refloop.contract.code_review import (
    CodeReviewInput,
    RetryContext,
    ReviewContent,
    ReviewIssue,
    ReviewOutput,
    VerifyOutput,
)
from refloop.review.content import by_reference, cap_content, line_spans, split_diff
from refloop.workflows import code_review_logic as logic

DIFF = """diff --git a/a.py b/a.py
--- a/a.py
+++ b/a.py
@@ -10,2 +10,3 @@
 x = 1
+y = 2
 z = 3
diff --git a/b.py b/b.py
--- /dev/null
+++ b/b.py
@@ -0,0 +1,2 @@
+def f():
+    pass
"""


def issue(issue_id, file="a.py", line=11, severity="High"):
    return ReviewIssue(id=issue_id, relevantFile=file, suggestionContent=f"fix {issue_id}",
                       suggestionLine=line, severity=severity)


def verify(score=80, delete=(), missing=(), status=None, **extra):
    if status:
        return VerifyOutput(task_id="t", status=status, message="m", **extra)
    return VerifyOutput.model_validate({"task_id": "t", "verification_result": {
        "accuracy_check": [{"issue_id": i, "deletion_required": True} for i in delete],
        "rule_compliance_check": [],
        "quality_assessment": {"overall_score": score, "weaknesses": ["shallow"],
                               "missing_issues": list(missing)}}})


def test_split_diff_maps_new_line_numbers():
    files, lines = split_diff(DIFF)
    assert list(files) == ["a.py", "b.py"]
    assert lines == {"a.py": [10, 11, 12], "b.py": [1, 2]}


def test_cap_content_names_what_it_skipped():
    capped = cap_content({"a": "1\n2", "b": "3\n4", "c": "5"}, {"a": [1], "b": [1], "c": [1]}, 3)
    assert list(capped.files) == ["a", "c"] and capped.skipped == ["b"]  # a later one fits


def test_hallucinated_findings_dropped():
    content = ReviewContent(files={"a.py": "x"}, lines={"a.py": [10, 11, 12]})
    kept, dropped = logic.drop_hallucinated(
        [issue("1"), issue("2", file="b/a.py", line=12), issue("3", line=99),
         issue("4", file="nope.py")], content)
    assert [i.id for i in kept] == ["1", "2"] and [i.id for i in dropped] == ["3", "4"]


def test_task_json_carries_retry_context_and_requirements():
    request = CodeReviewInput(review_type="diff", working_directory="/w", task_desc="check",
                              extra_requirements=["no prints"])
    retry = logic.next_retry(RetryContext(), "timeout reading", "recreate content")
    task = logic.task_json(request, "t1", retry, ["be thorough"])
    assert task["retry_context"] == {"attempt_number": 2, "previous_errors": ["timeout reading"],
                                     "recovery_actions_taken": ["recreate content"]}
    assert "attempt 2" in task["task_desc"] and "timeout reading" in task["task_desc"]
    assert task["extra_requirements"] == ["no prints", "be thorough"]
    first = logic.task_json(request, "t1", RetryContext(), [])
    assert first["task_desc"] == "check"


def test_agent_verdicts():
    assert logic.review_error(ReviewOutput(status="ERROR", message="boom"), None) == "boom"
    assert logic.review_error(None, "bad json").startswith("invalid review output")
    assert logic.review_error(ReviewOutput(issues=[]), None) is None
    assert logic.verify_verdict(verify(80), None) == ("ok", None)
    assert logic.verify_verdict(verify(49), None)[0] == "quality_too_low"
    assert logic.verify_verdict(verify(status="ERROR"), None)[0] == "error"
    assert logic.verify_verdict(verify(status="ERROR", error_type="QUALITY_TOO_LOW"),
                                None)[0] == "quality_too_low"
    raised = logic.raised_requirements(verify(
        30, missing=[{"description": "sql injection", "evidence": "a.py:11"}]))
    assert any("shallow" in r for r in raised) and any("sql injection" in r for r in raised)


def test_merge_summary_and_formats():
    review = ReviewOutput(issues=[issue("1"), issue("2", severity="Low")],
                          summary={"overall_assessment": "ok"})
    checked = verify(delete=("2",), missing=[{"description": "leak", "evidence": "a.py:12",
                                              "suggested_severity": "Critical"}])
    final, deleted = logic.merge(review, checked)
    assert deleted == 1 and [i["id"] for i in final] == ["1", "MISSING-001"]
    report = logic.detailed_report("t", final, review, checked)
    assert report["summary"]["severity_distribution"] == {"Critical": 1, "High": 1,
                                                          "Medium": 0, "Low": 0}
    assert len(report["final_recommendations"]) == 2
    assert set(logic.simple_items(final)[0]) == {"relevantFile", "existingCode",
                                                 "suggestionContent", "improvedCode", "label",
                                                 "suggestionLine"}
    assert logic.lost_findings("a.py:11 and MISSING-001", final) == []
    assert logic.lost_findings("nothing", final) == ["1", "MISSING-001"]


def test_error_output_keeps_every_attempt():
    attempts = [{"attempt": n, "error": f"e{n}"} for n in (1, 2, 3)]
    out = logic.error_output("t", attempts)
    assert out["status"] == "ERROR" and out["attempts"] == attempts and "e3" in out["message"]


def test_content_by_reference_keeps_names_and_line_runs_and_stores_the_text():
    files, lines = split_diff(DIFF)
    stored: dict[str, str] = {}

    def put(text: str) -> str:
        stored["k"] = text
        return "k"

    content = by_reference(cap_content(files, lines, 3000), put)
    assert content.files == {} and content.lines == {} and content.files_ref == "k"
    assert json.loads(stored["k"]) == files
    assert line_spans([7, 1, 2, 3, 9, 8, 3]) == [(1, 3), (7, 9)]
    cited = [issue(f"I-{name}-{line}", file=name, line=line)
             for name, numbers in lines.items() for line in numbers]
    kept, dropped = logic.drop_hallucinated(cited + [issue("far", line=10_000)], content)
    assert kept == cited and len(dropped) == 1
