"""A phase of the agent workflow: the workspace's environment and repo
map for the system prompt, the semantic index built in the background, and the
workspace's checkpoints (taken by a built-in tool's own activity after a call that may
change the workspace, else by the checkpoint activity)."""

from __future__ import annotations

import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls
    from refloop.contract.checkpoints import (
        CheckpointAfter,
        CheckpointInput,
        CheckpointTaken,
        ForkOrigin,
        RestoreInput,
    )
    from refloop.contract.messages import ToolCall
    from refloop.contract.task import IndexReport, WorkspaceDescription, WorkspaceInput

from refloop.workflows import logic
from refloop.workflows.agent_base import (
    AgentBase,
    TaskFailed,
    describe_failure,
)

SEMANTIC_TOOL = "search_semantic"
CHECKPOINT_ERROR_CHARS = 300  # of why a checkpoint failed, in the call's event


class WorkspacePhase(AgentBase):
    _describing: workflow.ActivityHandle[WorkspaceDescription] | None = None
    _indexing: workflow.ActivityHandle[IndexReport] | None = None
    _cancelled_index: workflow.ActivityHandle[IndexReport] | None = None
    # (call id, checkpoint id) of a checkpoint its rewind point is not yet kept for
    _unpointed: tuple[str, str] | None = None

    def _begin_describing(self) -> None:
        """Fresh runs: describe the workspace while intent and plan are worked out."""
        self._describing = self.activities.start(
            activity_calls.DESCRIBE_WORKSPACE,
            WorkspaceInput(workspace=self.state.input.workspace),
            summary=f"describe workspace {self.state.input.workspace}",
            bounded=True,  # a host that does not answer costs the map, not the task
        )

    async def _adopt_workspace_context(self, tool_names: list[str]) -> None:
        """Before the first turn: the context goes into the system prompt; indexing starts.
        A failure costs only the map: the task goes on without it."""
        if self._describing is None:
            return
        try:
            description = await self.activities.result(self._describing)
        except ActivityError as err:
            self._emit("workspace", {"error": describe_failure(err)})
            return
        finally:
            self._describing = None
        self.state.workspace.context = description.context
        index = (description.index_available and SEMANTIC_TOOL in tool_names
                 and not self.state.input.is_supplement)  # the parent indexes shared files
        self._emit("workspace", {"context_chars": len(description.context), "indexing": index})
        if index:
            self.state.workspace.indexing = True
            self._start_indexing()

    def _start_indexing(self) -> None:
        self._indexing = self.activities.start(
            activity_calls.INDEX_WORKSPACE,
            WorkspaceInput(workspace=self.state.input.workspace),
            summary=f"index workspace {self.state.input.workspace}",
            # A cancel resolves once the worker has stopped it: the run can then end
            # with no activity left pending (the Web UI showed "Pending Activities 1").
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )

    def _resume_indexing(self) -> None:
        """A continued run of a task that indexes its workspace: the index goes on (the
        previous run cancelled it at its end; unchanged files are not embedded again)."""
        if self.state.workspace.indexing and self._indexing is None:
            self._start_indexing()

    def _checkpoint_request(self, call: ToolCall) -> CheckpointAfter | None:
        """For a built-in call's activity: whether it checkpoints the workspace after the
        call itself (`logic.checkpoint_after`, which the activity applies to the call's
        outcome), when checkpoints are on."""
        if not self.state.input.checkpoints:
            return None
        name, arguments, properties = call.name, call.arguments, self._builtin_properties
        if not logic.checkpoint_after(name, arguments, True, properties):
            return None
        return CheckpointAfter(task_id=self.state.task_id,
                               failed_too=logic.checkpoint_after(name, arguments, False,
                                                                 properties))

    async def _checkpoint(self, call_id: str) -> dict[str, str]:
        """Checkpoint the workspace after a call that may have changed it, with the
        checkpoint activity: the id (or why none was taken) for the call's event. A failed
        checkpoint costs only itself."""
        inp = self.state.input
        if not inp.checkpoints:
            return {}
        try:
            taken = await self.activities.call(
                activity_calls.CHECKPOINT_WORKSPACE,
                CheckpointInput(workspace=inp.workspace, task_id=self.state.task_id,
                                call_id=call_id),
                # the call's iteration and index, as its tool call's id says them
                summary=f"checkpoint after call {'.'.join(call_id.split('.')[-2:])}")
        except ActivityError as err:
            return self._adopt_checkpoint(call_id, CheckpointTaken(
                error=describe_failure(err)))
        return self._adopt_checkpoint(call_id, CheckpointTaken(
            checkpoint_id=taken.checkpoint_id))

    def _adopt_checkpoint(self, call_id: str, taken: CheckpointTaken) -> dict[str, str]:
        """The checkpoint after a call (taken by the call's own activity or apart) in the
        state: the latest, with a rewind point to keep; failed, the change is unsaved and
        taken again before the next call. What the call's event says of it."""
        workspace = self.state.workspace
        if taken.checkpoint_id is None:
            workspace.unsaved_call = call_id
            return {"checkpoint_error": (taken.error or "no checkpoint")[:CHECKPOINT_ERROR_CHARS]}
        workspace.last_checkpoint = taken.checkpoint_id
        workspace.unsaved_call = None
        self._unpointed = (call_id, taken.checkpoint_id)
        return {"checkpoint": taken.checkpoint_id}

    async def _checkpoint_again(self) -> None:
        """A change whose checkpoint failed is saved before the task goes on."""
        unsaved = self.state.workspace.unsaved_call
        if unsaved is not None:
            taken = await self._checkpoint(unsaved)
            self._emit("checkpoint_retaken", {"call": unsaved, **taken})

    async def after_move(self) -> None:
        """A task moved to another host: its latest checkpoint put there before the call
        that waited goes, so a host that never saw the workspace's disk goes on with it."""
        self._show()
        await self._record(self._visible_status(),
                           input=self.state.input.model_dump(mode="json"))
        checkpoint = self.state.workspace.last_checkpoint
        if checkpoint is None:
            return
        self.state.workspace.rewind_to = checkpoint
        await self._restore_if_rewound(create=True)

    def _forking(self) -> ForkOrigin | None:
        """A fork's origin, when this run starts one (runs recorded before forks: None)."""
        fork = self.state.input.fork
        if fork is None or self.state.input.resume_state is not None:
            return None
        return fork

    async def _restore_fork(self, fork: ForkOrigin) -> None:
        """A fork's first work: its new workspace (made under its host's roots, new or
        empty) put at the original's checkpoint; then described and indexed as usual."""
        self._emit("forked_from", {"task_id": fork.task_id, "step": fork.step,
                                   "checkpoint": fork.checkpoint_id,
                                   "instruction": fork.instruction})
        self.state.workspace.rewind_to = fork.checkpoint_id
        await self._restore_if_rewound(create=True, fresh=True)
        self._begin_describing()

    async def _restore_if_rewound(self, create: bool = False, fresh: bool = False) -> None:
        """Before the next call of a rewound run: the workspace as it was at the checkpoint.
        A run that cannot restore stops rather than go on over files from its future."""
        checkpoint = self.state.workspace.rewind_to
        if checkpoint is None:
            return
        try:
            restored = await self.activities.call(
                activity_calls.RESTORE_WORKSPACE,
                RestoreInput(workspace=self.state.input.workspace, checkpoint_id=checkpoint,
                             create=create, fresh=fresh),
                summary=f"restore checkpoint {checkpoint[:12]}")
        except ActivityError as err:
            raise TaskFailed("rewind_failed", "the workspace could not be put back to "
                             f"checkpoint {checkpoint[:12]}: {describe_failure(err)}") from err
        self.state.workspace.rewind_to = None
        self.state.workspace.last_checkpoint = checkpoint
        self._emit("workspace_restored", {"checkpoint": checkpoint, **restored.model_dump()})

    async def _settle_indexing(self) -> None:
        """Before the run ends: wait for a cancelled index to stop."""
        handle, self._cancelled_index = self._cancelled_index, None
        if handle is None:
            return
        with contextlib.suppress(ActivityError):  # cancelled, as asked
            await handle

    def _stop_indexing(self) -> None:
        """At the end of a run: report the index, or cancel it if it is still going
        (the next task resumes it: unchanged files are never embedded twice)."""
        if self._describing is not None and not self._describing.done():
            self._describing.cancel()  # the run ended before its first turn
        self._describing = None
        handle, self._indexing = self._indexing, None
        if handle is None:
            return
        if not handle.done():
            handle.cancel()
            self._cancelled_index = handle
            self._emit("index", {"status": "cancelled", "reason": "the run ended first"})
            return
        try:
            report = handle.result()
        except ActivityError as err:
            self._emit("index", {"status": "failed", "error": describe_failure(err)})
            return
        self._emit("index", {"status": "done", **report.model_dump(mode="json")})
