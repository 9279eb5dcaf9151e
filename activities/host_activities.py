"""The host check at a task's start: the host must be in the hosts table and its roots
must hold the task's workspace. A refusal is non-retryable: the task fails at once with
the reason the API would have answered 422 with."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.contract import activity_calls
from refloop.contract.activity_io import HostCheckInput
from refloop.contract.hosts import HostRefused, check_host
from refloop.store.db import Store
from refloop.store.hosts import list_hosts


class HostActivities:
    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name=activity_calls.CHECK_HOST.name)
    async def check(self, inp: HostCheckInput) -> None:
        known = await asyncio.to_thread(list_hosts, self.store)
        try:
            check_host(inp.host, inp.workspace, known)
        except HostRefused as err:
            raise ApplicationError(str(err), type=HostRefused.__name__,
                                   non_retryable=True) from None
