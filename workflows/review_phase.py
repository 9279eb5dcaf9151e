"""The enforced quality-review hook, as a phase of the agent workflow."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls, policies
    from refloop.contract.activity_io import (
        JudgeEditInput,
        QualityReview,
        QualityReviewInput,
        QualityReviewResult,
        RecordQualityReviewInput,
        ToolResult,
    )
    from refloop.contract.messages import ToolCall

from refloop.workflows import accounting, review_logic
from refloop.workflows.agent_base import AgentBase, describe_failure


class QualityReviewPhase(AgentBase):
    async def _review_feedback(self, call: ToolCall, result: ToolResult,
                               reviews: list[QualityReview]) -> str:
        """The call's review (if it gets one) as the text the model reads after the tool's
        result; the review joins `reviews`."""
        review = await self._maybe_review(call, result)
        if review is None:
            return ""
        reviews.append(review)
        return "\n\n" + review_logic.review_feedback(review)

    def _quality_reflection(self, reviews: list[QualityReview]) -> str | None:
        """The reflection a turn's failed reviews call for, emitted as an event."""
        reflection = review_logic.reflect_on_quality_results(reviews,
                                                             set(self.state.reviews.capped))
        if reflection:
            self._emit("reflection", {"trigger": "quality_review", "message": reflection})
        return reflection

    async def _maybe_review(self, call: ToolCall, result: ToolResult) -> QualityReview | None:
        """The enforced hook: a review activity after every successful edit."""
        inp = self.state.input
        if not inp.enable_quality_review or not review_logic.needs_review(
            call, result, self._tool_properties(call.name), inp.quality_review_tools
        ):
            return None
        file_path = result.data.get("file_path", "")
        if file_path in self.state.reviews.capped:
            # edited again: still remembered
            self.state.reviews.capped = review_logic.recent_first_out(
                self.state.reviews.capped, file_path, policies.REVIEW_FILES_KEPT)
            self._emit("quality_review_skipped", {"file_path": file_path, "reason": "cap"})
            return None
        request = QualityReviewInput(
            task=inp.task,
            workspace=inp.workspace,
            tool=call.name,
            arguments=call.arguments,
            data=result.data,
            rules=inp.quality_review_rules or review_logic.DEFAULT_RULES,
            model=inp.model,
            endpoint=inp.endpoint,
            snippet_lines=inp.quality_review_snippet_lines,
        )
        summary = f"quality review {file_path}"
        try:
            outcome = await self._read_then_judge(request, summary)
            review = outcome.review
            if outcome.usage is not None:
                self._account(outcome.usage)
        except ActivityError as err:
            self._account_failure(err)
            # Fail-open: a broken reviewer never blocks the task; the outcome says so.
            review = QualityReview(
                file_path=file_path, passed=True, outcome="unavailable", tool=call.name,
                summary=describe_failure(err)[:300],
            )
        self._count_review(review)
        await self._store_write(
            activity_calls.RECORD_QUALITY_REVIEW,
            RecordQualityReviewInput(
                task_id=self.state.task_id,
                review_key=f"{self.state.task_id}:{self.state.reviews.count}",
                session_id=inp.session_id,
                review=review,
            ),
            summary=f"record quality review {file_path}",
        )
        return review

    async def _read_then_judge(self, request: QualityReviewInput, summary: str
                               ) -> QualityReviewResult:
        """The edited file read on the task's host; the reviewer model asked on the model
        queue (under the fleet's rate limit) unless deterministic checks already failed."""
        edited = await self.activities.call(activity_calls.READ_EDIT, request,
                                     summary=f"read {request.data.get('file_path', '')}")
        failed = edited.failed_checks()
        if failed is not None:
            return QualityReviewResult(review=failed)
        return await self.activities.call(
            activity_calls.JUDGE_EDIT,
            JudgeEditInput(task=request.task, edited=edited, rules=request.rules,
                           model=request.model, endpoint=request.endpoint),
            summary=summary)

    def _count_review(self, review: QualityReview) -> None:
        reviews = self.state.reviews
        reviews.done = review_logic.carried_reviews(reviews.done, [review],
                                                    self._reviews_carried())
        reviews.count += 1
        max_rounds = self.state.input.quality_review_max_rounds
        reviews.failures, reviews.capped, capped = review_logic.remember_failure(
            reviews.failures, reviews.capped, review, max_rounds, policies.REVIEW_FILES_KEPT)
        self.state.stats = accounting.count_review(self.state.stats, review)
        self._emit(
            "quality_review",
            {
                "file_path": review.file_path,
                "pass": review.passed,
                "outcome": review.outcome,
                "reasons": review.reasons,
                "summary": review.summary,
                "cap_reached": capped,
            },
        )
