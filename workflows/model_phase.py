"""A phase of the agent workflow: waiting for the model endpoint.

A model call whose endpoint fails in a way it may recover from waits inside its activity
(`refloop.llm.outage`) and tells its task by a signal. The task is then
`waiting_for_model` (status, search attribute, row, an event naming the endpoint and the
last error) until the endpoint answers again; the time waited goes into its stats. Only
past `REFLOOP_MODEL_OUTAGE_S` does the call fail, and the task with it.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from refloop.contract.task import ModelWaitReport

from refloop.workflows import patches
from refloop.workflows.agent_base import AgentBase

WAITING = "waiting_for_model"
GAVE_UP = "ModelUnavailable"  # refloop.contract.errors.ModelUnavailable, by its name


def activity_stop_reason(err: BaseException) -> str:
    """Why a failed activity ended the task: `model_unavailable` when its model endpoint
    stayed down past the bound, else `activity_failed`."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type == GAVE_UP:
            return "model_unavailable"
        cause = cause.__cause__
    return "activity_failed"


class ModelPhase(AgentBase):
    async def _model_wait_reported(self, report: ModelWaitReport) -> None:
        # Runs recorded before the patch never got this signal: nothing to replay.
        if not workflow.patched(patches.MODEL_OUTAGE_WAIT):
            return
        state = self.state
        if report.waiting:
            if state.status != "running":  # already waiting, or ended
                return
            state.status = WAITING
            self._emit(WAITING, {"endpoint": report.endpoint, "error": report.error,
                                 "since": report.since})
        else:
            if state.status != WAITING:
                return
            waited = report.waited_s or 0.0
            state.stats = state.stats.model_copy(
                update={"model_wait_s": round(state.stats.model_wait_s + waited, 3)})
            if report.gave_up:  # the call's failure follows, and ends the task
                return
            state.status = "running"
            self._emit("model_back", {"endpoint": report.endpoint, "waited_s": waited})
        self._show()
        await self._record(state.status)
