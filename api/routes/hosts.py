"""Worker hosts: who holds which workspace roots, and whether each is live (GET /hosts);
and the host a new session's workspace belongs to.

A workspace lives on one host's disk. With live hosts, the API checks a workspace against
their roots (it need not see the directory itself: the host checks the real path again
and refuses one outside its roots). With none live (a single machine whose worker has not
registered yet), sessions behave as before: the API's own roots, no host.
"""

from __future__ import annotations

import asyncio
import posixpath
from pathlib import Path

from fastapi import APIRouter, HTTPException, status

from refloop.api.deps import StoreDep
from refloop.contract.hosts import HostInfo, HostRefused, NoHostHolds, check_host, choose_host
from refloop.runtime.workspaces import (
    WorkspaceError,
    fresh_workspace,
    resolve_workspace,
    system_refusal,
)
from refloop.settings import Settings
from refloop.store.db import Store
from refloop.store.hosts import list_hosts

router = APIRouter(prefix="/hosts", tags=["hosts"])


@router.get("", response_model=list[HostInfo])
async def hosts(store: StoreDep) -> list[HostInfo]:
    return await asyncio.to_thread(list_hosts, store)


def host_path(raw: str) -> str:
    """An absolute, normalised path for a host's roots check (the API may not see it)."""
    if "\x00" in raw:
        raise WorkspaceError("workspace contains a NUL byte")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise WorkspaceError(f"workspace {raw!r}: name an absolute path on the host")
    path = path.resolve() if path.exists() else Path(posixpath.normpath(str(path)))
    reason = system_refusal(path)
    if reason:
        raise WorkspaceError(reason)
    return str(path)


def unprocessable(err: Exception | str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err))


async def session_host(store: Store, raw: str, requested: str | None
                       ) -> tuple[str, str] | NoHostHolds | None:
    """(workspace, host) for a session; None: no host is live and none was named;
    NoHostHolds: no live host holds it (the API's own roots may: one machine)."""
    known = await asyncio.to_thread(list_hosts, store)
    if requested is None and not any(host.live for host in known):
        return None
    try:
        path = host_path(raw)
        return path, choose_host(path, known, requested)
    except NoHostHolds as err:
        return err
    except (WorkspaceError, HostRefused) as err:
        raise unprocessable(err) from err


async def place_workspace(store: Store, settings: Settings, raw: str | None,
                          requested: str | None) -> tuple[str, str | None]:
    """(workspace, host) of new work: on the live host whose roots hold `raw` (or the
    requested one, after the same check), else, with no live host holding it, inside the
    API's own roots with no host (one machine); `raw` None: a fresh directory. 422 when
    refused."""
    placed = None
    if raw is not None or requested is not None:  # on a host's disk, if any live
        placed = await session_host(store, raw or "", requested)
    unheld = placed if isinstance(placed, NoHostHolds) else None
    if unheld is not None:  # today's rule decides: the API's own roots, no host
        placed = None
    host = placed[1] if placed is not None else None
    if placed is not None and host != settings.refloop_host_id:
        return placed[0], host  # on another machine: that host checks it again
    try:  # inside REFLOOP_WORKSPACE_ROOTS, or a fresh directory under the data dir
        workspace = await asyncio.to_thread(
            lambda: resolve_workspace(raw, settings) if raw is not None
            else fresh_workspace(settings))
    except WorkspaceError as err:
        why = f"{unheld}; {err}" if unheld is not None else str(err)
        raise unprocessable(why) from err
    return str(workspace), host


async def recheck_host(store: Store, workspace: str, host: str) -> None:
    """A session's host still known, its roots still holding the workspace (422 if not);
    a host that is not live is a state: its task waits for it."""
    known = await asyncio.to_thread(list_hosts, store)
    try:
        check_host(host, workspace, known)
    except HostRefused as err:
        raise unprocessable(err) from err


def live_host_holding(known: list[HostInfo], host: str, workspace: str) -> HostInfo:
    """The host a task may move to: known, live, its roots holding the workspace
    (HostRefused, with the reason, if not)."""
    target = check_host(host, workspace, known)
    if not target.live:
        raise HostRefused(f"host {host!r} is not live (last seen {target.last_seen:%F %T}Z)")
    return target
