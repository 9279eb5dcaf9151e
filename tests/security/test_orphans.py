"""Red team: nothing a command starts outlives the worker that ran it.

The worker is a child Python process that runs `sleep M & sleep M` (M: a number unique to
the test, found in /proc) through the real run_cmd path (`sandboxed_command`,
`run_bounded`); the test kills it with SIGKILL, as an OOM kill or a crash would, so no
`close()` runs, and then no process carrying M may be left. Each sandbox path is tried: a
root worker's (`bwrap --userns`), a root worker's former profile (a workspace its commands'
uid cannot reach: `--unshare-user`), and an unprivileged worker's.

And the belt to those braces: groups a dead worker left are killed and removed when the next
worker starts (`cgroups._stale`), and a live worker's are left alone.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refloop.settings import Settings
from refloop.tools import cgroups, lifeline
from refloop.tools.cgroups import accounting
from refloop.tools.os_sandbox import sandboxed_command
from tests.security.test_edges import AS_ROOT, SANDBOXED
from tests.security.test_sandbox_cost import reachable  # noqa: F401 - a fixture
from tests.security.test_whole_command import ACCOUNTED

ROOT = Path(__file__).resolve().parents[2]
# The worker: runs one command as run_cmd does, says what its sandbox is, then waits.
WORKER = r"""
import asyncio, json, sys
from pathlib import Path
from refloop.settings import Settings
from refloop.tools.command import run_bounded
from refloop.tools.os_sandbox import sandboxed_command

async def main():
    marker, workspace, data = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    command = sandboxed_command(["/bin/sh", "-c", f"sleep {marker} & sleep {marker}"],
                                workspace=workspace, allow_network=False, env={},
                                settings=Settings(refloop_data_dir=data))
    print(json.dumps({"profile": command.profile(), "group": command.group is not None}),
          flush=True)
    await run_bounded(command.argv, cwd="/", env=command.env, preexec_fn=None, limit_s=120,
                      cap=1000, pass_fds=command.pass_fds, started=command.admit)

asyncio.run(main())
"""
STARTUP_S = 60  # a loaded machine (load 15 on 2 cores) takes seconds to start a worker
GONE_S = 5


def _marker() -> str:
    return str(800_000_000 + secrets.randbelow(99_999_999))


def _running(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
            except OSError:
                continue
            if argv[:1] in ([b"sleep"], [b"/bin/sleep"], [b"/usr/bin/sleep"]) and \
                    marker.encode() in argv:
                found.append(int(name))
    return found


def _kill_worker_and_check(workspace: Path, data: Path, prefix: list[str]) -> dict:
    """Starts the worker (`prefix`: how, e.g. as another uid), waits for both sleeps, kills
    the worker with SIGKILL and asserts that no sleep is left within GONE_S. Returns what
    the worker said of its sandbox."""
    marker = _marker()
    worker = subprocess.Popen([*prefix, sys.executable, "-c", WORKER, marker, str(workspace),
                               str(data)], cwd=ROOT, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert worker.stdout is not None
        said = json.loads(worker.stdout.readline() or b"{}")
        deadline = time.monotonic() + STARTUP_S
        while len(_running(marker)) < 2 and time.monotonic() < deadline \
                and worker.poll() is None:
            time.sleep(0.05)
        assert len(_running(marker)) == 2, f"the command never ran: {said}"
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        deadline = time.monotonic() + GONE_S
        while _running(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _running(marker)
        assert not left, f"the command outlived its worker: {left} ({said})"
    finally:
        worker.kill()
        worker.wait()
        for pid in _running(marker):  # never leave them to the next test
            os.kill(pid, signal.SIGKILL)
    return said


@AS_ROOT
@SANDBOXED
def test_a_root_workers_command_dies_with_the_worker(reachable: Path):  # noqa: F811
    """The --userns path, where bubblewrap's --die-with-parent does not hold: the worker's
    pid namespace takes the command with it."""
    workspace = reachable / "ws"
    workspace.mkdir()
    said = _kill_worker_and_check(workspace, reachable / "data", [])
    assert "--userns" in said["profile"], said


@AS_ROOT
@SANDBOXED
def test_a_root_workers_former_profile_dies_with_the_worker(tmp_path: Path):
    """A workspace the commands' uid cannot reach (pytest's private tmp_path): the former
    profile (--unshare-user, no --userns) dies with the worker too."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    said = _kill_worker_and_check(workspace, tmp_path / "data", [])
    assert "--userns" not in said["profile"] and "--unshare-user" in said["profile"], said


@AS_ROOT
@SANDBOXED
def test_an_unprivileged_workers_command_dies_with_the_worker(reachable: Path):  # noqa: F811
    """A worker that is not root (run here as nobody): no pid namespace of its own, and
    bubblewrap's --die-with-parent holds."""
    if not os.stat(ROOT).st_mode & 0o005:
        pytest.skip("this checkout is not readable by another uid")
    workspace, data = reachable / "ws", reachable / "data"
    for path in (workspace, data):
        path.mkdir()
        os.chown(path, 65534, 65534)
    said = _kill_worker_and_check(workspace, data, ["setpriv", "--reuid=65534",
                                                    "--regid=65534", "--clear-groups"])
    assert "--unshare-user" in said["profile"], said


@AS_ROOT
@SANDBOXED
def test_a_reaper_that_is_gone_is_started_anew_and_told_every_namespace(
        reachable: Path):  # noqa: F811
    """The reaper killed while the worker lives (by root: no command can): the next command
    starts a new one, which knows the namespaces of the commands already running and kills
    them once its lifeline ends."""
    workspace = reachable / "ws"
    workspace.mkdir()
    settings = Settings(refloop_data_dir=reachable / "data")
    marker = _marker()
    command = sandboxed_command(["/bin/sh", "-c", f"sleep {marker} & sleep {marker}"],
                                workspace=workspace, allow_network=False, env={},
                                settings=settings)
    assert "--userns" in command.profile()
    process = subprocess.Popen(command.argv, env=command.env, pass_fds=command.pass_fds,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd="/", start_new_session=True)
    try:
        assert command.admit_blocking(process.pid)
        deadline = time.monotonic() + STARTUP_S
        while len(_running(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_running(marker)) == 2
        first = lifeline._state.reaper
        assert first is not None
        signal.pidfd_send_signal(first.pidfd, signal.SIGKILL)
        while not lifeline._ended(first.pidfd):
            time.sleep(0.01)
        sandboxed_command(["true"], workspace=workspace, allow_network=False, env={},
                          settings=settings).close()
        second = lifeline._state.reaper
        assert second is not None and second is not first
        os.close(second.lifeline)  # as the worker's death would
        lifeline._state.reaper = None  # the next command starts a third
        deadline = time.monotonic() + GONE_S
        while _running(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(marker)
        # Done once no process is left in those namespaces: this test's own process goes on
        # using them, which a dead worker never would.
        while not lifeline._ended(second.pidfd) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lifeline._ended(second.pidfd)
        os.close(second.pidfd)
    finally:
        command.close()
        process.kill()
        process.wait()
        for pid in _running(marker):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- groups of a dead worker


def _group(name: str) -> tuple[list[Path], subprocess.Popen]:
    """A command group named `name` in every hierarchy, holding a sleep."""
    paths = []
    for parent in accounting().parents:
        (parent / name).mkdir()
        paths.append(parent / name)
    process = subprocess.Popen(["sleep", _marker()], start_new_session=True)
    for path in paths:
        (path / "cgroup.procs").write_text(str(process.pid))
    return paths, process


@SANDBOXED
@ACCOUNTED
def test_groups_of_a_dead_worker_are_killed_and_removed_and_a_live_workers_kept():
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names a worker that is dead
    dead_paths, orphan = _group(f"cmd-{gone.pid}-{secrets.token_hex(6)}")
    live_paths, kept = _group(f"cmd-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        for parent in accounting().parents:
            cgroups._stale(parent, accounting().kind)
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        assert not any(path.exists() for path in dead_paths)
        assert kept.poll() is None and all(path.exists() for path in live_paths)
    finally:
        for process in (orphan, kept):
            process.kill()
            process.wait()
        for path in dead_paths + live_paths:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
