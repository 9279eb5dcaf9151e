"""Pure code-review supervisor logic: retry context, quality gate, hallucination filter,
merge and output formats. No I/O; CodeReviewWorkflow applies these."""

from __future__ import annotations

from collections import Counter
from typing import Any

from refloop.contract.code_review import (
    QUALITY_THRESHOLD,
    CodeReviewInput,
    RetryContext,
    ReviewContent,
    ReviewIssue,
    ReviewOutput,
    VerifyOutput,
)

SEVERITIES = ("Critical", "High", "Medium", "Low")


def task_json(request: CodeReviewInput, task_id: str, retry: RetryContext,
              quality_requirements: list[str]) -> dict[str, Any]:
    """The unified task JSON; retry information is appended to task_desc."""
    desc = request.task_desc
    if retry.attempt_number > 1:
        desc += (f" Retry information: attempt {retry.attempt_number}; previous errors: "
                 f"{'; '.join(retry.previous_errors)}; actions taken: "
                 f"{'; '.join(retry.recovery_actions_taken)}.")
    requirements = list(request.extra_requirements) + quality_requirements
    return {
        "task_id": task_id, "review_type": request.review_type,
        "working_directory": request.working_directory, "task_desc": desc.strip(),
        "priority_focus": request.priority_focus, "extra_requirements": requirements,
        "retry_context": retry.model_dump(),
    }


def next_retry(retry: RetryContext, error: str, action: str) -> RetryContext:
    return RetryContext(attempt_number=retry.attempt_number + 1,
                        previous_errors=[*retry.previous_errors, error],
                        recovery_actions_taken=[*retry.recovery_actions_taken, action])


def normalise_path(path: str) -> str:
    path = path.strip().lstrip("/")
    return path[2:] if path[:2] in ("a/", "b/") else path


def drop_hallucinated(issues: list[ReviewIssue], content: ReviewContent
                      ) -> tuple[list[ReviewIssue], list[ReviewIssue]]:
    """Findings must cite a file and a line present in the reviewed content."""
    kept: list[ReviewIssue] = []
    dropped: list[ReviewIssue] = []
    for issue in issues:
        (kept if cites_content(content, issue) else dropped).append(issue)
    return kept, dropped


def cites_content(content: ReviewContent, issue: ReviewIssue) -> bool:
    name, line = normalise_path(issue.relevantFile), issue.suggestionLine
    if content.line_spans or content.files_ref is not None:
        return any(first <= line <= last for first, last in content.line_spans.get(name, ()))
    return line in content.lines.get(name, ())  # a result recorded before


def review_error(output: ReviewOutput | None, invalid: str | None) -> str | None:
    if invalid:
        return f"invalid review output: {invalid}"
    if output is not None and output.status == "ERROR":
        return output.message or "review agent reported an error"
    return None


def verify_verdict(output: VerifyOutput | None, invalid: str | None) -> tuple[str, str | None]:
    """("ok" | "error" | "quality_too_low", detail)."""
    if invalid:
        return "error", f"invalid verify output: {invalid}"
    if output is None or output.status == "ERROR" or output.verification_result is None:
        message = output.message if output else None
        if output is not None and output.model_extra and output.model_extra.get(
                "error_type") == "QUALITY_TOO_LOW":
            return "quality_too_low", message or "verifier reported QUALITY_TOO_LOW"
        return "error", message or "verify agent reported an error"
    score = output.verification_result.quality_assessment.overall_score
    if score < QUALITY_THRESHOLD:
        return "quality_too_low", f"overall_score {score} < {QUALITY_THRESHOLD}"
    return "ok", None


def raised_requirements(output: VerifyOutput | None) -> list[str]:
    """QUALITY_TOO_LOW: stricter requirements carrying the verifier's critique."""
    requirements = ["QUALITY_TOO_LOW on the previous review: be more thorough and precise; "
                    "cite exact files and lines"]
    if output is not None and output.verification_result is not None:
        assessment = output.verification_result.quality_assessment
        requirements += [f"address weakness: {w}" for w in assessment.weaknesses]
        requirements += [f"do not miss: {m.description} ({m.evidence})"
                         for m in assessment.missing_issues]
    return requirements


def merge(review: ReviewOutput, verify: VerifyOutput) -> tuple[list[dict[str, Any]], int]:
    """Drop findings the verifier marked for deletion; add its missing issues, marked."""
    result = verify.verification_result
    assert result is not None
    delete = {c.issue_id for c in result.accuracy_check if c.deletion_required}
    delete |= {c.issue_id for c in result.rule_compliance_check if c.deletion_required}
    final = [issue.model_dump() for issue in review.issues if issue.id not in delete]
    for number, missing in enumerate(result.quality_assessment.missing_issues, start=1):
        final.append({
            "id": f"MISSING-{number:03d}", "relevantFile": missing.evidence,
            "existingCode": "", "suggestionContent": missing.description, "improvedCode": "",
            "label": "Functionality", "suggestionLine": 0,
            "severity": missing.suggested_severity, "source": "verifier_missing_issue",
        })
    return final, len(delete)


def summarise(issues: list[dict[str, Any]], review: ReviewOutput, verify: VerifyOutput
              ) -> dict[str, Any]:
    counts = Counter(issue.get("severity", "Medium") for issue in issues)
    assessment = verify.verification_result.quality_assessment if verify.verification_result \
        else None
    priority = [f"{i['id']}: {i['suggestionContent'][:120]}" for i in issues
                if i.get("severity") in ("Critical", "High")]
    return {
        "total_issues": len(issues),
        "severity_distribution": {s: counts.get(s, 0) for s in SEVERITIES},
        "overall_assessment": review.summary.get("overall_assessment", "") + (
            f" (verification score {assessment.overall_score})" if assessment else ""),
        "priority_recommendations": priority,
    }


def simple_items(issues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("relevantFile", "existingCode", "suggestionContent", "improvedCode", "label",
            "suggestionLine")
    return [{k: issue.get(k) for k in keys} for issue in issues]


def detailed_report(task_id: str, issues: list[dict[str, Any]], review: ReviewOutput,
                    verify: VerifyOutput) -> dict[str, Any]:
    summary = summarise(issues, review, verify)
    return {
        "task_id": task_id,
        "summary": summary,
        "review_results": {"issues": issues, "summary": review.summary},
        "verification_results": verify.verification_result.model_dump()
        if verify.verification_result else {},
        "final_recommendations": summary["priority_recommendations"] or [
            f"{i['id']}: {i['suggestionContent'][:120]}" for i in issues],
    }


def lost_findings(text: str, issues: list[dict[str, Any]]) -> list[str]:
    """Ids of findings a free-text formatting dropped (neither id nor file:line present)."""
    return [i["id"] for i in issues if i["id"] not in text
            and f"{i['relevantFile']}:{i['suggestionLine']}" not in text]


def error_output(task_id: str, attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """The protocol's error form, carrying every attempt's context."""
    last = attempts[-1]["error"] if attempts else "no attempt ran"
    return {"task_id": task_id, "status": "ERROR",
            "message": f"code review failed after {len(attempts)} attempts: {last}",
            "attempts": attempts}


def incomplete_output(task_id: str, reason: str, attempts: list[dict[str, Any]]
                      ) -> dict[str, Any]:
    """The protocol's error form for a review its spend limit stopped before a verdict."""
    return {"task_id": task_id, "status": "INCOMPLETE",
            "message": f"code review stopped at its spend limit: {reason}",
            "attempts": attempts}
