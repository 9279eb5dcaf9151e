"""This worker as a host: its id, workspace roots and task queues, its row in the `hosts`
table (written at start, then every REFLOOP_HOST_HEARTBEAT_S), and the guard that makes its
host queue refuse a workspace outside its roots, and claims a call its task scheduled while
it waited for its host before running it (so a move cannot run it elsewhere too).

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
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from refloop.contract.hosts import CALL_TAKEN_BACK, CLAIM_UPDATE, CallClaim, needs_claim
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
        await claim_call(host.host_id)
        return await fn(arg)

    run.__annotations__ = {"arg": arg_type, "return": definition.ret_type}
    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "guarded")
    return activity.defn(name=definition.name)(run)


# A claim that cannot reach Temporal is asked again after these pauses, then the attempt
# fails (retryable: the call has not run).
CLAIM_PAUSES_S = (1.0, 2.0, 4.0, 8.0)
# The task is gone, or the update is not (yet) one it has: the call must not run.
_NO_TASK = (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION,
            RPCStatusCode.INVALID_ARGUMENT)


async def claim_call(host_id: str) -> None:
    """Before a call its task scheduled while it waited for its host (its activity id says
    so): the task's word that no move took it back. A refusal is the call's non-retryable
    error (`CallTakenBack`), and the call does not run."""
    info = activity.info()
    if not needs_claim(info.activity_id) or not info.workflow_id:
        return
    handle = activity.client().get_workflow_handle(info.workflow_id,
                                                   run_id=info.workflow_run_id)
    claim = CallClaim(activity_id=info.activity_id, host=host_id)
    for pause in (*CLAIM_PAUSES_S, None):
        try:
            # One update id per attempt: a claim asked again gets the same answer.
            await handle.execute_update(CLAIM_UPDATE, claim, result_type=str,
                                        id=f"{info.activity_id}.{info.attempt}")
            return
        except WorkflowUpdateFailedError as err:
            raise ApplicationError(f"not run: {err.cause or err}", type=CALL_TAKEN_BACK,
                                   non_retryable=True) from None
        except RPCError as err:
            if err.status in _NO_TASK or pause is None:
                raise ApplicationError(f"not run: the task could not be asked ({err})",
                                       type=CALL_TAKEN_BACK,
                                       non_retryable=err.status in _NO_TASK) from None
            log.warning("host %s: claiming %s of %s: %s; again in %.0f s", host_id,
                        info.activity_id, info.workflow_id, err, pause)
            await asyncio.sleep(pause)


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
