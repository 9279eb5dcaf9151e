"""Workspace checkpoints as activities see them: take one on the task's host, restore one
on any host (the content is in the shared store)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from refloop.contract.lean import LeanModel
from refloop.contract.messages import Plan

# A checkpoint id: the sha256 of its manifest.
CHECKPOINT_ID = r"^[0-9a-f]{64}$"


class CheckpointInput(BaseModel):
    workspace: str
    task_id: str = ""  # with call_id, where the checkpoint is listed (task_checkpoints)
    call_id: str = ""  # the call after which it was taken


class CheckpointResult(BaseModel):
    checkpoint_id: str = Field(pattern=CHECKPOINT_ID)
    files: int
    files_read: int  # the rest were unchanged since this host's previous checkpoint
    new_bytes: int  # content this checkpoint added to the store
    left_out: int  # paths not kept (ignored, too large, special files, odd names)
    seconds: float
    # Added with per-directory tree objects (optional: results recorded before it): the
    # bytes of tree objects this checkpoint added (the directories on the changed paths)
    manifest_bytes: int = 0


class CheckpointAfter(LeanModel):
    """In a built-in tool call's input: the activity checkpoints the workspace itself after
    the call (on the same host, one activity and one workflow task fewer a change). The
    workflow's rule (`workflows.logic.checkpoint_after`) as it applies to this call: a
    successful call is checkpointed; a failed one only if it may still have changed the
    workspace (a command), since a failed edit changed nothing."""

    task_id: str  # with the call's id, where it is listed (task_checkpoints)
    failed_too: bool = False


class CheckpointTaken(LeanModel):
    """In the tool's result: the checkpoint after the call, or why none could be taken
    (the call's effect stands; the workflow takes it again before its next call)."""

    checkpoint_id: str | None = Field(default=None, pattern=CHECKPOINT_ID)
    error: str | None = None


class RestoreInput(BaseModel):
    workspace: str
    checkpoint_id: str = Field(pattern=CHECKPOINT_ID)
    # A move to a host that never had the workspace: the directory is made, under that
    # host's roots only
    create: bool = False
    # A fork's new workspace: refused unless the directory is new or empty, so a fork never
    # overwrites files it did not make (added later: False, as before)
    fresh: bool = False
    # A rewind: the edit journal's entries of the calls it takes back, dropped once the
    # tree is restored (an undo after the rewind never undoes a call that is gone)
    discard_calls: list[str] = Field(default_factory=list)


class RestoreResult(BaseModel):
    written: int
    removed: int
    unchanged: int
    seconds: float


# A running task put back to one of its run's checkpoints, inside the run (an update: the
# task validates the step, restores its workspace, conversation and progress together at
# its next safe point, and answers; refused or failed, nothing changed).
REWIND_UPDATE = "rewind"


class RewindRequest(BaseModel):
    step: int = Field(ge=1)  # the run's checkpoints, counted from 1 as `refloop rewind` does


class Rewound(BaseModel):
    """What a rewind did: the step and checkpoint it went back to, the call after which
    that checkpoint was taken, and the calls it took back (their cost stays in the ledger,
    counted apart as rewound)."""

    step: int
    checkpoint_id: str
    call_id: str
    calls_taken_back: int
    rewound_tokens: int
    restored: RestoreResult


class ForkOrigin(BaseModel):
    """Where a forked task comes from: step `step` of task `task_id`. Its workspace is put
    back to that step's checkpoint before anything else; its plan, progress and conversation
    up to that step come with it."""

    task_id: str = Field(min_length=1, max_length=200)
    step: int = Field(ge=1)
    checkpoint_id: str = Field(pattern=CHECKPOINT_ID)
    # The carried conversation (blob store), its system prompt naming the new workspace and
    # the new instruction, if any, as its last user turn
    conversation_ref: str | None = None
    plan: Plan | None = None
    completed_steps: list[int] = Field(default_factory=list)
    # Successful workspace changes up to the step (each one took a checkpoint): they count
    # as the fork's own for an honest outcome
    changes: int = Field(default=0, ge=0)
    instruction: str | None = None


# The original task told that a fork was taken from it (when it still runs: a closed run
# takes no event; the link is then in the fork's input and the task view).
FORK_TAKEN_SIGNAL = "fork_taken"


class ForkTaken(BaseModel):
    task_id: str  # the fork
    step: int = Field(ge=1)
