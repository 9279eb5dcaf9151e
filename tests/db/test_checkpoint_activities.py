"""The checkpoint activities on real PostgreSQL: taken on one host, restored on another
host's empty disk from the shared database alone; a restore aimed through a link or at a
checkpoint nobody stored is refused with a clear, final error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from refloop.activities.checkpoint_activities import CheckpointActivities
from refloop.contract.checkpoints import CheckpointInput, RestoreInput
from refloop.contract.errors import ToolError
from refloop.settings import Settings
from refloop.store.db import store_for
from tests.constants import TEST_DATABASE_URL


def host(tmp_path: Path, name: str) -> CheckpointActivities:
    """One host's activities: its own data dir and hints, the shared database."""
    settings = Settings(database_url=TEST_DATABASE_URL, refloop_data_dir=tmp_path / name,
                        refloop_workspace_roots=str(tmp_path))
    return CheckpointActivities(settings, store_for(TEST_DATABASE_URL))


async def test_a_workspace_checkpointed_on_one_host_is_restored_on_another(tmp_path):
    env = ActivityEnvironment()
    ws = tmp_path / "a-disk" / "ws"
    (ws / "pkg").mkdir(parents=True)
    unique = os.urandom(8).hex()
    (ws / "pkg" / "mod.py").write_text(f"token = '{unique}'\n")
    (ws / "notes.md").write_text("# notes\n")
    host_a, host_b = host(tmp_path, "a"), host(tmp_path, "b")

    first = await env.run(host_a.checkpoint, CheckpointInput(workspace=str(ws)))
    assert (first.files, first.files_read) == (2, 2) and first.new_bytes > 0
    (ws / "notes.md").write_text("# notes, step 2\n")
    second = await env.run(host_a.checkpoint, CheckpointInput(workspace=str(ws)))
    assert second.checkpoint_id != first.checkpoint_id and second.files == 2

    empty = tmp_path / "b-disk" / "ws"
    empty.mkdir(parents=True)
    restored = await env.run(host_b.restore, RestoreInput(workspace=str(empty),
                                                         checkpoint_id=first.checkpoint_id))
    assert restored.written == 2 and restored.removed == 0
    assert (empty / "pkg" / "mod.py").read_text() == f"token = '{unique}'\n"
    assert (empty / "notes.md").read_text() == "# notes\n"


async def test_a_restore_aimed_through_a_link_is_refused(tmp_path):
    env = ActivityEnvironment()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("x\n")
    activities = host(tmp_path, "a")
    taken = await env.run(activities.checkpoint, CheckpointInput(workspace=str(ws)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "link")
    with pytest.raises(ToolError, match="symbolic link"):
        await env.run(activities.restore, RestoreInput(workspace=str(tmp_path / "link"),
                                                       checkpoint_id=taken.checkpoint_id))
    assert list(elsewhere.iterdir()) == []


async def test_a_checkpoint_nobody_stored_fails_for_good_naming_it(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")
    with pytest.raises(ApplicationError, match="cannot be restored") as raised:
        await ActivityEnvironment().run(host(tmp_path, "a").restore, RestoreInput(
            workspace=str(ws), checkpoint_id="0" * 64))
    assert raised.value.non_retryable
    assert (ws / "keep.txt").read_text() == "kept\n"
