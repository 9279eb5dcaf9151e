"""The quality_review activity: snippet, deterministic checks, then the reviewer model."""

from __future__ import annotations

import asyncio

from refloop.activities.defn import implements
from refloop.activities.model_calls import call_model
from refloop.contract import activity_calls
from refloop.contract.activity_io import (
    EditedFile,
    JudgeEditInput,
    QualityReviewInput,
    QualityReviewResult,
)
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


def read_for_review(inp: QualityReviewInput) -> EditedFile:
    """The edited file as the reviewer sees it (reads the workspace: on the task's host)."""
    file_path, content = read_edited(inp)
    snippet, start, end = build_snippet(inp, content)
    return EditedFile(file_path=file_path, tool=inp.tool, snippet=snippet, start_line=start,
                      end_line=end, problems=deterministic_problems(file_path, content))


class ReviewActivities:
    def __init__(self, gateway: LLMGateway) -> None:
        self.gateway = gateway

    @implements(activity_calls.QUALITY_REVIEW)
    async def quality_review(self, inp: QualityReviewInput) -> QualityReviewResult:
        """Read and judge in one activity (runs recorded before the split)."""
        edited = await asyncio.to_thread(read_for_review, inp)
        failed = edited.failed_checks()
        if failed is not None:  # no model call: the file is broken whatever the rules say
            return QualityReviewResult(review=failed)
        return await self.judge_edit(JudgeEditInput(task=inp.task, edited=edited,
                                                    rules=inp.rules, model=inp.model,
                                                    endpoint=inp.endpoint))

    @implements(activity_calls.READ_EDIT)
    async def read_edit(self, inp: QualityReviewInput) -> EditedFile:
        return await asyncio.to_thread(read_for_review, inp)

    @implements(activity_calls.JUDGE_EDIT)
    async def judge_edit(self, inp: JudgeEditInput) -> QualityReviewResult:
        edited = inp.edited
        out = await call_model(self.gateway.structured(
            Purpose.quality_review,
            review_messages(inp.task, edited.file_path, edited.snippet, inp.rules),
            QualityVerdict,
            model=self.gateway.settings.review_model(inp.model),
            endpoint=inp.endpoint,
        ))
        verdict = out.value
        return QualityReviewResult(
            review=edited.review(
                passed=verdict.passed, outcome="passed" if verdict.passed else "failed",
                reasons=verdict.reasons, suggestions=verdict.suggestions, summary=verdict.summary,
            ),
            usage=out.usage,
        )
