"""Red team for the cheaper start (bench/bench_sandbox.py): no program joins the command's
cgroup before bubblewrap any more, and a root worker's command takes its host uid from a
user namespace made once, not from a `setpriv` exec. Each test tries the hole that could
open: a process the group does not count, a command let go without its group, an identity
or a namespace more than the command should have.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from refloop.settings import Settings
from refloop.tools.cgroups import GROUP_DIR, accounting
from refloop.tools.os_sandbox import sandboxed_command
from tests.security.test_containment import Box, run_cmd
from tests.security.test_edges import AS_ROOT, SANDBOXED
from tests.security.test_whole_command import ACCOUNTED


@pytest.fixture
def reachable() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="refloop-ws-"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from the host's /proc."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo += [int(child) for child in handle.read().split()]
    return found


def _groups_of(pid: int) -> dict[str, str]:
    """The host's view of a live process's cgroup per controller ('' for v2); empty for
    a process that has exited (an exiting task is shown in the root group)."""
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as handle:
            if handle.read().rpartition(")")[2].split()[0] in "ZXx":
                return {}
        with open(f"/proc/{pid}/cgroup") as handle:
            rows = [line.rstrip("\n").split(":", 2) for line in handle]
        return {name: path for _, names, path in rows for name in (names.split(",") or [""])}
    return {}


@SANDBOXED
@ACCOUNTED
async def test_a_process_backgrounded_at_once_is_counted_in_the_group(reachable: Path):
    """The command's first instruction starts processes in the background: seen from the
    host, every process under bubblewrap is in the command's group already (bubblewrap
    waited for its options until the worker had put it there), and the command sees no
    group name (its cgroup namespace starts at its own group)."""
    settings = Settings(refloop_data_dir=reachable / "data")
    command = sandboxed_command(
        ["/bin/sh", "-c", "sleep 30 & cat /proc/self/cgroup; sleep 30 & wait"],
        workspace=reachable, allow_network=False, env={}, settings=settings)
    assert command.gate is not None and command.group is not None
    group = command.group.name
    counted = ("pids", "memory") if accounting().kind == "cgroup1" else ("",)
    process = subprocess.Popen(command.argv, env=command.env, pass_fds=command.pass_fds,  # noqa: ASYNC220
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/",
                               start_new_session=True)
    try:
        assert await command.admit(process.pid)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # bubblewrap, the shell, two sleeps
            alive = [groups for pid in _descendants(process.pid) if (groups := _groups_of(pid))]
            if len(alive) >= 4:
                break
            await asyncio.sleep(0.05)
        assert len(alive) >= 4, alive
        for groups in alive:
            assert all(groups[c].endswith(f"/{GROUP_DIR}/{group}") for c in counted), groups
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        command.close()  # kills what is left in the group
        out, _ = process.communicate(timeout=20)
    seen = [line.split(":", 2)[2] for line in out.decode().splitlines() if ":" in line]
    assert seen and all(path == "/" for path in seen), out


@SANDBOXED
@ACCOUNTED
def test_a_command_never_admitted_runs_nothing(reachable: Path):
    """A worker that dies after spawning bubblewrap and before admitting the command
    closes the pipe bubblewrap reads its options from, with nothing written: bubblewrap
    goes on with no mount, no namespace option and no identity, and the command's
    program is not in its empty root. Nothing runs, in or out of any group."""
    settings = Settings(refloop_data_dir=reachable / "data")
    workspace = reachable / "ws"
    workspace.mkdir()
    command = sandboxed_command(["/bin/sh", "-c", "touch ran"], workspace=workspace,
                                allow_network=False, env={}, settings=settings)
    assert command.gate is not None
    assert "/bin/sh" not in command.gate.options and "--bind-fd" not in command.argv
    process = subprocess.Popen(command.argv, env=command.env, pass_fds=command.pass_fds,  # noqa: ASYNC220
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               cwd=str(workspace), start_new_session=True)
    try:
        command.gate.close()  # the worker is gone: the pipe ends with nothing in it
        out, _ = process.communicate(timeout=20)
    finally:
        process.kill()
        command.close()
    assert process.returncode != 0, out
    assert b"execvp /bin/sh" in out, out
    assert not (workspace / "ran").exists()
    assert not (Path("/") / "ran").exists()


@SANDBOXED
@ACCOUNTED
async def test_the_options_are_handed_over_only_after_the_group_is_joined(reachable: Path):
    """bubblewrap, once spawned, waits for its options: until `admit` it has started no
    process of its own (no sandbox yet), and `admit` puts it in the group first."""
    settings = Settings(refloop_data_dir=reachable / "data")
    command = sandboxed_command(["/bin/sh", "-c", "true"], workspace=reachable,
                                allow_network=False, env={}, settings=settings)
    assert command.gate is not None and command.group is not None
    process = subprocess.Popen(command.argv, env=command.env, pass_fds=command.pass_fds,  # noqa: ASYNC220
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/",
                               start_new_session=True)
    try:
        await asyncio.sleep(0.3)  # time enough to set a sandbox up, were it not waiting
        assert _descendants(process.pid) == [process.pid]
        counted = ("pids", "memory") if accounting().kind == "cgroup1" else ("",)
        assert not any(_groups_of(process.pid)[c].endswith(command.group.name)
                       for c in counted)
        assert await command.admit(process.pid)
        assert process.wait(timeout=20) == 0, process.stdout
    finally:
        process.kill()
        command.close()


@AS_ROOT
@SANDBOXED
async def test_a_root_workers_command_has_no_group_and_no_namespace_to_make(reachable: Path):
    """A root worker's command joins a user namespace made once per identity: only the
    sandbox's id is mapped (to the unprivileged host uid), it holds no supplementary group
    of the worker's, and no user namespace can be made inside it (seccomp aside: the
    namespace's own limit is 0)."""
    box = Box(reachable)
    result = await run_cmd(box, "grep -E '^(Groups|CapEff|CapPrm)' /proc/self/status; "
                                "cat /proc/self/uid_map /proc/self/gid_map "
                                "/proc/sys/user/max_user_namespaces")
    assert result.ok, result
    fields = [line.split() for line in result.output.splitlines()[1:]]
    assert ["Groups:"] in fields, result.output
    assert ["CapPrm:", "0" * 16] in fields and ["CapEff:", "0" * 16] in fields
    uid, gid = box.settings.refloop_cmd_uid, box.settings.refloop_cmd_gid
    assert ["65534", str(uid), "1"] in fields and ["65534", str(gid), "1"] in fields
    assert ["0"] in fields, result.output  # max_user_namespaces
    assert not any(row[:2] == ["0", "0"] for row in fields), result.output  # root unmapped


@AS_ROOT
@SANDBOXED
async def test_a_credential_file_the_commands_identity_could_read_is_hidden(reachable: Path):
    """Credential files are masked only where the command's host identity could read them
    (each mask is a mount per command); a workspace whose group is the one that may read
    /etc/shadow gives the command that group, and the file is still hidden."""
    try:
        info = os.stat("/etc/shadow")
    except FileNotFoundError:
        pytest.skip("no /etc/shadow on this host")
    if not info.st_mode & 0o040 or info.st_gid == 0:
        pytest.skip("no group-readable /etc/shadow on this host")
    box = Box(reachable)
    os.chown(box.ws, 1000, info.st_gid)
    with open("/etc/shadow") as handle:  # noqa: ASYNC230 - a test's own setup
        secret = handle.readline().strip()
    result = await run_cmd(box, "cat /etc/shadow; id -g")
    assert result.ok, result
    assert secret not in result.output
    assert result.output.split()[-1] == "65534"  # the group, seen from inside
    other = reachable / "other"
    os.mkdir(other)
    plain = await run_cmd(Box(other), "cat /etc/shadow")
    assert "Permission denied" in plain.output  # by construction, no mount needed


@SANDBOXED
@ACCOUNTED
async def test_an_mcp_server_is_one_accounted_unit(tmp_path: Path):
    """A stdio MCP server (the MCP client passes no descriptor: a shell joins the group
    before bubblewrap) runs in a cgroup of its own, with the command limits, and whatever is
    left in it is killed and the group removed when the server is closed."""
    from tests.security.test_mcp_edges import ANNOTATED, activities_for, listing

    workspace = tmp_path / "ws"
    workspace.mkdir()
    # Its roots named: the default, the working directory (this checkout), holds the server.
    acts = activities_for(Settings(refloop_data_dir=tmp_path / "data",
                                   refloop_workspace_roots=str(tmp_path)), tmp_path,
                          {"annotated": ANNOTATED})
    listed = await listing(acts, workspace, "annotated")
    assert listed.tools, listed
    [connection] = acts.pool._connections.values()
    directories = list(connection.group.directories)
    procs = [(path / "cgroup.procs").read_text().split() for path in directories]
    assert directories and all(procs), procs
    await acts.pool.close()
    deadline = time.monotonic() + 10  # killed at once; a busy group is removed later
    while time.monotonic() < deadline and any(_members(path) for path in directories):  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    assert not any(_members(path) for path in directories)


def _members(group: Path) -> list[str]:
    try:
        return (group / "cgroup.procs").read_text().split()
    except FileNotFoundError:
        return []
