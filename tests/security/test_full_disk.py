"""Red team, round four (8): a workspace whose disk is full, by bytes or by inodes, with the
worker's data dir (journal, SQLite store) on the same small file system, as the default
data dir inside a workspace would be. A command fills it; the next tool calls say why they
failed, lose nothing, and the store and the journal work again once space is back.

The file system is a small tmpfs mounted for the test (root only: mounting needs it)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from refloop.activities.tool_activities import ToolActivities
from refloop.contract.activity_io import RunToolInput, ToolResult
from refloop.settings import Settings
from refloop.store.db import store_for
from tests.security.test_edges import SANDBOXED

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="mounting the small file system these "
                             "tests fill needs root")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs with 200 inodes, unmounted afterwards (the host keeps nothing)."""
    point = tmp_path / "disk"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=200,mode=0755",
                    "refloop-test", str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


class Worker:
    def __init__(self, disk: Path) -> None:
        self.ws = disk / "ws"
        self.ws.mkdir()
        (self.ws / "a.txt").write_text("one\n")
        self.settings = Settings(refloop_data_dir=disk / "data", refloop_cmd_timeout_s=10)
        self.store = store_for(f"sqlite:///{disk / 'data' / 'store.sqlite'}")
        self.tools = ToolActivities(self.settings, self.store)

    async def call(self, tool: str, **arguments) -> ToolResult:
        return await ActivityEnvironment().run(self.tools.run, RunToolInput(
            call_id=uuid.uuid4().hex, name=tool, arguments=arguments, workspace=str(self.ws),
            allow_network=False, allow_shell_operators=True))


@AS_ROOT
@SANDBOXED
@pytest.mark.parametrize("filler", [
    "head -c 8000000 /dev/zero > fill",                      # bytes
    "mkdir many; cd many; i=0; while touch f$i; do i=$((i+1)); done",  # inodes
])
async def test_a_full_workspace_disk_fails_calls_clearly_and_loses_nothing(
        small_disk: Path, filler: str):
    worker = Worker(small_disk)
    (small_disk / "data").mkdir(exist_ok=True)
    ref = worker.store.put_blob("before the disk filled")
    filled = await worker.call("run_cmd", command=filler)
    assert "No space left on device" in filled.output, filled
    # A write: a clear error naming the cause, the file as it was.
    written = await worker.call("write_file", path="a.txt", content="two\n")
    assert not written.ok and "No space left on device" in written.error, written
    assert (worker.ws / "a.txt").read_text() == "one\n"
    made = await worker.call("write_file", path="new.txt", content="x\n")
    assert not made.ok and "No space left on device" in made.error, made
    assert not (worker.ws / "new.txt").exists()
    # Reads still answer; so does the store.
    read = await worker.call("read_file", path="a.txt")
    assert read.ok and "one" in read.output
    assert worker.store.get_blob(ref) == "before the disk filled"
    try:  # a store write may fail while the disk is full, but says so
        worker.store.put_blob("during " + "x" * 200_000)
    except Exception as err:  # noqa: BLE001 - whichever layer refuses, the cause is named
        assert "full" in str(err).lower() or "no space" in str(err).lower(), err
    # Space back: the same calls work, and the journal can undo them.
    freed = await worker.call("run_cmd", command="rm -rf fill many")
    assert freed.ok, freed
    again = await worker.call("write_file", path="a.txt", content="two\n")
    assert again.ok, again.error
    assert (worker.ws / "a.txt").read_text() == "two\n"
    assert worker.store.get_blob(worker.store.put_blob("after")) == "after"
    assert not any(name.endswith(".refloop-tmp") for name in os.listdir(worker.ws))
