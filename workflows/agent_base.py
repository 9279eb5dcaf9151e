"""State, event and accounting helpers shared by the agent workflow and its phases."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

# Models are plain data; passed through so the sandbox does not re-import pydantic.
with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls, policies
    from refloop.contract.activity_calls import ActivityCall
    from refloop.contract.activity_io import LLMUsageRecord
    from refloop.contract.checkpoints import RewindRequest
    from refloop.contract.handover import HandOverRequest
    from refloop.contract.mcp import mcp_tool_properties
    from refloop.contract.messages import COMPLETE_STEP, ChatMessage
    from refloop.contract.task import Event, RecordTaskInput
    from refloop.contract.tool_catalog import TOOLS
    from refloop.contract.tool_properties import CONTROL, ToolProperties
    from refloop.workflows.state import AgentState, Wait

from refloop.workflows import accounting, logic
from refloop.workflows.calls import Calls
from refloop.workflows.visibility_phase import TaskVisibility


class TaskFailed(Exception):
    """Internal: ends the run as failed with a stop reason and message."""

    def __init__(self, stop_reason: str, message: str) -> None:
        super().__init__(message)
        self.stop_reason = stop_reason
        self.message = message


class AgentBase:
    """Helpers over `self.state`; the workflow class and its phase mixins share them."""

    state: AgentState
    activities: Calls  # every activity and child call, routed by the workflow's router
    visibility: TaskVisibility  # the search attributes and details the Web UI shows
    _hand_over: HandOverRequest | None = None  # asked by `hand_over` (HandOverPhase)
    _rewind: RewindRequest | None = None  # accepted by `rewind`, not yet done (RewindPhase)
    _in_loop = False  # only the agent loop's waits are interrupted mid-way

    def interrupt_due(self) -> bool:
        """Whether the agent loop's waits should stop now: a hand-over to a new build or a
        rewind was asked (the waiting call is taken back; it never ran)."""
        return (self._hand_over is not None or self._rewind is not None) and self._in_loop

    def _show(self, status: str | None = None) -> None:
        """Refresh what the Web UI shows of the task: `status` names a final one (the
        task result's), else what a person sees now."""
        self.visibility.show(self.state, status or self._visible_status())

    def _visible_status(self) -> str:
        """What a person sees: the run's status once it is not running (ended, handed
        over), else an approval waiting, else the oldest wait (each kind keeps its own)."""
        if self.state.status != "running":
            return self.state.status
        if any(decision is None for decision in self.state.approvals.waiting.values()):
            return "waiting_approval"
        waits = sorted(self.state.waits.values(), key=lambda wait: wait.since)
        return waits[0].status if waits else self.state.status

    def _begin_wait(self, kind: str, status: str, reason: str, **detail: Any) -> bool:
        """The task waits for `kind` (False: it already did, or it has ended)."""
        if kind in self.state.waits or self.state.status != "running":
            return False
        self.state.waits[kind] = Wait(status=status, since=workflow.now().isoformat(),
                                      reason=reason[:500], detail=detail)
        return True

    def _end_wait(self, kind: str) -> Wait | None:
        """The `kind` wait is over (None: there was none); other kinds are untouched."""
        return self.state.waits.pop(kind, None)

    def _waited_s(self, wait: Wait) -> float:
        return round((workflow.now() - datetime.fromisoformat(wait.since)).total_seconds(), 3)

    def _tool_properties(self, name: str) -> ToolProperties | None:
        """A tool's properties, built-in or MCP (None: no such tool); approval, review and
        the triggers read them."""
        tool = self.state.mcp.tools.get(name)
        return mcp_tool_properties(tool) if tool is not None else self._builtin_properties(name)

    def _builtin_tools(self) -> dict[str, ToolProperties]:
        """The built-in tools of this run: fixed at its start (runs recorded before that
        was so read the code's catalogue)."""
        if self.state.tools is not None:
            return self.state.tools
        return {name: declaration.properties for name, declaration in TOOLS.items()}

    def _builtin_properties(self, name: str) -> ToolProperties | None:
        """A built-in tool's properties (complete_step: a control tool); None: no such tool."""
        if name == COMPLETE_STEP:
            return CONTROL
        return self._builtin_tools().get(name)

    async def _record(self, status: str, **fields: Any) -> None:
        await self._store_write(
            activity_calls.RECORD_TASK,
            RecordTaskInput(
                task_id=self.state.task_id,
                workflow_id=workflow.info().workflow_id,
                session_id=self.state.input.session_id,
                status=status,
                usage=self.state.stats.model_dump(mode="json"),
                # An ended (or handed-over) task waits for nothing, whatever was pending
                waiting={kind: wait.model_dump(mode="json")
                         for kind, wait in self.state.waits.items()}
                if self.state.status == "running" else {},
                **fields,
            ),
            summary=f"record task: {status}",
        )

    async def _store_write(self, activity: ActivityCall[Any, None], arg: BaseModel,
                           summary: str | None = None) -> None:
        """A DB write as a local activity. A write still failing after a bound (the
        database is down) is scheduled: it waits on the server, so an outage costs a bounded
        number of history events, however long it lasts."""
        try:
            await self.activities.call(activity, arg, summary=summary, local=True,
                                       options=policies.STORE_WRITE_LOCAL)
            return
        # A local activity's failure may arrive as its own ApplicationError.
        except (ActivityError, ApplicationError) as err:
            workflow.logger.warning("store write waits on the server: %s", err)
        await self.activities.call(activity, arg, summary=summary, local=False)

    def _reviews_carried(self) -> int:
        """How many quality reviews the state and result carry."""
        return policies.REVIEWS_CARRIED

    def _append(self, message: ChatMessage) -> None:
        """A turn for the next `act`, which adds it to the stored conversation and trims."""
        self.state.conversation.unsent_turns.append(message)

    def _account(self, record: LLMUsageRecord) -> None:
        self.state.stats = accounting.add_usage(self.state.stats, record)

    def _account_failure(self, err: BaseException) -> None:
        """A model activity that gave up still made requests: count them, with whatever
        usage came back (its failure details, or a timed-out attempt's last heartbeat)."""
        cause: BaseException | None = err
        while cause is not None:
            details = getattr(cause, "details", None)
            if isinstance(cause, ActivityTimeout):
                details = cause.last_heartbeat_details
            record = accounting.failed_usage(details) if details else None
            if record is not None:
                self._account(record)
                return
            cause = cause.__cause__

    def _emit(self, event_type: str, data: dict[str, Any]) -> None:
        self.state.last_seq += 1
        self.state.events.append(
            Event(
                seq=self.state.last_seq,
                type=event_type,
                ts=workflow.now().isoformat(),
                data=data,
            )
        )

    def _current_step(self) -> int | None:
        return logic.current_step(self.state.planning.plan, self.state.planning.completed_steps)

    def _emit_step(self) -> None:
        step = self._current_step()
        if self.state.planning.plan is not None:
            goal = self.state.planning.plan.steps[step - 1].goal if step else None
            self._emit(
                "step",
                {"step": step, "goal": goal, "completed": self.state.planning.completed_steps},
            )


def describe_failure(err: BaseException) -> str:
    """The first application error's message (our activities word those for users),
    else the innermost failure."""
    cause: BaseException | None = err
    message = str(err)
    while cause is not None:
        if isinstance(cause, ApplicationError):
            return f"{cause.type}: {cause.message}" if cause.type else cause.message
        if str(cause):
            message = str(cause)
        cause = cause.__cause__
    return message
