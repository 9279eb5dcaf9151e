"""Hosts: which worker holds a task's workspace, and the task queues that route work there.

Shared by every worker: Temporal, the database, blobs. Local to one host: a workspace, its
edit journal and its search index. A task that names its `host` runs every activity that
touches its workspace on that host's own task queue; model calls of every task run on the
fleet's model queue, whose server-side rate limit caps the whole fleet.

Plain data and pure functions: the workflow, the worker and the API all use them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
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
# A task naming a host the database does not know asks again this often, within its bound.
UNKNOWN_HOST_POLL = timedelta(seconds=2)
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


def unknown_host_pause(waited: timedelta, bound: timedelta) -> timedelta | None:
    """How long a task waits before asking again for a host the database did not know,
    having waited `waited`; None: the bound is spent, and the task fails with the reason."""
    if waited >= bound:
        return None
    return min(UNKNOWN_HOST_POLL, bound - waited)


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


class UnknownHost(HostRefused):
    """A host the database does not know, yet: a task may name one still starting, so a
    task waits for it to register, within its host bound, before this fails it."""


class NoHostHolds(HostRefused):
    """No host's roots hold the workspace."""


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
        raise UnknownHost(f"unknown host {host!r}; known hosts: {_described(hosts)}")
    chosen = known[host]
    if not holds(chosen.roots, path):
        others = [h.host_id for h in hosts if h.live and holds(h.roots, path)]
        hint = f"; live hosts holding it: {', '.join(others)}" if others else ""
        raise HostRefused(f"host {host!r} does not hold {path} (its roots: "
                          f"{', '.join(chosen.roots) or 'none'}){hint}")
    return chosen


class ModelRouteInput(BaseModel):
    """Asks the worker running a task how its fleet takes model calls (nothing to send)."""


class ModelRoute(BaseModel):
    """The fleet's model-call rate limit, as the worker running the task has it (from the
    `fleet` table, at its start); recorded once per run, so replay takes the same route."""

    llm_rate_per_s: float | None = None


def model_calls_eager(route: ModelRoute) -> bool:
    """Without a fleet rate limit nothing needs the model queue: a model call stays on the
    workflow's own queue, where the server hands it straight back to the worker that
    scheduled it (eager dispatch); with one, it waits its turn on the model queue."""
    return route.llm_rate_per_s is None


class HostMove(BaseModel):
    """Move a task waiting for a host that will never return to another host. `host` is
    that host as the hosts table has it now: the API and `refloop move` read it (a workflow
    cannot), and the workflow's validator checks it against the task."""

    host: HostInfo
    # Where the copy of the workspace is on the new host (absolute, normalised); None: at
    # the same path. Added later, optional: a move sent before it keeps the path.
    workspace: str | None = None


def refuse_move(current: str | None, workspace: str, status: str, move: HostMove,
                claims: Mapping[str, CallClaimed] | None = None) -> None:
    """Why the move cannot be made (ValueError), if it cannot: the task must wait for its
    host (nothing of it runs anywhere: no call it waits on was claimed by a host that came
    back), and the new host be another one, live, whose roots hold the workspace (at its
    new path, if the move names one)."""
    target = move.host
    if current is None:
        raise ValueError("the task has no host: its workspace activities run on any worker")
    started = [claim for claim in (claims or {}).values() if claim.claimed]
    if started:
        raise ValueError(
            f"host {started[0].host!r} is back and has started the call the task waited on "
            f"({started[0].activity}): it is not run again elsewhere, so the task is not "
            "moved; move it if it waits for its host again")
    if status != "waiting_for_host":
        raise ValueError(f"the task is {status}, not waiting_for_host: only a task waiting "
                         "for its host can be moved")
    if target.host_id == current:
        raise ValueError(f"the task is already on host {current!r}")
    if not target.live:
        raise ValueError(f"host {target.host_id!r} is not live")
    path = move.workspace or workspace
    if move.workspace is not None and not is_host_path(move.workspace):
        raise ValueError(f"workspace {move.workspace[:80]!r}: name an absolute, normalised "
                         "path on the new host")
    if not holds(target.roots, path):
        raise ValueError(f"host {target.host_id!r} does not hold {path} (its roots: "
                         f"{', '.join(target.roots) or 'none'})")


def is_host_path(path: str) -> bool:
    """An absolute, normalised path with no NUL: what a host's roots check takes."""
    return ("\x00" not in path and posixpath.isabs(path) and not path.startswith("//")
            and posixpath.normpath(path) == path)


def choose_host(path: str, hosts: Sequence[HostInfo], requested: str | None = None) -> str:
    """The host of a workspace: the requested one after the roots check, else the one host
    whose roots hold it, live or not (a host that is down holds its disk all the same: its
    task waits for it); none or several is a refusal naming the candidates."""
    if requested is not None:
        return check_host(requested, path, hosts).host_id
    holding = [h for h in hosts if holds(h.roots, path)]
    if len(holding) == 1:
        return holding[0].host_id
    if not holding:
        raise NoHostHolds(f"no host holds {path}; hosts: {_described(hosts)}")
    raise HostRefused(f"several hosts hold {path}: {_described(holding)}; name one with "
                      "`host`")


# A workspace call scheduled while its task waits for its host can be taken back by a move
# and scheduled on another host. So that it never runs on both, the host's worker claims it
# from the task (this update) before running it: the task refuses the claim of a call it
# took back, and refuses a move once a call is claimed. Such a call's activity id says so.
CLAIM_UPDATE = "claim_call"
CLAIM_PREFIX = "claim-"
CALL_TAKEN_BACK = "CallTakenBack"  # the error of a call whose claim was refused


def claim_id(number: int) -> str:
    """The activity id of the task's `number`th call that must be claimed before it runs."""
    return f"{CLAIM_PREFIX}{number}"


def needs_claim(activity_id: str) -> bool:
    return activity_id.startswith(CLAIM_PREFIX)


class CallClaim(BaseModel):
    """From a host's worker, before it runs the call `activity_id` of the task."""

    activity_id: str
    host: str


class CallClaimed(BaseModel):
    """A call the task scheduled while it waited for its host: where it went, whether that
    host's worker has claimed it."""

    host: str
    activity: str  # the activity's name, for messages
    claimed: bool = False


def refuse_claim(claims: Mapping[str, CallClaimed], claim: CallClaim) -> None:
    """Why the host may not run the call (ValueError), if it may not: the task took it back
    (moved to another host), it ended, or it went to another host."""
    known = claims.get(claim.activity_id)
    if known is None:
        raise ValueError(f"call {claim.activity_id[:80]!r} is not waiting for a host (taken "
                         "back by a move, or ended): it does not run")
    if known.host != claim.host:
        raise ValueError(f"call {claim.activity_id[:80]!r} went to host {known.host!r}, not "
                         f"{claim.host[:80]!r}")
