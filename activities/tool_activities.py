"""Tool activities: one activity type per tool (`refloop.tool.<name>`), so the Web UI
shows what ran; each looks the tool up in the one registry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.errors import heartbeating
from refloop.models import ActivityName, RunToolInput, ToolResult
from refloop.settings import Settings
from refloop.tools import TOOLS, UnknownToolError, execute_tool

ToolActivity = Callable[[RunToolInput], Awaitable[ToolResult]]


class ToolActivities:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def run(self, inp: RunToolInput) -> ToolResult:
        activity.logger.info("tool %s (%s)", inp.name, inp.call_id)
        async with heartbeating(2.0):
            try:
                return await execute_tool(inp, self.settings)
            except UnknownToolError as err:
                raise ApplicationError(
                    str(err), type="UnknownToolError", non_retryable=True
                ) from err

    def activities(self) -> list[ToolActivity]:
        """A named activity per registered tool, all sharing `run`."""

        def named(name: str) -> ToolActivity:
            async def run_tool(inp: RunToolInput) -> ToolResult:
                return await self.run(inp)

            return activity.defn(name=ActivityName.tool(name))(run_tool)

        return [named(name) for name in TOOLS]
