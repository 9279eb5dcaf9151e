"""Worker hosts: who holds which workspace roots, and whether each is live (GET /hosts);
and the host a new session's workspace belongs to.

A workspace lives on one host's disk. Once any host is registered, the API checks a
workspace against the roots of every host, live or not (it need not see the directory
itself: the host checks the real path again and refuses one outside its roots), and no
new work goes without a host. With no host registered at all (a single machine whose
worker has not registered yet), sessions behave as before: the API's own roots, no host.
"""

from __future__ import annotations

import asyncio
import posixpath
from pathlib import Path

from fastapi import APIRouter, HTTPException, status

from refloop.api.deps import StoreDep
from refloop.contract.hosts import HostInfo, HostRefused, check_host, choose_host
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
    try:
        path = Path(raw).expanduser()
    except RuntimeError:  # `~name` of a user this machine does not have
        raise WorkspaceError(f"workspace {raw!r}: no such user's home here") from None
    if not path.is_absolute():
        raise WorkspaceError(f"workspace {raw!r}: name an absolute path on the host")
    try:
        path = path.resolve() if path.exists() else Path(posixpath.normpath(str(path)))
    except OSError as err:  # a component over NAME_MAX, a loop: no directory can be there
        raise WorkspaceError(f"workspace {raw[:80]!r}: {err.strerror or err}") from err
    reason = system_refusal(path)
    if reason:
        raise WorkspaceError(reason)
    return str(path)


def unprocessable(err: Exception | str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err))


def _fleet_host(path: str, known: list[HostInfo], requested: str | None) -> str:
    try:
        return choose_host(path, known, requested)
    except HostRefused as err:
        raise unprocessable(err) from err


async def place_workspace(store: Store, settings: Settings, raw: str | None,
                          requested: str | None) -> tuple[str, str | None]:
    """(workspace, host) of new work. Once the fleet has hosts, every workspace is on one:
    the requested host after the roots check, else the one whose roots hold `raw`, live or
    not (the task of a host that is down waits for it, `waiting_for_host`, and can be
    moved); none or several is a 422 naming the hosts. `raw` None: a fresh directory, made
    here only if this machine is one of the hosts. With no host registered at all (one
    machine whose worker has not registered yet): inside the API's own roots, no host."""
    known = await asyncio.to_thread(list_hosts, store)
    host = None
    if known or requested is not None:
        own = settings.refloop_host_id
        if raw is None:
            host = requested or own
            if host != own or own not in {h.host_id for h in known}:
                raise unprocessable(
                    f"name a workspace on host {host!r}: a fresh directory is made only on "
                    f"this machine's host ({own!r}), which is not registered; hosts: "
                    f"{', '.join(h.host_id for h in known) or 'none'}")
        else:
            try:
                path = host_path(raw)
            except WorkspaceError as err:
                raise unprocessable(err) from err
            host = _fleet_host(path, known, requested)
            if host != own:
                return path, host  # on another machine: that host checks it again
    try:  # inside REFLOOP_WORKSPACE_ROOTS, or a fresh directory under the data dir
        workspace = await asyncio.to_thread(
            lambda: resolve_workspace(raw, settings) if raw is not None
            else fresh_workspace(settings))
    except WorkspaceError as err:
        raise unprocessable(err) from err
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
