"""A phase of the agent workflow: rewinding a running task to one of its run's checkpoints.

`rewind` is an update. Its validator refuses a step the run has not taken (or a task not in
its agent loop); once accepted, the loop stops at its next safe point (before a call, before
a model turn, or at once while it waits for an approval, a host or a model answer: the
waiting call is taken back) and puts back, together, the workspace (restored from the
checkpoint on the task's host, with the edit journal's entries of the calls taken back
dropped) and what the run knew right after that call: conversation, plan progress, the turn
in progress, the tool records and counters. The update then answers. If the workspace
cannot be restored, it is put back to the latest checkpoint and the update fails: the task
goes on as if nothing was asked. Events keep their numbering; moves, approvals and signals
that come meanwhile are never lost, since the run is never reset.

What a point holds is a copy of the run's state, in memory only: the run's checkpoints are
the ones a rewind can reach (a continued run starts a new list, as its history does).
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls
    from refloop.contract.checkpoints import RestoreInput, RestoreResult, RewindRequest, Rewound
    from refloop.contract.messages import TokenUsage
    from refloop.workflows.state import CallsState, ConversationState, PlanState, TurnState

from refloop.workflows import accounting
from refloop.workflows.agent_base import TaskFailed, describe_failure
from refloop.workflows.workspace_phase import WorkspacePhase

NOT_IN_LOOP = ("the task is not in its agent loop (planning, checking its work or ended); "
               "fork it from that step instead (`refloop fork TASK --at-step N`)")


@dataclass(frozen=True)
class RewindPoint:
    """The run right after a call whose checkpoint it took: what a rewind puts back."""

    call_id: str
    checkpoint_id: str
    planning: PlanState
    conversation: ConversationState
    calls: CallsState
    usage: TokenUsage
    usage_by_model: dict[str, TokenUsage]
    journaled: int  # the run's journaled calls up to here (`_journaled_calls`)


# Copies of the groups a point keeps: their lists and dicts copied (the run appends to
# them), their items shared (never changed once made), so a point costs a few pointers a
# record, not a copy of each.
def kept_planning(planning: PlanState) -> PlanState:
    return planning.model_copy(update={"completed_steps": list(planning.completed_steps)})


def kept_conversation(conversation: ConversationState) -> ConversationState:
    return conversation.model_copy(update={"unsent_turns": list(conversation.unsent_turns)})


def kept_calls(calls: CallsState) -> CallsState:
    return calls.model_copy(update={
        "ledger": list(calls.ledger), "ledger_refs": list(calls.ledger_refs),
        "kept_notes": list(calls.kept_notes), "violations": list(calls.violations),
        "justified_tools": list(calls.justified_tools),
        "changes": dict(calls.changes) if calls.changes is not None else None,
        "loop_records": list(calls.loop_records), "turn": None})


class RewindPhase(WorkspacePhase):
    _rewound: Rewound | ApplicationError | None = None  # the outcome, for the update
    _points: list[RewindPoint] | None = None
    _journaled: list[str] | None = None

    def _rewind_points(self) -> list[RewindPoint]:
        if self._points is None:
            self._points = []
        return self._points

    def _journaled_calls(self) -> list[str]:
        """This run's calls of journaled (edit) tools, in order: a rewind drops the ones
        after its point from the journal."""
        if self._journaled is None:
            self._journaled = []
        return self._journaled

    def _take_outcome(self) -> Rewound | ApplicationError | None:
        outcome, self._rewound = self._rewound, None
        return outcome

    def _keep_rewind_point(self, turn: TurnState | None) -> None:
        """After a call's checkpoint and its result in the conversation: a point to come
        back to (one per checkpoint, in the run's order, as its history lists them)."""
        taken = self._unpointed
        if taken is None:
            return
        self._unpointed = None
        state = self.state
        calls = kept_calls(state.calls)
        calls.turn = turn.model_copy(deep=True) if turn is not None else None
        self._rewind_points().append(RewindPoint(
            call_id=taken[0], checkpoint_id=taken[1], planning=kept_planning(state.planning),
            conversation=kept_conversation(state.conversation), calls=calls,
            usage=state.stats.usage, usage_by_model=dict(state.stats.usage_by_model),
            journaled=len(self._journaled_calls())))

    def _refuse_rewind(self, request: RewindRequest) -> None:
        if self.state.status != "running" or not self._in_loop:
            raise ValueError(NOT_IN_LOOP)
        if self._rewind is not None:
            raise ValueError("another rewind of this task is under way")
        if self._hand_over is not None:
            raise ValueError("the task is being handed over to a new build of the workers; "
                             "rewind it once that is done")
        taken = len(self._rewind_points())
        if not taken:
            raise ValueError("this run has taken no workspace checkpoint yet (or it continued "
                             "into a new run since its last change)")
        if request.step > taken:
            raise ValueError(f"no step {request.step}: this run took checkpoints 1 to {taken}")

    async def _rewind_asked(self, request: RewindRequest) -> Rewound:
        self._rewind, self._rewound = request, None
        self._emit("rewind", {"step": request.step})
        await workflow.wait_condition(lambda: self._rewound is not None)
        outcome = self._take_outcome()
        if isinstance(outcome, ApplicationError):
            raise outcome
        assert outcome is not None
        return outcome

    def rewind_due(self) -> bool:
        return self._rewind is not None

    async def _rewind_now(self) -> bool:
        """At a safe point: the workspace and the run's state put back to the point (True),
        or (the restore failed) the workspace back to the latest checkpoint and nothing
        else (False)."""
        request = self._rewind
        assert request is not None
        points = self._rewind_points()
        point = points[request.step - 1]
        try:
            restored = await self._restore_for_rewind(point)
        except ApplicationError as refused:
            self._emit("rewind_failed", {"step": request.step, "error": refused.message})
            self._rewind, self._rewound = None, refused
            return False
        taken_back = len(self._journaled_calls()) - point.journaled
        self._put_back(point)
        del points[request.step:]
        del self._journaled_calls()[point.journaled:]
        self._unpointed = None  # a checkpoint retaken meanwhile is after the point: gone
        rewound_usage = accounting.usage_since(self.state.stats.usage, point.usage)
        self.state.stats = accounting.mark_rewound(self.state.stats, point.usage,
                                                   point.usage_by_model)
        self._emit("rewound", {"step": request.step, "checkpoint": point.checkpoint_id,
                               "call": point.call_id, "edits_taken_back": taken_back,
                               "rewound_tokens": rewound_usage.total_tokens,
                               "rewound_calls": rewound_usage.calls,
                               **restored.model_dump()})
        self._emit_step()  # the plan's progress as it was there
        self._show()
        await self._record(self._visible_status())
        self._rewind = None
        self._rewound = Rewound(step=request.step, checkpoint_id=point.checkpoint_id,
                                call_id=point.call_id, calls_taken_back=taken_back,
                                rewound_tokens=rewound_usage.total_tokens, restored=restored)
        return True

    async def _restore_for_rewind(self, point: RewindPoint) -> RestoreResult:
        """The workspace at the point; on failure, back at the latest checkpoint (a
        partial restore never stays), and the rewind refused with why."""
        await self._checkpoint_again()  # the latest change saved, to come back to
        inp, workspace = self.state.input, self.state.workspace
        if workspace.unsaved_call is not None:
            raise ApplicationError("the task's latest change could not be saved, so a failed "
                                   "restore could not be undone; nothing was changed",
                                   type="RewindRefused", non_retryable=True)
        try:
            return await self.activities.call(
                activity_calls.RESTORE_WORKSPACE,
                RestoreInput(workspace=inp.workspace, checkpoint_id=point.checkpoint_id,
                             discard_calls=self._journaled_calls()[point.journaled:]),
                summary=f"rewind to checkpoint {point.checkpoint_id[:12]}")
        except ActivityError as err:
            why = describe_failure(err)
        latest = workspace.last_checkpoint
        if latest is not None:
            try:
                await self.activities.call(
                    activity_calls.RESTORE_WORKSPACE,
                    RestoreInput(workspace=inp.workspace, checkpoint_id=latest),
                    summary=f"back to checkpoint {latest[:12]} after a failed rewind")
            except ActivityError as err:
                failed = TaskFailed("rewind_failed", "a rewind could not restore the "
                                    f"workspace ({why}), nor put it back to its latest "
                                    f"checkpoint ({describe_failure(err)})")
                self._rewound = ApplicationError(failed.message, type="RewindFailed",
                                                 non_retryable=True)  # the update says so
                raise failed from err
        raise ApplicationError(f"the workspace could not be put back ({why}); it is as it "
                               "was and the task goes on", type="RewindFailed",
                               non_retryable=True)

    def _put_back(self, point: RewindPoint) -> None:
        """The run's state at the point. Review keys, the stats and the turn numbers keep
        counting (their rows and the money spent are real; the turn going on gets a new
        number, so no call id, journal entry or approval of a call taken back is met
        again); waits and approvals of the calls taken back end."""
        state = self.state
        state.planning = kept_planning(point.planning)
        state.conversation = kept_conversation(point.conversation)
        state.calls = kept_calls(point.calls)
        if point.calls.turn is not None:
            state.calls.turn = point.calls.turn.model_copy(deep=True)
        turn = state.calls.turn
        if turn is not None:
            turn.iteration = state.stats.iterations + 1
            state.stats = state.stats.model_copy(update={"iterations": turn.iteration})
        state.approvals.waiting.clear()
        for kind in list(state.waits):
            self._end_wait(kind)
        state.workspace.last_checkpoint = point.checkpoint_id
        state.workspace.unsaved_call = None
