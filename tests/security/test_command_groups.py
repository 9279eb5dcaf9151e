"""Red team for the reused command groups (refloop/tools/cgroups.py, `_pool`): a group
serves the worker's next command only when its command left nothing in it. Each test tries
to carry something from one command into the next one's group: a process still running, a
memory limit that killed, a limit of another size.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

from refloop.settings import Settings
from refloop.tools.cgroups import accounting
from refloop.tools.command import run_bounded
from refloop.tools.os_sandbox import sandboxed_command
from tests.security.test_edges import SANDBOXED
from tests.security.test_whole_command import ACCOUNTED

MIB = 1024 * 1024


async def run(workspace: Path, script: str, limit_s: float = 20, **settings
              ) -> tuple[int | None, str, Path, bool]:
    """(exit code, output, the command's memory group directory, whether its memory limit
    killed) of `sh -c script` run as run_cmd runs it."""
    command = sandboxed_command(["/bin/sh", "-c", script], workspace=workspace,
                                allow_network=False, env={},
                                settings=Settings(refloop_data_dir=workspace / "data",
                                                  **settings))
    assert command.group is not None and command.gate is not None
    directory = command.group.directories[0]
    try:
        code, out, _, _ = await run_bounded(command.argv, cwd="/", env=command.env,
                                            preexec_fn=None, limit_s=limit_s, cap=100_000,
                                            pass_fds=command.pass_fds, started=command.admit)
        oom = command.oom_killed()
    finally:
        command.close()
    return code, out.decode(errors="replace"), directory, oom


def limits_of(directory: Path) -> tuple[int, int]:
    """(memory, processes) limits of a group as the kernel holds them."""
    memory = "memory.max" if accounting().kind == "cgroup2" else "memory.limit_in_bytes"
    pids = directory if accounting().kind == "cgroup2" else Path(
        str(directory).replace(str(accounting().parents[0]), str(accounting().parents[1])))
    return int((directory / memory).read_text()), int((pids / "pids.max").read_text())


def gone(directory: Path, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not directory.exists():
            return True
        time.sleep(0.1)
    return False


@SANDBOXED
@ACCOUNTED
async def test_an_empty_group_serves_the_next_command_with_its_own_limits(tmp_path: Path):
    """A command that ended cleanly hands its group on; the next command, with other
    limits, finds them written, and runs alone in it."""
    code, _, first, _ = await run(tmp_path, "true", refloop_cmd_memory_mb=256,
                                  refloop_cmd_max_processes=64)
    assert code == 0
    code, out, second, oom = await run(
        tmp_path, "cat /sys/fs/cgroup/pids/pids.current 2>/dev/null; echo ran",
        refloop_cmd_memory_mb=512, refloop_cmd_max_processes=128)
    assert code == 0 and "ran" in out and not oom
    assert second == first  # the same group, reused
    assert limits_of(second) == (512 * MIB, 128)
    code, _, third, _ = await run(tmp_path, "true", refloop_cmd_memory_mb=256,
                                  refloop_cmd_max_processes=64)
    assert third == first and limits_of(third) == (256 * MIB, 64)  # lowered again


@SANDBOXED
@ACCOUNTED
async def test_a_group_with_a_process_left_is_never_reused(tmp_path: Path):
    """A command closed while a process of it still runs (its spawner gave up on it): its
    group is not handed on but killed and removed, and the next command gets another."""
    marker = f"9{time.monotonic_ns() % 10**9:09d}"  # sleep's argument, found in /proc
    command = sandboxed_command(["/bin/sh", "-c", f"sleep {marker}"],
                                workspace=tmp_path, allow_network=False, env={},
                                settings=Settings(refloop_data_dir=tmp_path / "data"))
    assert command.group is not None
    left = command.group.directories[0]
    process = subprocess.Popen(command.argv, env=command.env, pass_fds=command.pass_fds,  # noqa: ASYNC220
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd="/", start_new_session=True)
    try:
        assert await command.admit(process.pid)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _running(marker):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        assert _running(marker)
        command.close()  # nothing killed it first
    finally:
        process.kill()
        process.wait()
    _, _, after, _ = await run(tmp_path, "true")
    assert after != left
    assert gone(left), f"{left} still there"
    assert not _running(marker)


@SANDBOXED
@ACCOUNTED
async def test_a_group_whose_limit_killed_is_never_reused(tmp_path: Path):
    """A command whose memory limit OOM-killed a process: its group is removed, so the next
    command's `memory_limit_hit` is its own word, not the last command's."""
    # Each process alone is under the per-process limit; three at once are not.
    hog = "python3 -c \"import time; b = b'x' * (100 << 20); time.sleep(3)\""
    _, out, killed, oom = await run(tmp_path, f"{hog} & {hog} & {hog} & wait",
                                    refloop_cmd_memory_mb=160)
    assert oom, out
    code, _, after, oom_after = await run(tmp_path, "true", refloop_cmd_memory_mb=160)
    assert code == 0 and not oom_after
    assert after != killed and gone(killed)


def _running(marker: str) -> list[str]:
    return [pid for pid in os.listdir("/proc") if pid.isdigit()
            and marker.encode() in _cmdline(pid)]


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""
