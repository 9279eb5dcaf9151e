"""A phase of the agent workflow: waiting for the model endpoint.

A model call whose endpoint fails in a way it may recover from waits without holding a
worker slot (`refloop.llm.outage`): the call probing the endpoint retries between
attempts and tells its task by a signal; any other call is parked, and its task waits
here until a worker reports the endpoint back (the same signal) or its recheck comes
(`refloop.workflows.calls`). The task is `waiting_for_model` (status, search attribute,
row, an event naming the endpoint and the last error) until the endpoint answers again;
the time waited goes into its stats. Only past `REFLOOP_MODEL_OUTAGE_S` does the call
fail, and the task with it.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from refloop.contract.errors import ParkedCall
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
    _model_backs = 0  # endpoints reported back in this run: a parked call goes again

    def model_backs(self) -> int:
        return self._model_backs

    async def model_parked(self, parked: ParkedCall, failure: ActivityError) -> float:
        """A model call was parked: the task waits for the model (if it did not already),
        its refused requests counted. The seconds waited since the wait began."""
        self._account_failure(failure)
        await self._model_wait_reported(ModelWaitReport(
            waiting=True, endpoint=parked.endpoint, error=parked.error,
            since=workflow.now().timestamp()))
        wait = self.state.waits.get("model")
        waited = self._waited_s(wait) if wait is not None else 0.0
        if waited >= parked.bound_s:  # the call fails next: the time waited is in the stats
            await self._model_wait_reported(ModelWaitReport(
                waiting=False, endpoint=parked.endpoint, waited_s=waited, gave_up=True))
        return waited

    async def _model_wait_reported(self, report: ModelWaitReport) -> None:
        """A model call waits for its endpoint, or it answered again. Only the model wait
        changes: a host or approval wait the task is also in goes on."""
        if not report.waiting and not report.gave_up:
            self._model_backs += 1
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
            # The longer of the task's wait and the reporting call's: a call that probes
            # after being parked began its own count late, and a probe's may begin before
            # its signal reached the task.
            waited = max(report.waited_s or 0.0, self._waited_s(wait))
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
