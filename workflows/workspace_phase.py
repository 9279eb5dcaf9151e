"""A phase of the agent workflow: the workspace's environment and repo
map for the system prompt, and the semantic index built in the background."""

from __future__ import annotations

import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls
    from refloop.contract.task import IndexReport, WorkspaceDescription, WorkspaceInput

from refloop.workflows import patches
from refloop.workflows.agent_base import AgentBase, describe_failure, raise_if_cancelled
from refloop.workflows.calls import start_activity

SEMANTIC_TOOL = "search_semantic"


class WorkspacePhase(AgentBase):
    _describing: workflow.ActivityHandle[WorkspaceDescription] | None = None
    _indexing: workflow.ActivityHandle[IndexReport] | None = None
    _cancelled_index: workflow.ActivityHandle[IndexReport] | None = None

    def _begin_describing(self) -> None:
        """Fresh runs: describe the workspace while intent and plan are worked out."""
        if workflow.patched(patches.WORKSPACE_CONTEXT):
            self._describing = start_activity(
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
            description = await self._describing
        except ActivityError as err:
            raise_if_cancelled(err)
            self._emit("workspace", {"error": describe_failure(err)})
            return
        finally:
            self._describing = None
        self.state.workspace.context = description.context
        index = (description.index_available and SEMANTIC_TOOL in tool_names
                 and not self.state.input.is_supplement)  # the parent indexes shared files
        self._emit("workspace", {"context_chars": len(description.context), "indexing": index})
        if index:
            self._indexing = start_activity(
                activity_calls.INDEX_WORKSPACE,
                WorkspaceInput(workspace=self.state.input.workspace),
                summary=f"index workspace {self.state.input.workspace}",
                # A cancel resolves once the worker has stopped it: the run can then end
                # with no activity left pending (the Web UI showed "Pending Activities 1").
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )

    async def _settle_indexing(self) -> None:
        """Before the run ends: wait for a cancelled index to stop (runs recorded before
        this patch ended without waiting)."""
        handle, self._cancelled_index = self._cancelled_index, None
        if handle is None or not workflow.patched(patches.INDEX_SETTLE):
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
