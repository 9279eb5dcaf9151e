"""The host check at a task's start: the host must be in the hosts table and its roots
must hold the task's workspace. A refusal is non-retryable: the task fails with the reason
the API would have answered 422 with (at once, or, for a host the table does not know yet,
once its host bound is spent)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio.exceptions import ApplicationError

from refloop.activities.defn import implements
from refloop.contract import activity_calls
from refloop.contract.activity_io import HostCheckInput
from refloop.contract.hosts import HostRefused, ModelRoute, ModelRouteInput, check_host
from refloop.store.db import Store
from refloop.store.hosts import list_hosts


@dataclass
class FleetView:
    """The fleet's settings as this worker has them: its own until the worker has read the
    fleet's at its start (`refloop.store.fleet`)."""

    llm_rate_per_s: float | None = None


class HostActivities:
    def __init__(self, store: Store, fleet: FleetView | None = None) -> None:
        self.store = store
        self.fleet = fleet or FleetView()

    @implements(activity_calls.MODEL_ROUTE)
    async def model_route(self, inp: ModelRouteInput) -> ModelRoute:
        return ModelRoute(llm_rate_per_s=self.fleet.llm_rate_per_s)

    @implements(activity_calls.CHECK_HOST)
    async def check(self, inp: HostCheckInput) -> None:
        known = await asyncio.to_thread(list_hosts, self.store)
        try:
            check_host(inp.host, inp.workspace, known)
        except HostRefused as err:
            # UnknownHost by its own name: the workflow waits for such a host to register.
            raise ApplicationError(str(err), type=type(err).__name__,
                                   non_retryable=True) from None
