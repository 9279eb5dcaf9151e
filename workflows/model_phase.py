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
        """A model call waits for its endpoint, or it answered again. Only the model wait
        changes: a host or approval wait the task is also in goes on."""
        if report.waiting:
            if not self._begin_wait("model", WAITING, report.error or "",
                                    endpoint=report.endpoint):
                return
            self._emit(WAITING, {"endpoint": report.endpoint, "error": report.error,
                                 "since": report.since})
        else:
            wait = self._end_wait("model")
            if wait is None:
                return
            waited = report.waited_s if report.waited_s is not None else self._waited_s(wait)
            self.state.stats = self.state.stats.model_copy(update={
                "model_wait_s": round(self.state.stats.model_wait_s + waited, 3)})
            if report.gave_up:  # the call's failure follows, and ends the task
                return
            self._emit("model_back", {"endpoint": report.endpoint, "waited_s": waited})
        self._show()
        await self._record(self._visible_status())

    async def model_answered(self) -> None:
        """A model call returned: the endpoint is back, whether or not its signal came."""
        if "model" in self.state.waits:
            await self._model_wait_reported(ModelWaitReport(
                waiting=False, endpoint=self.state.waits["model"].detail.get("endpoint", "")))
