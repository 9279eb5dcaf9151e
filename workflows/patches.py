"""Patches of the workflows: the exception, not the way code changes reach running tasks.

A change to workflow code reaches running tasks by a hand-over (`docs/operations.md`,
"Upgrading with tasks in flight"): before the old workers stop, every running task is asked
to continue as new at its next safe point, so the new code starts each of them on a fresh
history from its typed state and never replays the old code's commands. A patch
(`workflow.patched`) is kept only for a change that must reach a run that cannot be handed
over; it is listed here with its reason and the date it goes, and a unit test fails once
that date has passed (tests/unit/workflows/test_patches.py).

Baseline 2026-12-07: no patch. Histories recorded before it do not replay on this code.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    patch_id: str
    reason: str
    remove_by: datetime.date


# patch id -> why it is still needed and when it goes
PATCHES: dict[str, Patch] = {}
