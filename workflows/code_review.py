"""CodeReviewWorkflow: the code-review supervisor. Review agent -> Verify agent -> merge -> format.

Every sub-agent call is an activity, so the result can only come from recorded activity
results (listed in `provenance`); supervisor retries (agent ERROR, invalid JSON,
QUALITY_TOO_LOW) share a budget of 3 attempts, while transport failures are Temporal's
activity retries and cost no attempt.

A review with a spend limit (`max_cost_usd`, `max_tokens`: its own, a review is no task's
child) checks it before each model call as a task does (`budget_phase`): a call the limit
does not cover waits `waiting_for_budget`, no request going out, until the `raise_budget`
update raises it, or ends the review `incomplete` after `budget_wait_s`. Its usage and cost
are in its result. A review without a limit runs no command for it.
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
    from refloop.contract.activity_io import HostCheckInput, LLMUsageRecord
    from refloop.contract.budget import RAISE_BUDGET_UPDATE, BudgetRaise, BudgetState
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
    from refloop.contract.messages import TokenUsage

from refloop.workflows import accounting
from refloop.workflows import budget_phase as budget
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
        # Its model calls' usage and cost, and its limit as last raised
        self.usage = TokenUsage()
        self.max_cost_usd = request.max_cost_usd
        self.max_tokens = request.max_tokens
        self.dropped = 0  # findings citing lines not in the content
        self.skipped: list[str] = []  # files over the size cap

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

    @workflow.query(description="The review's stage (content, review, verify, format, done, "
                    "waiting_for_host, waiting_for_budget), its supervisor attempts so far, "
                    "and its spend (with its limit).")
    def status(self) -> dict[str, Any]:
        return {"stage": self.stage, "attempts": self.attempts,
                "budget": self._budget().model_dump()}

    # ------------------------------------------------------------ its spend limit

    def _not_covered(self) -> str | None:
        """Why its limit does not cover the next model call (None: it does, or no limit)."""
        if self.max_cost_usd is None and self.max_tokens is None:
            return None
        return accounting.over_budget(self.usage, self.max_cost_usd, self.max_tokens)

    def _budget(self) -> BudgetState:
        return BudgetState(max_cost_usd=self.max_cost_usd, max_tokens=self.max_tokens,
                           cost_usd=self.usage.cost_usd, tokens=self.usage.total_tokens,
                           waiting=self.stage == budget.WAITING
                           and self._not_covered() is not None)

    async def _covered(self) -> None:
        """Before a model call: wait `waiting_for_budget` until the limit covers it
        (budget_phase.BudgetWaitExpired when nobody raises it in time)."""
        why = self._not_covered()
        if why is None:
            return
        stage, self.stage = self.stage, budget.WAITING
        show_code_review(budget.WAITING)
        await budget.wait_for_cover(self._not_covered, why, self.request.budget_wait_s)
        self.stage = stage
        show_code_review("running")

    def _spent(self, record: LLMUsageRecord | None) -> None:
        if record is not None:
            self.usage = self.usage.add(record.usage)

    @workflow.update(name=RAISE_BUDGET_UPDATE, description="Set the review's spend limit: "
                     '{"max_cost_usd": 5.0} and/or {"max_tokens": 2000000}, totals; refused '
                     "below what it has spent. A review waiting for budget goes on once the "
                     "limit covers its next model call.")
    def raise_budget(self, new: BudgetRaise) -> BudgetState:
        limits = budget.raised_limits(new)
        self.max_cost_usd = limits.get("max_cost_usd", self.max_cost_usd)
        self.max_tokens = limits.get("max_tokens", self.max_tokens)
        return self._budget()

    @raise_budget.validator
    def _validate_budget(self, new: BudgetRaise) -> None:
        if self.stage == "done":
            raise ValueError("the review has ended")
        refused = budget.refusal(self.usage, new)
        if refused:
            raise ValueError(refused)

    def _result(self, status: Literal["completed", "failed", "incomplete"], output: Any,
                **fields: Any) -> CodeReviewResult:
        limited = self.max_cost_usd is not None or self.max_tokens is not None
        return CodeReviewResult(
            task_id=self.task_id, status=status, output=output, attempts=self.attempts,
            provenance=self.provenance, dropped_hallucinations=self.dropped,
            skipped_content=self.skipped, usage=self.usage,
            budget=self._budget() if limited else None, **fields)

    # ------------------------------------------------------------ the review

    @workflow.run
    async def run(self, request: CodeReviewInput) -> CodeReviewResult:
        show_code_review("running")
        try:
            try:
                result = await self._review(request)
            except budget.BudgetWaitExpired as stop:  # before its review was done
                self.stage = "done"
                result = self._result("incomplete",
                                      logic.incomplete_output(self.task_id, stop.reason,
                                                              self.attempts),
                                      stop_reason=stop.reason)
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
        self.skipped = content.skipped
        retry = RetryContext()
        requirements: list[str] = []
        review: ReviewOutput | None = None
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
                self.dropped += len(dropped)
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
            return await self._finish(review, call)
        return self._result("failed", logic.error_output(self.task_id, self.attempts))

    async def _finish(self, review: ReviewOutput, verify_call: AgentCallResult
                      ) -> CodeReviewResult:
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
            try:
                await self._covered()
            except budget.BudgetWaitExpired as stop:  # the findings stand, unformatted
                self.stage = "done"
                return self._result("incomplete", report, stop_reason=stop.reason,
                                    format_note="the spend limit did not cover the custom "
                                    "format; returning the detailed report")
            formatted = await self.activities.call(
                activity_calls.FORMAT_REVIEW,
                FormatInput(instruction=fmt, report=report, model=self.request.model),
                summary="format output")
            self._spent(formatted.usage)
            lost = logic.lost_findings(formatted.text, issues)
            if lost:  # the user's format wins, but never at the cost of findings
                note = f"custom format dropped findings {lost}; returning the detailed report"
            else:
                output = formatted.text
        self.stage = "done"
        return self._result("completed", output, format_note=note)

    async def _agent(self, agent: ActivityCall[AgentCallInput, AgentCallResult],
                     task: dict[str, Any], content: ReviewContent,
                     review: ReviewOutput | None) -> AgentCallResult:
        kind = "review" if agent == activity_calls.REVIEW_AGENT else "verify"
        await self._covered()
        result = await self.activities.call(
            agent, AgentCallInput(task_json=task, content=content, review=review,
                                  model=self.request.model),
            summary=f"{kind} agent (attempt {task['retry_context']['attempt_number']})")
        self._spent(result.usage)
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
