"""`@implements(CALL)`: an activity defined for its `ActivityCall`, under the call's name.

Workflows call activities by name, so nothing at run time ties a definition to the types its
callers send and expect (the worker compares them at start:
`refloop.worker.plugin.signature_mismatches`). This decorator ties them for the type checker:
the function must take the call's argument type and return its result type, or mypy
(`python -m tests.typecheck`, in `make test`) reports an error at the definition. At run time
it is `activity.defn(name=CALL.name)`: the registered name is the call's, never another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar, overload

from pydantic import BaseModel
from temporalio import activity

from refloop.contract.activity_calls import ActivityCall

ArgT = TypeVar("ArgT", bound=BaseModel)
ResultT = TypeVar("ResultT")
SelfT = TypeVar("SelfT")


class implements(Generic[ArgT, ResultT]):  # noqa: N801 - used as a decorator
    """Register the decorated activity as `call`'s: a method `(self, inp: Arg) -> Result` or
    a function `(inp: Arg) -> Result`, async, with the call's `Arg` and `Result`."""

    def __init__(self, call: ActivityCall[ArgT, ResultT]) -> None:
        self.call = call

    @overload
    def __call__(
        self, fn: Callable[[SelfT, ArgT], Awaitable[ResultT]]
    ) -> Callable[[SelfT, ArgT], Awaitable[ResultT]]: ...

    @overload
    def __call__(
        self, fn: Callable[[ArgT], Awaitable[ResultT]]
    ) -> Callable[[ArgT], Awaitable[ResultT]]: ...

    def __call__(
        self, fn: Callable[..., Awaitable[ResultT]]
    ) -> Callable[..., Awaitable[ResultT]]:
        return activity.defn(name=self.call.name)(fn)
