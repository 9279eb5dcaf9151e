"""Hosts: which worker holds a task's workspace, and the task queues that route work there.

Shared by every worker: Temporal, the database, blobs. Local to one host: a workspace, its
edit journal and its search index. A task that names its `host` runs every activity that
touches its workspace on that host's own task queue; model calls of every task run on the
fleet's model queue, whose server-side rate limit caps the whole fleet.

Plain data and pure functions: the workflow, the worker and the API all use them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel

# Where an activity runs: the shared queue, the model queue, or the task's host queue.
RunsOn = Literal["shared", "model", "workspace"]

HOST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# A workspace call no worker of its host picks up within this long makes the task
# `waiting_for_host` (REFLOOP_HOST_WAIT_S); it then waits on, re-checking less often.
DEFAULT_HOST_WAIT = timedelta(seconds=60)
MAX_HOST_WAIT = timedelta(minutes=10)
LIVE_BEATS = 3  # a host is live while its last beat is younger than this many intervals


def host_queue(shared: str, host: str) -> str:
    """The task queue only `host`'s workers poll: its workspace activities."""
    return f"{shared}@{host}"


def model_queue(shared: str) -> str:
    """The task queue of every model call; its rate limit is the fleet's."""
    return f"{shared}.llm"


def host_wait(seconds: float | None) -> timedelta:
    """The first bound on a host picking a workspace call up (None: the default)."""
    return timedelta(seconds=seconds) if seconds else DEFAULT_HOST_WAIT


def next_wait(waited: timedelta) -> timedelta:
    """The bound of the next try after a host did not answer within `waited`: doubling,
    so a host gone for a weekend costs a few events an hour, not thousands."""
    return min(waited * 2, MAX_HOST_WAIT)


class HostInfo(BaseModel):
    """One worker host as the database knows it."""

    host_id: str
    roots: list[str]
    task_queues: list[str] = []
    last_seen: datetime
    started_at: datetime | None = None
    beat_s: float = 10.0
    live: bool = False


class HostRefused(ValueError):
    """A host that cannot take the workspace; the message names the candidates."""


class NoHostHolds(HostRefused):
    """No live host's roots hold the workspace."""


def holds(roots: Sequence[str], path: str) -> bool:
    """Whether `path` (absolute) is inside one of `roots` (lexically: the host resolves
    links itself and refuses a workspace that leaves its roots)."""
    clean = posixpath.normpath(path)
    for root in roots:
        base = posixpath.normpath(root)
        if clean == base or clean.startswith(base.rstrip("/") + "/"):
            return True
    return False


def _described(hosts: Sequence[HostInfo]) -> str:
    return "; ".join(f"{h.host_id} ({'live' if h.live else 'not live'}, roots "
                     f"{', '.join(h.roots) or 'none'})" for h in hosts) or "none"


def check_host(host: str, path: str, hosts: Sequence[HostInfo]) -> HostInfo:
    """The named host, if the database knows it and its roots hold `path`."""
    known = {h.host_id: h for h in hosts}
    if host not in known:
        raise HostRefused(f"unknown host {host!r}; known hosts: {_described(hosts)}")
    chosen = known[host]
    if not holds(chosen.roots, path):
        others = [h.host_id for h in hosts if h.live and holds(h.roots, path)]
        hint = f"; live hosts holding it: {', '.join(others)}" if others else ""
        raise HostRefused(f"host {host!r} does not hold {path} (its roots: "
                          f"{', '.join(chosen.roots) or 'none'}){hint}")
    return chosen


class HostMove(BaseModel):
    """Move a task waiting for a host that will never return to another host. `host` is
    that host as the hosts table has it now: the API and `refloop move` read it (a workflow
    cannot), and the workflow's validator checks it against the task."""

    host: HostInfo


def refuse_move(current: str | None, workspace: str, status: str, move: HostMove) -> None:
    """Why the move cannot be made (ValueError), if it cannot: the task must wait for its
    host (nothing of it runs anywhere), and the new host be another one, live, whose roots
    hold the workspace."""
    target = move.host
    if current is None:
        raise ValueError("the task has no host: its workspace activities run on any worker")
    if status != "waiting_for_host":
        raise ValueError(f"the task is {status}, not waiting_for_host: only a task waiting "
                         "for its host can be moved")
    if target.host_id == current:
        raise ValueError(f"the task is already on host {current!r}")
    if not target.live:
        raise ValueError(f"host {target.host_id!r} is not live")
    if not holds(target.roots, workspace):
        raise ValueError(f"host {target.host_id!r} does not hold {workspace} (its roots: "
                         f"{', '.join(target.roots) or 'none'})")


def choose_host(path: str, hosts: Sequence[HostInfo], requested: str | None = None) -> str:
    """The host of a workspace: the requested one after the roots check, else the one live
    host whose roots hold it; none or several is a refusal naming the candidates."""
    if requested is not None:
        return check_host(requested, path, hosts).host_id
    holding = [h for h in hosts if h.live and holds(h.roots, path)]
    if len(holding) == 1:
        return holding[0].host_id
    if not holding:
        raise NoHostHolds(f"no live host holds {path}; hosts: {_described(hosts)}")
    raise HostRefused(f"several live hosts hold {path}: "
                      f"{', '.join(h.host_id for h in holding)}; name one with `host`")
