"""A phase of the agent workflow: where its activities run, and waiting for its host.

With a `host` in the input, every activity that reads or writes the workspace runs on that
host's own task queue (its workspace, journal and index are there, on local disk); model
calls run on the fleet's model queue when the fleet has a rate limit, else on the
workflow's own queue, where the server dispatches them eagerly. A workspace call that no
worker of the host picks up within the bound makes the task `waiting_for_host` (status,
search attribute, row, event) until the host is back; it never fails the task.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls, hosts
    from refloop.contract.activity_calls import ActivityCall
    from refloop.contract.activity_io import HostCheckInput

from refloop.workflows.agent_base import (
    AgentBase,
    TaskFailed,
    describe_failure,
)
from refloop.workflows.calls import ArgT

WAITING = "waiting_for_host"


class HostPhase(AgentBase):
    _eager_model_calls = False
    _moves = 0
    # Calls scheduled while the task waits for its host, by activity id (this run's only:
    # none is outstanding at continue-as-new); a move takes back those not claimed.
    _claims: dict[str, hosts.CallClaimed] | None = None  # made by the first (per instance)
    _claims_made = 0

    def host_moves(self) -> int:
        return self._moves

    def call_claim(self, activity: ActivityCall[Any, Any]) -> str | None:
        """The activity id of a call scheduled now, if its host must claim it before it
        runs: while the task waits for its host, a move could take the call back, so the
        host's worker asks first (`claim_call`); None: no move can take it back."""
        if "host" not in self.state.waits:
            return None
        self._claims_made += 1
        claim = hosts.claim_id(self._claims_made)
        self._open_claims()[claim] = hosts.CallClaimed(host=self.state.input.host or "",
                                                activity=activity.name)
        return claim

    def claimed(self, claim: str) -> bool:
        """Whether the host's worker claimed the call (it runs there, whatever moves)."""
        known = self._open_claims().get(claim)
        return known is not None and known.claimed

    def call_ended(self, claim: str) -> None:
        self._open_claims().pop(claim, None)

    def _open_claims(self) -> dict[str, hosts.CallClaimed]:
        if self._claims is None:
            self._claims = {}
        return self._claims

    def _refuse_claim(self, claim: hosts.CallClaim) -> None:
        hosts.refuse_claim(self._open_claims(), claim)

    def _claim(self, claim: hosts.CallClaim) -> None:
        """The `claim_call` update, validated: the call runs on the host that claimed it; no
        move is accepted while it does (`_refuse_move`)."""
        self._open_claims()[claim.activity_id].claimed = True

    def _refuse_move(self, move: hosts.HostMove) -> None:
        inp = self.state.input
        unsaved = self.state.workspace.unsaved_call
        if unsaved is not None:
            raise ValueError(f"the workspace's change by call {unsaved} has no checkpoint (it "
                             "failed): a move would put an older tree on the new host; the "
                             "task takes it again before its next call, on its own host")
        status = WAITING if "host" in self.state.waits else self.state.status
        hosts.refuse_move(inp.host, inp.workspace, status, move,
                          self._open_claims())

    def moved_argument(self, arg: ArgT) -> ArgT:
        """The argument of a call taken back from the old host: its workspace the task's
        now (a move may name the copy's path on the new host)."""
        workspace = self.state.input.workspace
        if getattr(arg, "workspace", workspace) == workspace:
            return arg
        return arg.model_copy(update={"workspace": workspace})

    def _move_to_host(self, move: hosts.HostMove) -> None:
        """The task's workspace calls go to `move.host` from now on (with the workspace at
        `move.workspace`, if named): the call waiting for the old host is taken back and
        scheduled there (`calls.Calls.call`)."""
        before = self.state.input.host
        update: dict[str, str] = {"host": move.host.host_id}
        if move.workspace is not None:  # the copy is at another path there
            update["workspace"] = move.workspace
        self.state.input = self.state.input.model_copy(update=update)
        self._moves += 1
        wait = self._end_wait("host")  # it waits no more: the new host is live
        if wait is not None:
            self.state.stats = self.state.stats.model_copy(update={
                "host_wait_s": round(self.state.stats.host_wait_s + self._waited_s(wait), 3)})
        # Every call waiting for the old host is taken back (none was claimed: the
        # validator said so); a claim for one of them arriving now is refused.
        self._open_claims().clear()
        self._emit("moved_to_host", {"from": before, "to": move.host.host_id,
                                     **({"workspace": move.workspace} if move.workspace
                                        else {})})

    def activity_queue(self, activity: ActivityCall[Any, Any]) -> str | None:
        if activity.runs_on == "shared":
            return None
        shared = workflow.info().task_queue
        if activity.runs_on == "model":
            return None if self._eager_model_calls else hosts.model_queue(shared)
        host = self.state.input.host
        return hosts.host_queue(shared, host) if host else None

    def host_wait(self, activity: ActivityCall[Any, Any]) -> timedelta | None:
        inp = self.state.input
        if activity.runs_on != "workspace" or not inp.host:
            return None
        return hosts.host_wait(inp.host_wait_s)

    async def host_waiting(self, waiting: bool, activity: ActivityCall[Any, Any],
                           waited: timedelta) -> None:
        host = self.state.input.host
        if waiting:
            if not self._begin_wait("host", WAITING, f"no worker of host {host} polls",
                                    host=host, activity=activity.name):
                return
            self._emit(WAITING, {"host": host, "activity": activity.name,
                                 "after_s": waited.total_seconds()})
        else:
            wait = self._end_wait("host")
            if wait is None:
                return
            self.state.stats = self.state.stats.model_copy(update={
                "host_wait_s": round(self.state.stats.host_wait_s + self._waited_s(wait), 3)})
            self._emit("host_back", {"host": host, "since": wait.since})
        self._show()
        await self._record(self._visible_status())

    async def _settle_model_route(self) -> None:
        """Whether this run's model calls go to the model queue (the fleet has a rate
        limit) or stay on the workflow's queue, dispatched eagerly: asked once per run of
        the worker running it, and recorded, so replay takes the same route."""
        route = await self.activities.call(activity_calls.MODEL_ROUTE, hosts.ModelRouteInput(),
                                    summary="model route")
        self._eager_model_calls = hosts.model_calls_eager(route)

    async def _check_host(self) -> None:
        """A task naming a host whose roots do not hold its workspace fails at once with
        the reason (the API answers 422 with the same). One naming a host the database does
        not know waits for it to register (`waiting_for_host`) within its host bound, then
        fails: a fleet restarting, or a host slow to start, loses no task; a typo still
        fails, within that bound."""
        inp = self.state.input
        if not inp.host:
            return
        bound, waited = hosts.host_wait(inp.host_wait_s), timedelta(0)
        while True:
            try:
                await self.activities.call(activity_calls.CHECK_HOST,
                                    HostCheckInput(host=inp.host, workspace=inp.workspace),
                                    summary=f"host {inp.host}")
            # A local activity's failure arrives as the activity's own ApplicationError.
            except (ActivityError, ApplicationError) as err:
                unknown = failure_type(err) == hosts.UnknownHost.__name__
                pause = hosts.unknown_host_pause(waited, bound) if unknown else None
                if pause is None:
                    raise TaskFailed("host_refused", describe_failure(err)) from err
                await self.host_waiting(True, activity_calls.CHECK_HOST, waited)
                await workflow.sleep(pause)
                waited += pause
                continue
            if waited:
                await self.host_waiting(False, activity_calls.CHECK_HOST, waited)
            return


def failure_type(err: BaseException) -> str | None:
    """The type of the application error behind an activity's failure."""
    cause = err.cause if isinstance(err, ActivityError) else err
    return cause.type if isinstance(cause, ApplicationError) else None
