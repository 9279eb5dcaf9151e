"""The checkpoint activities on real PostgreSQL: taken on one host, restored on another
host's empty disk from the shared database alone; a restore aimed through a link or at a
checkpoint nobody stored is refused with a clear, final error. A tool call asked to take its
own checkpoint returns it with its result (a retried attempt the same one), or why it
failed, and never fails for it."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from refloop.activities.checkpoint_activities import CheckpointActivities
from refloop.activities.tool_activities import ToolActivities
from refloop.contract.activity_io import RunToolInput
from refloop.contract.checkpoints import CheckpointAfter, CheckpointInput, RestoreInput
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


# ---------------------------------------------------------------- taken by the tool's call


def tool_host(tmp_path: Path) -> tuple[ToolActivities, ActivityEnvironment]:
    """The tool activities of one host (the checkpoint inside the call) and an activity
    environment that gives a call its worker's ten minutes."""
    settings = Settings(database_url=TEST_DATABASE_URL, refloop_data_dir=tmp_path / "data",
                        refloop_workspace_roots=str(tmp_path), refloop_sandbox="none")
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(minutes=10),
                                   started_time=datetime.now(UTC))
    return ToolActivities(settings, store_for(TEST_DATABASE_URL)), env


def tool_call(ws: Path, name: str, task_id: str, index: int, failed_too: bool = False,
              **arguments) -> RunToolInput:
    return RunToolInput(call_id=f"{task_id}.run.1.{index}", name=name, arguments=arguments,
                        workspace=str(ws),
                        checkpoint=CheckpointAfter(task_id=task_id, failed_too=failed_too))


async def test_a_write_comes_back_with_its_checkpoint_and_a_retried_attempt_the_same(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kept.txt").write_text("kept\n")
    tools, env = tool_host(tmp_path)
    task_id = f"t-{os.urandom(4).hex()}"
    write = tool_call(ws, "write_file", task_id, 0, path="a.txt", content="one\n")

    first = await env.run(tools.run, write)
    assert first.ok and first.checkpoint is not None and first.checkpoint.error is None
    # The attempt retried after a lost worker: the journal returns the first result, the
    # workspace is as the call left it, and so is its checkpoint (listed once)
    again = await env.run(tools.run, write)
    assert again == first
    assert (ws / "a.txt").read_text() == "one\n"
    listed = store_for(TEST_DATABASE_URL).checkpoints_of(task_id)
    assert [(row.call_id, row.checkpoint_id) for row in listed] == [
        (write.call_id, first.checkpoint.checkpoint_id)]

    # It is the workspace after the call: restored elsewhere, both files
    elsewhere = tmp_path / "b-disk"
    elsewhere.mkdir()
    await ActivityEnvironment().run(host(tmp_path, "b").restore, RestoreInput(
        workspace=str(elsewhere), checkpoint_id=first.checkpoint.checkpoint_id))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["a.txt", "kept.txt"]


async def test_a_failed_edit_takes_none_a_failed_command_does(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    tools, env = tool_host(tmp_path)
    task_id = f"t-{os.urandom(4).hex()}"
    refused = await env.run(tools.run, tool_call(ws, "write_file", task_id, 0,
                                                 path="../out.txt", content="x"))
    assert not refused.ok and refused.checkpoint is None  # it changed nothing
    failed = await env.run(tools.run, tool_call(ws, "run_cmd", task_id, 1, failed_too=True,
                                                command="touch made.txt missing/x"))
    assert not failed.ok and (ws / "made.txt").exists()
    assert failed.checkpoint is not None and failed.checkpoint.checkpoint_id
    # Without the request (checkpoints off, or an older workflow), none is taken
    plain = await env.run(tools.run, RunToolInput(call_id=f"{task_id}.run.1.2",
                                                  name="write_file", workspace=str(ws),
                                                  arguments={"path": "b.txt", "content": "b"}))
    assert plain.ok and plain.checkpoint is None
    assert len(store_for(TEST_DATABASE_URL).checkpoints_of(task_id)) == 1


async def test_a_checkpoint_that_fails_in_the_call_never_fails_the_call(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    tools, env = tool_host(tmp_path)

    def store_down(*args, **kwargs):
        raise RuntimeError("INSERT INTO checkpoint_objects VALUES ('secret file bytes')")

    monkeypatch.setattr(tools.checkpoints.objects, "missing", store_down)
    result = await env.run(tools.run, tool_call(ws, "write_file", f"t-{os.urandom(4).hex()}",
                                                0, path="a.txt", content="one\n"))
    assert result.ok and result.output.startswith("wrote a.txt")
    assert (ws / "a.txt").read_text() == "one\n"
    assert result.checkpoint is not None and result.checkpoint.checkpoint_id is None
    assert result.checkpoint.error.startswith("CheckpointStoreFailed: ")
    assert "secret" not in result.checkpoint.error  # the kind only, never the bytes


async def test_a_checkpoint_out_of_the_calls_time_stops_and_says_so(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    tools, env = tool_host(tmp_path)
    # 20 s of the call's start-to-close left: less than the margin to report its result
    env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(seconds=20))
    task_id = f"t-{os.urandom(4).hex()}"
    result = await env.run(tools.run, tool_call(ws, "write_file", task_id, 0,
                                                path="b.txt", content="b\n"))
    assert result.ok and (ws / "b.txt").exists()
    assert result.checkpoint is not None and result.checkpoint.checkpoint_id is None
    assert "CheckpointTooSlow" in (result.checkpoint.error or "")
    assert store_for(TEST_DATABASE_URL).checkpoints_of(task_id) == []
