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
from refloop.runtime.workspaces import WorkspaceError, system_refusal
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


def unprocessable(err: Exception) -> HTTPException:
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


async def recheck_host(store: Store, workspace: str, host: str) -> None:
    """A session's host still known, its roots still holding the workspace (422 if not);
    a host that is not live is a state: its task waits for it."""
    known = await asyncio.to_thread(list_hosts, store)
    try:
        check_host(host, workspace, known)
    except HostRefused as err:
        raise unprocessable(err) from err
