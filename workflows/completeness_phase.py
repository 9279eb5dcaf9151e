"""Completeness reflection: judge, supplement plan, supplement child workflow."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls
    from refloop.contract.activity_io import (
        ClaimedFilesInput,
        CompletenessInput,
        Supplement,
        SupplementPlanInput,
    )
    from refloop.contract.messages import COMPLETE_STEP, Plan
    from refloop.contract.task import TaskResult

from refloop.workflows import accounting, completeness_logic, logic, review_logic
from refloop.workflows.agent_base import describe_failure
from refloop.workflows.budget_phase import BudgetPhase


class CompletenessPhase(BudgetPhase):  # a child runs on a share of the task's limit
    tool_names: list[str]
    edit_tools: set[str]

    async def _reflect_on_completeness(self) -> None:
        """Check, supplement through a child, re-check: bounded by reflection_max_rounds."""
        inp = self.state.input
        if not inp.enable_reflection or inp.is_supplement:
            return
        for round_number in range(1, inp.reflection_max_rounds + 1):
            supplements = await self._check_completeness(round_number)
            if not supplements or round_number == inp.reflection_max_rounds:
                return
            plan = await self._plan_supplement(supplements)
            if plan is None:
                return
            if not await self._run_supplement(plan, supplements, round_number):
                return

    async def _check_completeness(self, round_number: int) -> list[Supplement]:
        inp = self.state.input
        ledger = self.state.calls.ledger
        check = CompletenessInput(
            task=inp.task, workspace=inp.workspace,
            history=completeness_logic.condensed_history(ledger),
            history_refs=self.state.calls.ledger_refs,
            tool_names=[n for n in self.tool_names if n != COMPLETE_STEP],
            claimed_files=completeness_logic.claimed_files(completeness_logic.claim_texts(
                ledger, self.state.conversation.answer, self.state.calls.kept_notes)),
            missing_steps=completeness_logic.missing_steps(
                self.state.planning.plan, self.state.planning.completed_steps),
            final_answer=self.state.conversation.answer,
            model=inp.model,
            endpoint=inp.endpoint,
            max_supplements=inp.reflection_max_supplements,
        )
        summary = f"completeness check {round_number}"
        missing_files: list[str] = []
        try:
            # The files are looked at on the task's host; the judge runs on the model
            # queue, under the fleet's rate limit.
            found = await self.activities.call(
                activity_calls.CHECK_CLAIMED_FILES,
                ClaimedFilesInput(workspace=inp.workspace,
                                  claimed_files=check.claimed_files),
                summary=f"claimed files {round_number}")
            missing_files = list(found.missing)
            result = await self.activities.call(
                activity_calls.JUDGE_COMPLETENESS,
                check.model_copy(update={"decisive": found.missing}), summary=summary)
        except ActivityError as err:
            self._account_failure(err)
            if missing_files:  # found missing on disk: no judge is needed to say so
                self.state.reflection.last_verdict = {
                    "trigger": "completeness", "round": round_number, "is_complete": False,
                    "analysis": describe_failure(err)[:300], "fail_open": False,
                    "missing_count": len(missing_files), "supplements_count": 0,
                    "missing_aspects": missing_files}
                self._emit("reflection", self.state.reflection.last_verdict)
                return []
            # Fail open: the work is done; an unreachable judge must not undo it.
            self._emit("reflection", {"trigger": "completeness", "round": round_number,
                                      "is_complete": True, "fail_open": True,
                                      "analysis": describe_failure(err)[:300],
                                      "missing_count": 0, "supplements_count": 0})
            self.state.reflection.last_verdict = None  # a fail-open verdict decides nothing
            return []
        if result.usage is not None:
            self._account(result.usage)
        verdict = completeness_logic.reconcile(
            result.verdict, result.decisive, self.tool_names, inp.reflection_max_supplements)
        self.state.reflection.last_verdict = {
            "trigger": "completeness",
            "round": round_number,
            "is_complete": verdict.is_complete,
            "analysis": verdict.analysis,
            "missing_count": len(verdict.missing_aspects),
            "supplements_count": len(verdict.supplements),
            "missing_aspects": verdict.missing_aspects,
            "evidence": result.evidence,
            "fail_open": result.fail_open,
        }
        self._emit("reflection", self.state.reflection.last_verdict)
        return [] if verdict.is_complete else verdict.supplements

    async def _plan_supplement(self, supplements: list[Supplement]) -> Plan | None:
        inp = self.state.input
        done = [
            (step.goal, step.tool) for n, step in enumerate(
                self.state.planning.plan.steps if self.state.planning.plan else [], start=1)
            if n in self.state.planning.completed_steps
        ]
        try:
            result = await self.activities.call(
                activity_calls.PLAN_SUPPLEMENT,
                SupplementPlanInput(
                    objective=self._supplement_objective(supplements),
                    tool_names=[n for n in self.tool_names if n != COMPLETE_STEP],
                    completed_steps=[f"{goal} ({tool})" for goal, tool in done],
                    mcp_tools_ref=self.state.mcp.specs_ref,
                    model=inp.model,
                    endpoint=inp.endpoint,
                ),
                summary="supplement plan",
            )
        except ActivityError as err:
            self._account_failure(err)
            self._record_supplement({"error": f"planning failed: {describe_failure(err)}"})
            return None
        self._account(result.usage)
        plan = completeness_logic.drop_repeated_steps(result.plan, done)
        if plan is None:
            self._record_supplement({"error": "the supplement plan only repeated done steps"})
            return None
        self._emit("reflection_plan", {"plan": plan.model_dump(mode="json"),
                                       "supplements_count": len(supplements)})
        return plan

    async def _run_supplement(self, plan: Plan, supplements: list[Supplement],
                              round_number: int) -> bool:
        """Run the plan as a child workflow seeded with this run's context; True if it ran."""
        inp = self.state.input
        child_id = f"{workflow.info().workflow_id}-supplement-{round_number}"
        child_input = inp.model_copy(update={
            "task": self._supplement_objective(supplements),
            "task_id": child_id,
            "is_supplement": True,
            "enable_reflection": False,
            "preset_plan": plan,
            **await self._child_budget(child_id),  # a share of this task's limit
            "prior_context": completeness_logic.prior_context(
                self.state.calls.ledger, self.state.conversation.answer,
                earlier_calls=self.state.calls.kept_calls),
        })
        try:
            child = await self.activities.child(
                "AgentTaskWorkflow",
                child_input,
                id=child_id,
                result_type=TaskResult,
                **completeness_logic.supplement_metadata(round_number, supplements),
                parent_close_policy=workflow.ParentClosePolicy.REQUEST_CANCEL,
            )
        except ChildWorkflowError as err:
            # A failing supplement does not fail the task: recorded and said in the summary.
            detail = describe_failure(err)
            self._emit("reflection_exec", {"used": True, "attempted": len(plan.steps),
                                           "succeeded": 0, "success_rate": 0.0,
                                           "child_workflow_id": child_id, "error": detail})
            self._record_supplement({"child_workflow_id": child_id, "status": "failed",
                                     "error": detail})
            return False
        self.state.stats = completeness_logic.merge_stats(self.state.stats, child.stats)
        reflection = self.state.reflection
        if child.edits_ok is not None:
            reflection.edits_ok += child.edits_ok  # its events may have been trimmed
        else:
            reflection.edits_ok += logic.successful_edits(child.events, self.edit_tools)
        reflection.reviews = review_logic.carried_reviews(
            reflection.reviews, child.quality_reviews, self._reviews_carried())
        attempted = child.stats.tool_calls
        succeeded = attempted - child.stats.tool_errors
        self._emit("reflection_exec", {
            "used": True, "attempted": attempted, "succeeded": succeeded,
            "success_rate": accounting.success_rate(attempted, succeeded),
            "child_workflow_id": child_id,
        })
        self._record_supplement({"child_workflow_id": child_id, "status": child.status,
                                 "answer": child.answer})
        return True

    def _supplement_objective(self, supplements: list[Supplement]) -> str:
        return completeness_logic.supplement_objective(
            self.state.input.task, supplements, completeness_logic.SUPPLEMENT_HEADER)

    def _record_supplement(self, record: dict[str, Any]) -> None:
        self.state.reflection.supplements.append(record)
