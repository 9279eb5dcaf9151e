"""Tool activities: one activity type per tool (`refloop.tool.<name>`), so the Web UI
shows what ran; each looks the tool up in the one registry.

A call that may change the workspace comes with `checkpoint` (the workflow's rule, as it
applies to the call): once the tool ran, the activity checkpoints the workspace itself, on
the same host, and returns the checkpoint (or why it failed) with the tool's result. The
workflow then needs no checkpoint activity, and no workflow task, of its own for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.activities.checkpoint_activities import CheckpointActivities
from refloop.activities.defn import implements
from refloop.activities.heartbeat import heartbeating
from refloop.contract import activity_calls
from refloop.contract.activity_io import (
    ReadToolsInput,
    RunToolInput,
    ToolCatalogSnapshot,
    ToolResult,
)
from refloop.contract.errors import UnknownToolError
from refloop.contract.tool_catalog import TOOLS
from refloop.settings import Settings
from refloop.store.db import Store
from refloop.tools.cgroups import accounting
from refloop.tools.os_sandbox import UNSANDBOXED_WARNING, SandboxUnavailableError, sandbox_mode
from refloop.tools.output import arguments_or_refusal, output_for_model
from refloop.tools.registry import execute_tool

ToolActivity = Callable[[RunToolInput], Awaitable[ToolResult]]

# Time a call's activity keeps, after its checkpoint, to report its result: a checkpoint
# that would run past the activity's start-to-close stops at this margin (it is taken
# again with its own activity) rather than fail a call whose tool ran.
CHECKPOINT_MARGIN = timedelta(seconds=30)


class ToolActivities:
    def __init__(self, settings: Settings, store: Store,
                 checkpoints: CheckpointActivities | None = None) -> None:
        self.settings = settings
        self.store = store
        self._checkpoints = checkpoints
        # A worker without its command sandbox refuses to start, unless `none` was chosen.
        try:
            mode = sandbox_mode(settings)
        except SandboxUnavailableError as err:
            raise SystemExit(f"refloop worker: {err}") from None
        if mode == "none":
            logging.getLogger("refloop").warning("\n%s\n%s\n%s", "!" * 78,
                                                 UNSANDBOXED_WARNING, "!" * 78)
        else:  # whether a command is bounded as a whole, or only each of its processes
            counted = accounting()
            log = logging.getLogger("refloop")
            (log.warning if counted.kind == "none" else log.info)("%s", counted.describe())

    @property
    def checkpoints(self) -> CheckpointActivities:
        """This host's checkpoints (made at the first call that takes one)."""
        if self._checkpoints is None:
            self._checkpoints = CheckpointActivities(self.settings, self.store)
        return self._checkpoints

    async def run(self, inp: RunToolInput) -> ToolResult:
        activity.logger.info("tool %s (%s)", inp.name, inp.call_id)
        # The blob reads and writes beat too: a database slow to store a command's output
        # must not make the call look lost (and the command be reported as interrupted).
        async with heartbeating():
            result = await self._run(inp)
            after = inp.checkpoint
            # A retried attempt runs the tool again (a journaled edit returns its first
            # result, changing nothing): its checkpoint is still the workspace after the call.
            if after is not None and (result.ok or after.failed_too):
                taken = await self.checkpoints.after_call(inp.workspace, inp.call_id, after,
                                                          checkpoint_deadline())
                result = result.model_copy(update={"checkpoint": taken})
        return result

    async def _run(self, inp: RunToolInput) -> ToolResult:
        arguments = await arguments_or_refusal(inp.arguments, self.store.get_blob)
        if isinstance(arguments, ToolResult):
            return arguments
        try:
            result = await execute_tool(inp.model_copy(update={"arguments": arguments}),
                                        self.settings)
        except UnknownToolError as err:
            raise ApplicationError(
                str(err), type=UnknownToolError.__name__, non_retryable=True
            ) from err
        output = await output_for_model(
            result.output, TOOLS[inp.name].properties.windowed, inp.keywords,
            self.settings.refloop_blob_threshold_bytes, self.store.put_blob)
        return result.model_copy(update={"output": output})

    @staticmethod
    @implements(activity_calls.READ_TOOL_CATALOG)
    async def read_catalog(inp: ReadToolsInput) -> ToolCatalogSnapshot:
        """This worker's built-in tools, for a run starting: they stay its tools."""
        return ToolCatalogSnapshot(tools={name: declaration.properties
                                          for name, declaration in TOOLS.items()})

    def activities(self) -> list[ToolActivity]:
        """A named activity per registered tool, all sharing `run`."""

        def named(name: str) -> ToolActivity:
            async def run_tool(inp: RunToolInput) -> ToolResult:
                return await self.run(inp)

            return implements(activity_calls.run_tool(name))(run_tool)

        return [named(name) for name in TOOLS]


def checkpoint_deadline() -> float | None:
    """When (`time.monotonic()`) a checkpoint inside this activity must be done: the
    activity's start-to-close less the margin to report its result (None: no bound)."""
    info = activity.info()
    timeout = info.start_to_close_timeout
    if not timeout:
        return None
    ends = info.started_time + timeout - CHECKPOINT_MARGIN
    return time.monotonic() + (ends - datetime.now(UTC)).total_seconds()
