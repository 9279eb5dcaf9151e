"""A phase of the agent workflow: where its activities run, and waiting for its host.

With a `host` in the input, every activity that reads or writes the workspace runs on that
host's own task queue (its workspace, journal and index are there, on local disk); model
calls of every task run on the fleet's model queue. A workspace call that no worker of the
host picks up within the bound makes the task `waiting_for_host` (status, search attribute,
row, event) until the host is back; it never fails the task.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls, hosts
    from refloop.contract.activity_calls import ActivityCall
    from refloop.contract.activity_io import HostCheckInput

from refloop.workflows import patches
from refloop.workflows.agent_base import (
    AgentBase,
    TaskFailed,
    describe_failure,
    raise_if_cancelled,
)
from refloop.workflows.calls import call_activity

WAITING = "waiting_for_host"


class HostPhase(AgentBase):
    _routed: bool | None = None
    _waiting_since: str | None = None
    _moves = 0

    def host_moves(self) -> int:
        return self._moves

    def _move_to_host(self, move: hosts.HostMove) -> None:
        """The task's workspace calls go to `move.host` from now on: the call waiting for
        the old host is taken back and scheduled there (`calls.call_activity`)."""
        before = self.state.input.host
        self.state.input = self.state.input.model_copy(update={"host": move.host.host_id})
        self._moves += 1
        self._emit("moved_to_host", {"from": before, "to": move.host.host_id})

    def _routes(self) -> bool:
        if self._routed is None:
            self._routed = workflow.patched(patches.HOST_QUEUES)
        return self._routed

    def activity_queue(self, activity: ActivityCall) -> str | None:
        if activity.runs_on == "shared" or not self._routes():
            return None
        shared = workflow.info().task_queue
        if activity.runs_on == "model":
            return hosts.model_queue(shared)
        host = self.state.input.host
        return hosts.host_queue(shared, host) if host else None

    def host_wait(self, activity: ActivityCall) -> timedelta | None:
        inp = self.state.input
        if activity.runs_on != "workspace" or not inp.host:
            return None
        return hosts.host_wait(inp.host_wait_s)

    async def host_waiting(self, waiting: bool, activity: ActivityCall,
                           waited: timedelta) -> None:
        host = self.state.input.host
        if waiting:
            if self.state.status == WAITING:
                return
            self.state.status = WAITING
            self._waiting_since = workflow.now().isoformat()
            self._emit(WAITING, {"host": host, "activity": activity.name,
                                 "after_s": waited.total_seconds()})
        else:
            if self.state.status != WAITING:
                return
            self.state.status = "running"
            self._emit("host_back", {"host": host, "since": self._waiting_since})
            self._waiting_since = None
        self._show()
        await self._record(self.state.status)

    async def _check_host(self) -> None:
        """A task naming a host the database does not know, or whose roots do not hold
        its workspace, fails at once with the reason (the API answers 422 with the same)."""
        inp = self.state.input
        if not inp.host or not self._routes():
            return
        try:
            await call_activity(activity_calls.CHECK_HOST,
                                HostCheckInput(host=inp.host, workspace=inp.workspace),
                                summary=f"host {inp.host}")
        # A local activity's failure arrives as the activity's own ApplicationError.
        except (ActivityError, ApplicationError) as err:
            raise_if_cancelled(err)
            raise TaskFailed("host_refused", describe_failure(err)) from err
