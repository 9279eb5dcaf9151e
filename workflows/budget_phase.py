"""A phase of the agent workflow: the task's spend limit.

Before each model call, a task with a limit (`max_cost_usd`, `max_tokens`) checks that the
limit covers the call (`accounting.over_budget`). If not, the task waits
`waiting_for_budget` (status, search attribute, row, event) on a workflow condition: no
model request goes out until the `raise_budget` update sets a limit that covers it. An
unanswered wait ends the task `incomplete` after `budget_wait_s`. A task without a limit
runs no command of this phase.

An edit the quality review judges is followed by the review's model call, in the middle of
the turn: the limit must cover that call before the edit runs, so the task waits (and a
hand-over takes it, as at a turn's model call) before the edit, never between the edit and
its review.

The code-review supervisor keeps its own limit with the same pieces: `wait_for_cover`,
`raised_limits`, `refusal` and `accounting.over_budget`.

Children share the limit: a supplement child starts with what is left of it, and a raise
of the parent's limit while the child runs is passed on to the child.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from refloop.contract.activity_calls import PLAN_SUPPLEMENT, TOOL_PREFIX, ActivityCall
    from refloop.contract.budget import (
        CHILD_BUDGET_SIGNAL,
        CHILD_WAIT_SIGNAL,
        DEFAULT_BUDGET_WAIT_S,
        RAISE_BUDGET_UPDATE,
        BudgetRaise,
        BudgetState,
        ChildBudgetWait,
    )
    from refloop.contract.messages import TokenUsage
    from refloop.contract.policies import LLM_CALL, REVIEW_CALL

from refloop.workflows import accounting
from refloop.workflows.agent_base import AgentBase
from refloop.workflows.calls import InterruptNow

WAITING = "waiting_for_budget"


class BudgetWaitExpired(Exception):
    """Nobody raised the limit within `budget_wait_s`: the task ends incomplete."""

    stop_reason = "budget_wait_expired"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def wait_for_cover(not_covered: Callable[[], str | None], why: str,
                         budget_wait_s: float | None,
                         give_up: Callable[[], bool] = lambda: False) -> None:
    """Wait until the limit covers the next call (`not_covered` says None) or `give_up`;
    BudgetWaitExpired after `budget_wait_s` (None: 7 days). A workflow condition: no
    model request goes out meanwhile."""
    bound = budget_wait_s or DEFAULT_BUDGET_WAIT_S
    try:
        await workflow.wait_condition(lambda: not_covered() is None or give_up(),
                                      timeout=timedelta(seconds=bound))
    except TimeoutError:
        raise BudgetWaitExpired(f"{why}; no raise came within {bound:g} s") from None


def raised_limits(new: BudgetRaise) -> dict[str, Any]:
    """The limits a raise sets (a limit left out stays as it was)."""
    return {name: value for name, value in new.model_dump().items() if value is not None}


def refusal(usage: TokenUsage, new: BudgetRaise) -> str | None:
    """Why the `raise_budget` update is refused (None: it is taken): the new limit is
    below what was spent."""
    return accounting.refuse_raise(usage, new.max_cost_usd, new.max_tokens)


def spends(activity: ActivityCall[Any, Any]) -> bool:
    """Whether a call asks the model (and so is paid for)."""
    return activity.runs_on == "model" or activity.options in (LLM_CALL, REVIEW_CALL)


class BudgetPhase(AgentBase):
    _budget_child: str | None = None  # a supplement child that runs on a share of the limit

    def _limited(self) -> bool:
        inp = self.state.input
        return inp.max_cost_usd is not None or inp.max_tokens is not None

    def _not_covered(self) -> str | None:
        inp = self.state.input
        return accounting.over_budget(self.state.stats.usage, inp.max_cost_usd,
                                      inp.max_tokens)

    def _reviewed_edit(self, activity: ActivityCall[Any, Any]) -> str | None:
        """The tool of a built-in tool call whose edit the quality review judges (a model
        call after it, in the same turn); None for any other call."""
        inp = self.state.input
        if not inp.enable_quality_review or not activity.name.startswith(TOOL_PREFIX):
            return None
        tool = activity.name.removeprefix(TOOL_PREFIX)
        properties = self._tool_properties(tool)
        if properties is None:
            return None
        reviewed = tool in inp.quality_review_tools if inp.quality_review_tools \
            else properties.reviewed
        return tool if reviewed else None

    async def before_call(self, activity: ActivityCall[Any, Any]) -> None:
        """Wait until the limit covers a call of `activity` (at once without a limit); for a
        reviewed edit, until it covers the review's model call."""
        if not spends(activity):
            edit = self._reviewed_edit(activity) if self._limited() else None
            if edit is not None:
                await self._covered(f"; the quality review of the {edit} call to be made")
            return
        if self._budget_child is not None:  # this run asks the model: its child has ended
            self._budget_child = None
            wait = self.state.waits.get("budget")
            if wait is not None and "child" in wait.detail:  # (one that ended waiting)
                self._end_wait("budget")
        if not self._limited():
            return
        await self._covered()

    async def _covered(self, of: str = "") -> None:
        """Wait `waiting_for_budget` until the limit covers the next model call. A
        hand-over (or a rewind) takes the task at a turn's model call or before an edit:
        nothing of the turn's call has run."""
        why = self._not_covered()
        if why is None:
            return
        why += of
        if self._begin_wait("budget", WAITING, why, **self._budget().model_dump()):
            self._emit(WAITING, {"reason": why, **self._budget().model_dump()})
            self._show()
            await self._record(self._visible_status())
            await self._tell_parent(waiting=True, reason=why)
        before_edit = bool(of)
        await wait_for_cover(self._not_covered, why, self.state.input.budget_wait_s,
                             give_up=lambda: self._budget_hand_over(before_edit))
        if self._not_covered() is not None:  # handed over: the next run waits afresh
            raise InterruptNow()
        wait = self._end_wait("budget")
        if wait is not None:
            self._emit("budget_resumed", {"waited_s": self._waited_s(wait),
                                          **self._budget().model_dump()})
            self._show()
            await self._record(self._visible_status())
            await self._tell_parent(waiting=False)

    async def _tell_parent(self, waiting: bool, reason: str = "") -> None:
        """A supplement child's wait shows on its parent, which a person raises."""
        parent = workflow.info().parent
        if not self.state.input.is_supplement or parent is None:
            return
        try:
            await workflow.get_external_workflow_handle(parent.workflow_id).signal(
                CHILD_WAIT_SIGNAL, ChildBudgetWait(child_id=workflow.info().workflow_id,
                                                   waiting=waiting, reason=reason))
        except Exception as err:  # noqa: BLE001 - the parent has ended: nobody to tell
            workflow.logger.info("budget wait not told to the parent: %s", err)

    def _budget_hand_over(self, before_edit: bool = False) -> bool:
        """A hand-over takes a task waiting at its turn's model call (its turn is asked
        again in the next run) or before a reviewed edit (the edit runs in the next run);
        at a model call in the middle of a turn, the wait goes on."""
        return self.interrupt_due() and (before_edit or self.state.calls.turn is None)

    def _budget(self) -> BudgetState:
        inp, usage = self.state.input, self.state.stats.usage
        return BudgetState(max_cost_usd=inp.max_cost_usd, max_tokens=inp.max_tokens,
                           cost_usd=usage.cost_usd, tokens=usage.total_tokens,
                           # still waiting: its limit does not cover its next call
                           waiting="budget" in self.state.waits
                           and self._not_covered() is not None)

    async def _child_budget(self, child_id: str) -> dict[str, Any]:
        """A supplement child's limit: what is left of this task's, once the limit covers
        one more call (the child's spend joins this task's when it ends)."""
        if not self._limited():
            return {}
        # the child's first call stands in for its calls: it must be covered first
        await self.before_call(PLAN_SUPPLEMENT)
        self._budget_child = child_id
        return self._child_share(self.state.input.max_cost_usd, self.state.input.max_tokens)

    def _child_share(self, max_cost_usd: float | None,
                     max_tokens: int | None) -> dict[str, Any]:
        usage = self.state.stats.usage
        left_tokens = accounting.remaining(max_tokens, usage.total_tokens)
        return {"max_cost_usd": accounting.remaining(max_cost_usd, usage.cost_usd),
                "max_tokens": None if left_tokens is None else max(1, int(left_tokens))}

    # ------------------------------------------------------------ handlers

    @workflow.update(name=RAISE_BUDGET_UPDATE, description="Set the task's spend limit: "
                     '{"max_cost_usd": 5.0} and/or {"max_tokens": 2000000}, totals with its '
                     "children's spend; refused below what it has spent. A task waiting "
                     "for budget goes on once the limit covers its next call.")
    async def raise_budget(self, new: BudgetRaise) -> BudgetState:
        self.state.input = self.state.input.model_copy(update=raised_limits(new))
        self._emit("budget_raised", self._budget().model_dump())
        if self._budget_child is not None:  # its child runs on a share: passed on
            inp = self.state.input
            share = BudgetRaise(**self._child_share(inp.max_cost_usd, inp.max_tokens))
            try:
                await workflow.get_external_workflow_handle(self._budget_child).signal(
                    CHILD_BUDGET_SIGNAL, share)
            except Exception as err:  # noqa: BLE001 - it ended meanwhile: nothing to pass on
                workflow.logger.info("budget share not passed on: %s", err)
        return self._budget()

    @raise_budget.validator
    def _validate_budget(self, new: BudgetRaise) -> None:
        if self.state.status != "running":
            raise ValueError(f"the task has ended ({self.state.status})")
        refused = refusal(self.state.stats.usage, new)
        if refused:
            raise ValueError(refused)

    @workflow.signal(name=CHILD_WAIT_SIGNAL, description="From a supplement child: it "
                     "waits for budget (this task shows waiting_for_budget), or goes on.")
    async def child_budget_wait(self, told: ChildBudgetWait) -> None:
        if told.waiting:
            why = f"its supplement child {told.child_id}: {told.reason}"
            if not self._begin_wait("budget", WAITING, why, child=told.child_id,
                                    **self._budget().model_dump()):
                return
            self._emit(WAITING, {"reason": why, "child": told.child_id,
                                 **self._budget().model_dump()})
        elif self._end_wait("budget") is None:
            return
        self._show()
        await self._record(self._visible_status())

    @workflow.signal(name=CHILD_BUDGET_SIGNAL, description="From the parent task: this "
                     "supplement child's share of its raised limit.")
    def budget_share(self, share: BudgetRaise) -> None:
        self.state.input = self.state.input.model_copy(update=raised_limits(share))
        self._emit("budget_raised", {**self._budget().model_dump(), "by": "parent"})
