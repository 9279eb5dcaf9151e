"""Calling an activity from workflow code: name, result type and options come from its
`ActivityCall`; a call site passes only the argument, a summary and, rarely, other options."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from refloop.contract.activity_calls import ActivityCall
    from refloop.contract.policies import ActivityOptions

ArgT = TypeVar("ArgT", bound=BaseModel)
ResultT = TypeVar("ResultT")


async def call_activity(activity: ActivityCall[ArgT, ResultT], arg: ArgT, *,
                        summary: str | None = None, options: ActivityOptions | None = None,
                        local: bool | None = None) -> ResultT:
    """Run the activity and wait for its result. `local=False` schedules a local one
    (runs recorded before it became local replay so)."""
    opts = options or activity.options
    if activity.local if local is None else local:
        return await workflow.execute_local_activity(
            activity.name, arg, result_type=activity.result_type, summary=summary,
            **opts.local_kwargs())
    return await workflow.execute_activity(
        activity.name, arg, result_type=activity.result_type, summary=summary, **opts.kwargs())


def start_activity(activity: ActivityCall[ArgT, ResultT], arg: ArgT, *,
          summary: str | None = None, **extra: Any) -> workflow.ActivityHandle[ResultT]:
    """Start the activity and return its handle (it runs alongside the workflow)."""
    kwargs: dict[str, Any] = {**activity.options.kwargs(), **extra}
    return workflow.start_activity(activity.name, arg, result_type=activity.result_type,
                                   summary=summary, **kwargs)
