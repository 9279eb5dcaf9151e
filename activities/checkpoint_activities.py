"""Workspace checkpoints on the task's host: thin adapters over `refloop.checkpoints`.

The workspace is opened pinned and with no link followed (as every tool opens it), the
content goes to the shared store, and this host keeps the stat hints of its last
checkpoint of each workspace, so the next one reads only what changed.

A built-in tool call that may change the workspace takes its checkpoint in its own activity
(`after_call`, from `ToolActivities`): the activity below is for the rest (MCP calls, a
checkpoint taken again after one failed, a call whose activity could not take it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import OrderedDict
from typing import ClassVar

from temporalio.exceptions import ApplicationError

from refloop.activities.defn import implements
from refloop.activities.heartbeat import heartbeating
from refloop.checkpoints.manifest import ManifestError
from refloop.checkpoints.objects import ObjectStore
from refloop.checkpoints.restore import (
    BadManifest,
    NotFresh,
    NotUnderRoots,
    make_directory_under,
    refuse_unless_fresh,
    restore_checkpoint,
)
from refloop.checkpoints.snapshot import WalkState, load_manifest, take_checkpoint
from refloop.checkpoints.stores import object_store_for
from refloop.contract import activity_calls
from refloop.contract.checkpoints import (
    CheckpointAfter,
    CheckpointInput,
    CheckpointResult,
    CheckpointTaken,
    RestoreInput,
    RestoreResult,
)
from refloop.runtime.workspaces import workspace_roots
from refloop.settings import Settings
from refloop.store.db import Store, TaskCheckpointRecord
from refloop.tools.journal import Journal
from refloop.tools.pinning import open_workspace

log = logging.getLogger("refloop.checkpoints")

# Workspaces whose last walk (stat hints and tree objects) this host keeps.
HINTED_WORKSPACES = 64


# What a checkpoint's failure says in the task's events (the worker's log has the rest).
FAILURE_CHARS = 300


class _Hints:
    """The last checkpoint taken of each workspace on this host, least recent forgotten."""

    # One per host (its id and data directory) in a process: the tool activities and the
    # checkpoint activities of a worker share it.
    _of_host: ClassVar[dict[tuple[str, str], _Hints]] = {}
    _of_host_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.last: OrderedDict[str, WalkState] = OrderedDict()
        self.lock = threading.Lock()

    @classmethod
    def of_host(cls, settings: Settings) -> _Hints:
        key = (settings.refloop_host_id, str(settings.refloop_data_dir))
        with cls._of_host_lock:
            return cls._of_host.setdefault(key, cls())

    def get(self, workspace: str) -> WalkState | None:
        with self.lock:
            return self.last.get(workspace)

    def put(self, workspace: str, state: WalkState) -> None:
        with self.lock:
            self.last[workspace] = state
            self.last.move_to_end(workspace)
            while len(self.last) > HINTED_WORKSPACES:
                self.last.popitem(last=False)

    def forget(self, workspace: str) -> WalkState | None:
        with self.lock:
            return self.last.pop(workspace, None)


class CheckpointActivities:
    def __init__(self, settings: Settings, store: Store,
                 objects: ObjectStore | None = None) -> None:
        self.store = store
        self.host = settings.refloop_host_id
        self.roots = workspace_roots(settings)
        self.max_file_bytes = settings.refloop_checkpoint_file_mb * 1024 * 1024
        self.objects = objects or object_store_for(settings, store.engine)
        self.hints = _Hints.of_host(settings)
        self.journal_dir = settings.journal_dir

    def _checkpoint(self, inp: CheckpointInput,
                    deadline: float | None = None) -> CheckpointResult:
        root, fd = open_workspace(inp.workspace)
        try:
            snap = take_checkpoint(fd, self.objects, self.hints.get(str(root)),
                                   self.max_file_bytes, deadline=deadline)
        finally:
            os.close(fd)
        self.hints.put(str(root), snap.state)
        if inp.task_id and inp.call_id:
            self.store.record_checkpoint(TaskCheckpointRecord(
                task_id=inp.task_id, call_id=inp.call_id, checkpoint_id=snap.checkpoint_id,
                host=self.host, files=snap.stats.files, new_bytes=snap.stats.new_bytes))
        return CheckpointResult(
            checkpoint_id=snap.checkpoint_id, files=snap.stats.files,
            files_read=snap.stats.files_read, new_bytes=snap.stats.new_bytes,
            left_out=snap.state.left_out_count, manifest_bytes=snap.stats.new_tree_bytes,
            seconds=round(snap.stats.seconds, 3))

    def _restore(self, inp: RestoreInput) -> RestoreResult:
        try:
            manifest = load_manifest(self.objects, inp.checkpoint_id)
        except (KeyError, ValueError, ManifestError) as err:
            raise ApplicationError(f"checkpoint {inp.checkpoint_id[:12]} cannot be restored: "
                                   f"{err}", type="CheckpointMissing",
                                   non_retryable=True) from None
        if inp.create:
            try:
                make_directory_under(inp.workspace, self.roots)
            except NotUnderRoots as err:
                raise ApplicationError(f"the workspace cannot be made here: {err}",
                                       type="CheckpointMissing", non_retryable=True) from None
        root, fd = open_workspace(inp.workspace)
        try:
            previous = self.hints.forget(str(root))
            if inp.fresh:
                refuse_unless_fresh(fd, manifest)
            stats = restore_checkpoint(fd, self.objects, manifest, previous)
        except NotFresh as err:
            raise ApplicationError(str(err), type="WorkspaceNotEmpty",
                                   non_retryable=True) from None
        except BadManifest as err:
            raise ApplicationError(str(err), type="CheckpointMissing",
                                   non_retryable=True) from None
        finally:
            os.close(fd)
        if inp.discard_calls:  # the journal lives on this host, beside the workspace
            Journal(root, self.journal_dir, inp.discard_calls[0]).discard(
                inp.discard_calls)
        return RestoreResult(written=stats.written, removed=stats.removed,
                             unchanged=stats.unchanged, seconds=round(stats.seconds, 3))

    async def take(self, inp: CheckpointInput,
                   deadline: float | None = None) -> CheckpointResult:
        """A checkpoint of the workspace (the caller heartbeats). Fails with an OSError or
        an ApplicationError whose message is fit for the task's events."""
        try:
            return await asyncio.to_thread(self._checkpoint, inp, deadline)
        except (OSError, ApplicationError):
            raise
        except Exception as err:
            # A store's own message may quote the statement and the file's bytes: the
            # task's events get its kind, the worker log the rest.
            log.warning("checkpoint of %s failed: %s", inp.workspace, err)
            raise ApplicationError(
                f"the checkpoint store failed ({type(err).__name__}); the worker's log "
                "has the details", type="CheckpointStoreFailed") from None

    @implements(activity_calls.CHECKPOINT_WORKSPACE)
    async def checkpoint(self, inp: CheckpointInput) -> CheckpointResult:
        async with heartbeating():  # the first checkpoint of a large tree takes a while
            return await self.take(inp)

    async def after_call(self, workspace: str, call_id: str, after: CheckpointAfter,
                         deadline: float | None = None) -> CheckpointTaken:
        """Inside a tool call's activity, once the tool ran: the checkpoint, or why there is
        none. Never raises: the call's effect happened whatever becomes of its checkpoint
        (the workflow takes a failed one again with the activity above)."""
        try:
            taken = await self.take(CheckpointInput(workspace=workspace, task_id=after.task_id,
                                                    call_id=call_id), deadline)
        except ApplicationError as err:
            why = f"{err.type}: {err.message}" if err.type else err.message
        except Exception as err:  # an OSError, the walk out of time: as an activity says it
            why = f"{type(err).__name__}: {err}"
        else:
            return CheckpointTaken(checkpoint_id=taken.checkpoint_id)
        log.warning("checkpoint after call %s failed: %s", call_id, why)
        return CheckpointTaken(error=why[:FAILURE_CHARS])

    @implements(activity_calls.RESTORE_WORKSPACE)
    async def restore(self, inp: RestoreInput) -> RestoreResult:
        async with heartbeating():
            return await asyncio.to_thread(self._restore, inp)
