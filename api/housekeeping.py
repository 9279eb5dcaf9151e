"""Background upkeep of the API: fresh session workspaces that stayed empty are removed.

A session started without a workspace gets a fresh directory under `<data dir>/workspaces`.
Most such sessions never write anything (a client that only probes, a test run), and their
directories used to pile up. Empty ones untouched for REFLOOP_SESSION_TTL are removed, unless
a task of theirs still runs; a later task of the session makes the directory again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from refloop.api.reconcile import OPEN_STATUSES
from refloop.runtime.workspaces import stale_empty_workspaces
from refloop.settings import Settings
from refloop.store.db import SessionRecord, Store

log = logging.getLogger("refloop.api")
MAX_SWEEP_INTERVAL_S = 300.0


def busy_workspaces(store: Store) -> set[str]:
    """Workspaces of sessions with a task that is still open."""
    sessions = {row.session_id for status in OPEN_STATUSES
                for row in store.list_tasks(status=status, limit=10_000) if row.session_id}
    found = (store.get(SessionRecord, session_id) for session_id in sessions)
    return {session.workspace for session in found if session is not None}


def sweep_empty_workspaces(settings: Settings, store: Store) -> int:
    """Remove the stale empty fresh directories now; returns how many went."""
    removed = 0
    stale = stale_empty_workspaces(settings, settings.refloop_session_ttl,
                                   busy_workspaces(store))
    for path in stale:
        with contextlib.suppress(OSError):  # written to meanwhile: rmdir refuses, kept
            path.rmdir()
            removed += 1
    if removed:
        log.info("removed %d empty session workspaces", removed)
    return removed


async def keep_house(settings: Settings, store: Store) -> None:
    """Sweep at start-up and then regularly, for as long as the API runs."""
    interval = min(MAX_SWEEP_INTERVAL_S, max(settings.refloop_session_ttl / 2, 1.0))
    while True:
        try:
            await asyncio.to_thread(sweep_empty_workspaces, settings, store)
        except Exception:  # upkeep: logged, never fatal
            log.exception("sweeping empty session workspaces failed")
        await asyncio.sleep(interval)
