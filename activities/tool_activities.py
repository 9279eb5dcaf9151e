"""Tool activities: one activity type per tool (`refloop.tool.<name>`), so the Web UI
shows what ran; each looks the tool up in the one registry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.activities.model_calls import heartbeating
from refloop.contract import activity_calls
from refloop.contract.models import RunToolInput, ToolResult
from refloop.contract.policies import TOOL_RESULT_CHARS
from refloop.settings import Settings
from refloop.store.blobs import holds_large_string, holds_marker, offload_output, resolve_args
from refloop.store.db import Store
from refloop.tools.base import TOOLS, UnknownToolError
from refloop.tools.os_sandbox import UNSANDBOXED_WARNING, SandboxUnavailableError, sandbox_mode
from refloop.tools.output import tool_feedback
from refloop.tools.registry import execute_tool

# What the model reads of one result, less the "[tool] ok" header the workflow adds.
FEEDBACK_CHARS = TOOL_RESULT_CHARS - 100

ToolActivity = Callable[[RunToolInput], Awaitable[ToolResult]]


class ToolActivities:
    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        # A worker without its command sandbox refuses to start, unless `none` was chosen.
        try:
            mode = sandbox_mode(settings)
        except SandboxUnavailableError as err:
            raise SystemExit(f"refloop worker: {err}") from None
        if mode == "none":
            logging.getLogger("refloop").warning("\n%s\n%s\n%s", "!" * 78,
                                                 UNSANDBOXED_WARNING, "!" * 78)

    async def run(self, inp: RunToolInput) -> ToolResult:
        activity.logger.info("tool %s (%s)", inp.name, inp.call_id)
        # Offloaded arguments come back whole; a large output goes out as a marker. Only
        # those hop to a thread for the store: a busy worker pays for every thread hop.
        arguments = inp.arguments
        try:
            marked = holds_marker(arguments)
        except RecursionError:  # hostile nesting: a tool error the model reads, not a retry
            return ToolResult(ok=False, error="E_INVALID_ARGS: the arguments nest too deeply")
        if marked:
            arguments = await asyncio.to_thread(resolve_args, arguments, self.store.get_blob)
        async with heartbeating():
            try:
                result = await execute_tool(inp.model_copy(update={"arguments": arguments}),
                                            self.settings)
            except UnknownToolError as err:
                raise ApplicationError(
                    str(err), type="UnknownToolError", non_retryable=True
                ) from err
        output = tool_feedback(result.output, TOOLS[inp.name].properties, inp.keywords,
                               FEEDBACK_CHARS)
        threshold = self.settings.refloop_blob_threshold_bytes
        if holds_large_string(output, threshold):
            output = await asyncio.to_thread(offload_output, output, threshold,
                                             self.store.put_blob)
        return result.model_copy(update={"output": output})

    def activities(self) -> list[ToolActivity]:
        """A named activity per registered tool, all sharing `run`."""

        def named(name: str) -> ToolActivity:
            async def run_tool(inp: RunToolInput) -> ToolResult:
                return await self.run(inp)

            return activity.defn(name=activity_calls.run_tool(name).name)(run_tool)

        return [named(name) for name in TOOLS]
