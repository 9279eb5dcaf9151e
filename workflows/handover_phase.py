"""A phase of the agent workflow: handing the task over to a new build of the workers.

`hand_over` (an update) asks the run to continue as new at its next safe point: between
two turns of the agent loop, or while it waits for an approval, for its host, for its
model endpoint or for budget (the waiting call is taken back; nothing of it ran: a budget
wait in the middle of a turn is before an edit the quality review judges, `budget_phase`).
The new run is parked: its first workflow task records nothing, so any build may replay
it; it goes on only when a worker of another build sends `take_over`. Code changes thus
reach running tasks without a patch: the new build starts each of them from their typed
state, never replaying the old build's commands. Outside the agent loop (planning, the
completeness check, the summary) a task hands over at its end instead: those parts are
short, or wait on a child that hands over itself.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls
    from refloop.contract.activity_calls import ActivityCall
    from refloop.contract.handover import HANDED_OVER, HandOverRequest, TakeOver

from refloop.workflows.agent_base import AgentBase


class HandOverPhase(AgentBase):
    _taken_over = False

    def _refuse_hand_over(self, request: HandOverRequest) -> None:
        if self.state.status not in ("running", HANDED_OVER):
            raise ValueError(f"the task has ended ({self.state.status})")
        if self._parked():
            raise ValueError("the task is already handed over; a worker of another build "
                             "takes it over")
        if self._rewind is not None:
            raise ValueError("a rewind of the task is under way; hand it over once it is done")

    def _hand_over_asked(self, request: HandOverRequest) -> None:
        if self._hand_over is None:
            self._hand_over = request
            self._emit("hand_over_asked", {"build": request.build})

    def _take_over_asked(self, take: TakeOver) -> None:
        handed = self.state.input.handed_over
        if handed is not None and take.build != handed.from_build:
            self._taken_over = True

    def _parked(self) -> bool:
        return self.state.input.handed_over is not None and not self._taken_over

    async def _wait_for_a_new_build(self) -> None:
        """A parked run: nothing recorded until a worker of another build takes it over."""
        if self.state.input.handed_over is None:
            return
        await workflow.wait_condition(lambda: self._taken_over)
        handed = self.state.input.handed_over
        self.state.input = self.state.input.model_copy(update={"handed_over": None})
        self.state.status = "running"
        self._emit("taken_over", {"from_build": handed.from_build, "handed_over_at": handed.at})
        self._show()
        await self._record(self._visible_status())

    def interrupts(self, activity: ActivityCall[Any, Any]) -> bool:
        """Whether a call that waits is taken back for a hand-over or a rewind: a model
        call waiting for its endpoint, a workspace call waiting for its host (its router
        checks no host claimed it). A rewind takes back only calls that come before a tool
        call runs: the turn's model call (the conversation goes back before it) and a tool
        waiting for its host; a review or checkpoint of a call that ran is let finish, so
        the point after it is kept."""
        if not self.interrupt_due():
            return False
        waits = self.state.waits
        if self._rewind is not None:
            return activity.name == activity_calls.ACT.name or (
                activity.name.startswith(activity_calls.TOOL_PREFIX) and "host" in waits)
        return (activity.runs_on == "model" and "model" in waits) or (
            activity.runs_on == "workspace" and "host" in waits)
