"""Handing a running task over to a new build of the workers (the upgrade story,
`docs/operations.md`): the old build continues each run as new, parked; a worker of another
build takes it over and goes on from the carried state, never replaying the old code's
commands."""

from __future__ import annotations

from pydantic import BaseModel, Field

# The update `refloop drain` (or `temporal workflow update execute --name hand_over`) sends
# every running task; the signal a worker of a new build sends each parked one.
HAND_OVER_UPDATE = "hand_over"
TAKE_OVER_SIGNAL = "take_over"
# The status of a parked run, until a worker of another build takes it over.
HANDED_OVER = "handed_over"


class HandOverRequest(BaseModel):
    """Continue as new at the next safe point, parked for a worker of a build other than
    `build` (the build being retired)."""

    build: str = Field(min_length=1, max_length=128)


class HandedOver(BaseModel):
    """In a parked run's input: the build that handed it over, and when."""

    from_build: str
    at: str


class TakeOver(BaseModel):
    """From a worker of `build`: go on. Ignored by a run its own build handed over."""

    build: str = Field(min_length=1, max_length=128)
