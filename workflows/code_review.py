"""CodeReviewWorkflow: the code-review supervisor. Review agent -> Verify agent -> merge -> format.

Every sub-agent call is an activity, so the result can only come from recorded activity
results (listed in `provenance`); supervisor retries (agent ERROR, invalid JSON,
QUALITY_TOO_LOW) share a budget of 3 attempts, while transport failures are Temporal's
activity retries and cost no attempt.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls, hosts
    from refloop.contract.activity_calls import ActivityCall
    from refloop.contract.activity_io import HostCheckInput
    from refloop.contract.code_review import (
        MAX_ATTEMPTS,
        AgentCallInput,
        AgentCallResult,
        CodeReviewInput,
        CodeReviewResult,
        FormatInput,
        LoadContentInput,
        RecordContentInput,
        RetryContext,
        ReviewContent,
        ReviewOutput,
    )

from refloop.workflows import code_review_logic as logic
from refloop.workflows.agent_base import describe_failure
from refloop.workflows.calls import Calls, ModelQueueRouter
from refloop.workflows.visibility_phase import show_code_review

WAITING = "waiting_for_host"


@workflow.defn(name="CodeReviewWorkflow")
class CodeReviewWorkflow(ModelQueueRouter):
    @workflow.init
    def __init__(self, request: CodeReviewInput) -> None:
        self.activities = Calls(router=self)  # its content read on the review's host
        self.request = request
        self.task_id = request.task_id or workflow.info().workflow_id
        self.attempts: list[dict[str, Any]] = []
        self.provenance: list[dict[str, Any]] = []
        self.stage = "content"
        self._on_host: bool | None = None

    def _routes_to_host(self) -> bool:
        """Whether the content read runs on the review's host (asked once per run)."""
        if self._on_host is None:
            self._on_host = bool(self.request.host)
        return self._on_host

    def activity_queue(self, activity: ActivityCall[Any, Any]) -> str | None:
        if activity.runs_on == "workspace" and self._routes_to_host():
            return hosts.host_queue(workflow.info().task_queue, self.request.host or "")
        return super().activity_queue(activity)

    def host_wait(self, activity: ActivityCall[Any, Any]) -> timedelta | None:
        if activity.runs_on != "workspace" or not self._routes_to_host():
            return None
        return hosts.host_wait(self.request.host_wait_s)

    async def host_waiting(self, waiting: bool, activity: ActivityCall[Any, Any],
                           waited: timedelta) -> None:
        """No worker of the host took the read within `waited`: the review shows
        `waiting_for_host` until one does (a state, not a failure)."""
        if waiting == (self.stage == WAITING):
            return
        self.stage = WAITING if waiting else "content"
        show_code_review(WAITING if waiting else "running")

    async def _check_host(self) -> None:
        """A host the database does not know, or whose roots do not hold the directory,
        fails the review at once with the reason (the API answers 422 with the same)."""
        host = self.request.host
        if not host or not self._routes_to_host():
            return
        try:
            await self.activities.call(activity_calls.CHECK_HOST,
                                HostCheckInput(host=host,
                                               workspace=self.request.working_directory),
                                summary=f"host {host}")
        # A local activity's failure arrives as the activity's own ApplicationError.
        except (ActivityError, ApplicationError) as err:
            raise ApplicationError(describe_failure(err), type=hosts.HostRefused.__name__,
                                   non_retryable=True) from None

    @workflow.query(description="The review's stage (content, review, verify, format, done) "
                    "and its supervisor attempts so far.")
    def status(self) -> dict[str, Any]:
        return {"stage": self.stage, "attempts": self.attempts}

    @workflow.run
    async def run(self, request: CodeReviewInput) -> CodeReviewResult:
        show_code_review("running")
        try:
            result = await self._review(request)
        except (Exception, asyncio.CancelledError):  # not GeneratorExit: an evicted run
            show_code_review("failed")                # is closed outside the event loop
            raise
        show_code_review(result.status)
        return result

    async def _review(self, request: CodeReviewInput) -> CodeReviewResult:
        await self._check_host()
        content = await self.activities.call(
            activity_calls.LOAD_REVIEW_CONTENT,
            LoadContentInput(request=request, task_id=self.task_id),
            summary="load review content")
        await self._record("content", {"files": content.files, "files_ref": content.files_ref,
                                       "skipped": content.skipped})
        retry = RetryContext()
        requirements: list[str] = []
        review: ReviewOutput | None = None
        dropped_total = 0
        while retry.attempt_number <= MAX_ATTEMPTS:
            task = logic.task_json(request, self.task_id, retry, requirements)
            if review is None:
                self.stage = "review"
                call = await self._agent(activity_calls.REVIEW_AGENT, task, content, None)
                error = logic.review_error(call.review, call.invalid)
                if error:
                    retry = self._failed(retry, "review", error, "re-run review with context")
                    continue
                assert call.review is not None  # else review_error reported an error
                kept, dropped = logic.drop_hallucinated(call.review.issues, content)
                dropped_total += len(dropped)
                review = call.review.model_copy(update={"issues": kept})
                await self._record("review", review.model_dump(mode="json"))
            self.stage = "verify"
            call = await self._agent(activity_calls.VERIFY_AGENT, task, content, review)
            verdict, detail = logic.verify_verdict(call.verify, call.invalid)
            if verdict == "error":
                assert detail is not None  # an error always says what it was
                retry = self._failed(retry, "verify", detail, "re-run verify with context")
                continue
            if verdict == "quality_too_low":
                requirements = logic.raised_requirements(call.verify)
                retry = self._failed(retry, "verify", f"QUALITY_TOO_LOW: {detail}",
                                     "re-run review with raised quality requirements")
                review = None
                continue
            assert call.verify is not None  # else the verdict is "error"
            await self._record("verification", call.verify.model_dump(mode="json"))
            return await self._finish(review, call, dropped_total, content)
        return CodeReviewResult(
            task_id=self.task_id, status="failed",
            output=logic.error_output(self.task_id, self.attempts), attempts=self.attempts,
            provenance=self.provenance, dropped_hallucinations=dropped_total,
            skipped_content=content.skipped)

    async def _finish(self, review: ReviewOutput, verify_call: AgentCallResult,
                      dropped: int, content: ReviewContent) -> CodeReviewResult:
        self.stage = "format"
        assert verify_call.verify is not None  # its verdict was "ok"
        issues, _ = logic.merge(review, verify_call.verify)
        report = logic.detailed_report(self.task_id, issues, review, verify_call.verify)
        output: Any = report
        note = None
        fmt = self.request.output_format
        if fmt == "simple":
            output = logic.simple_items(issues)
        elif fmt != "detailed":
            formatted = await self.activities.call(
                activity_calls.FORMAT_REVIEW,
                FormatInput(instruction=fmt, report=report, model=self.request.model),
                summary="format output")
            lost = logic.lost_findings(formatted.text, issues)
            if lost:  # the user's format wins, but never at the cost of findings
                note = f"custom format dropped findings {lost}; returning the detailed report"
            else:
                output = formatted.text
        self.stage = "done"
        return CodeReviewResult(
            task_id=self.task_id, status="completed", output=output, attempts=self.attempts,
            provenance=self.provenance, dropped_hallucinations=dropped,
            skipped_content=content.skipped, format_note=note)

    async def _agent(self, agent: ActivityCall[AgentCallInput, AgentCallResult],
                     task: dict[str, Any], content: ReviewContent,
                     review: ReviewOutput | None) -> AgentCallResult:
        kind = "review" if agent == activity_calls.REVIEW_AGENT else "verify"
        result = await self.activities.call(
            agent, AgentCallInput(task_json=task, content=content, review=review,
                                  model=self.request.model),
            summary=f"{kind} agent (attempt {task['retry_context']['attempt_number']})")
        self.provenance.append({"agent": kind, "activity_id": result.activity_id,
                                "activity_attempt": result.attempt,
                                "supervisor_attempt": task["retry_context"]["attempt_number"]})
        return result

    def _failed(self, retry: RetryContext, agent: str, error: str, action: str
                ) -> RetryContext:
        self.attempts.append({"attempt": retry.attempt_number, "agent": agent, "error": error,
                              "retry_context": retry.model_dump()})
        return logic.next_retry(retry, error, action)

    async def _record(self, stage: Literal["content", "review", "verification"],
                      payload: dict[str, Any]) -> None:
        await self.activities.call(
            activity_calls.RECORD_REVIEW_CONTENT,
            RecordContentInput(task_id=self.task_id, review_type=self.request.review_type,
                               stage=stage, payload=payload),
            summary=f"record {stage}")
