"""This worker as a host: its id, workspace roots and task queues, its row in the `hosts`
table (written at start, then every REFLOOP_HOST_HEARTBEAT_S), and the guard that makes its
host queue refuse a workspace outside its roots.

A workspace activity that reaches the wrong host is a non-retryable error, never work done
on another disk: a retry would land on the same host and fail the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.runtime.background import in_background
from refloop.store import hosts as host_rows
from refloop.store.db import Store, utcnow

log = logging.getLogger("refloop.worker")

NOT_ON_HOST = "WorkspaceNotOnHost"


@dataclass(frozen=True)
class HostIdentity:
    host_id: str
    roots: tuple[Path, ...]
    task_queues: tuple[str, ...]
    identity: str  # the worker identity histories show for every activity it ran


def workspace_of(arg: Any) -> str | None:
    """The workspace an activity argument names (a code review's working directory)."""
    workspace = getattr(arg, "workspace", None)
    if workspace is None and getattr(arg, "request", None) is not None:
        workspace = getattr(arg.request, "working_directory", None)
    return workspace


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def refuse_foreign(workspace: str | None, host: HostIdentity) -> None:
    if workspace is None:
        return
    real = Path(workspace).expanduser().resolve()  # links followed: the real place counts
    if not any(_inside(real, root) for root in host.roots):
        roots = ", ".join(str(root) for root in host.roots) or "none"
        raise ApplicationError(
            f"workspace {workspace} is not on host {host.host_id} (its roots: {roots}); "
            "it is never served from another host's disk", type=NOT_ON_HOST,
            non_retryable=True)


def guarded(fn: Callable[..., Any], host: HostIdentity) -> Callable[..., Any]:
    """`fn` under the same activity name, refusing a workspace outside the host's roots."""
    definition = activity._Definition.must_from_callable(fn)
    arg_type = definition.arg_types[0] if definition.arg_types else Any

    async def run(arg: Any) -> Any:
        refuse_foreign(workspace_of(arg), host)
        return await fn(arg)

    run.__annotations__ = {"arg": arg_type, "return": definition.ret_type}
    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "guarded")
    return activity.defn(name=definition.name)(run)


@contextlib.asynccontextmanager
async def host_presence(store: Store, host: HostIdentity, beat_s: float) -> AsyncIterator[None]:
    """The host's row, refreshed while the worker runs; a database outage costs beats
    (the host looks gone), never the worker."""
    started: datetime = utcnow()

    async def beat() -> None:
        try:
            await asyncio.to_thread(host_rows.beat, store, host.host_id,
                                    [str(r) for r in host.roots], list(host.task_queues),
                                    host.identity, beat_s, started)
        except Exception as err:  # noqa: BLE001 (the database may be down: beat again later)
            log.warning("host %s: could not record its beat: %s", host.host_id, err)

    async def beating() -> None:
        while True:
            await asyncio.sleep(beat_s)
            await beat()

    await beat()
    async with in_background(beating()):
        yield
