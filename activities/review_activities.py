"""The quality_review activity: snippet, deterministic checks, then the reviewer model."""

from __future__ import annotations

import asyncio

from temporalio import activity

from refloop.activities.model_calls import call_model
from refloop.contract import activity_calls
from refloop.contract.activity_io import QualityReview, QualityReviewInput, QualityReviewResult
from refloop.contract.errors import ToolError
from refloop.contract.messages import Purpose
from refloop.llm.gateway import LLMGateway
from refloop.review.quality import (
    QualityVerdict,
    deterministic_problems,
    extract_snippet,
    json_edit_snippet,
    review_messages,
)
from refloop.tools.sandbox import is_file, read_text, resolve, workspace_root


def read_edited(inp: QualityReviewInput) -> tuple[str, str]:
    """(file path, file content after the edit); a deleted file reads as empty."""
    file_path = inp.data.get("file_path", "")
    path = resolve(workspace_root(inp.workspace), file_path)
    try:
        return file_path, read_text(path, file_path) if is_file(path) else ""
    except ToolError:  # binary, linked or too large: nothing to review
        return file_path, ""


def build_snippet(inp: QualityReviewInput, content: str) -> tuple[str, int | None, int | None]:
    if inp.tool == "json_edit_tool":
        return json_edit_snippet(content, inp.data, inp.snippet_lines), None, None
    if inp.tool == "apply_patch":
        lines = str(inp.arguments.get("patch", "")).splitlines()[: inp.snippet_lines]
        return "The applied unified diff:\n" + "\n".join(lines), None, None
    snippet = extract_snippet(content, inp.data, inp.snippet_lines)
    return snippet.text, snippet.start_line, snippet.end_line


class ReviewActivities:
    def __init__(self, gateway: LLMGateway) -> None:
        self.gateway = gateway

    @activity.defn(name=activity_calls.QUALITY_REVIEW.name)
    async def quality_review(self, inp: QualityReviewInput) -> QualityReviewResult:
        file_path, content = await asyncio.to_thread(read_edited, inp)
        snippet, start, end = build_snippet(inp, content)
        base = {"file_path": file_path, "tool": inp.tool, "start_line": start, "end_line": end}
        problems = deterministic_problems(file_path, content)
        if problems:  # no model call: the file is broken whatever the rules say
            return QualityReviewResult(review=QualityReview(
                **base, passed=False, outcome="deterministic_failed", reasons=problems,
                suggestions="Fix these problems first.", summary="deterministic check failed",
            ))
        out = await call_model(self.gateway.structured(
            Purpose.quality_review,
            review_messages(inp.task, file_path, snippet, inp.rules),
            QualityVerdict,
            model=self.gateway.settings.review_model(inp.model),
            endpoint=inp.endpoint,
        ))
        verdict = out.value
        return QualityReviewResult(
            review=QualityReview(
                **base, passed=verdict.passed, outcome="passed" if verdict.passed else "failed",
                reasons=verdict.reasons, suggestions=verdict.suggestions, summary=verdict.summary,
            ),
            usage=out.usage,
        )
