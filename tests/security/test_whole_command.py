"""Red team, round four: what the limits counted per process instead of per command, the
identity a root worker's command shared with the host, and git features a repository could
still turn on. Each test is the attack, run through the real tool activity or the real
`refloop review` git call, as a prompt-injected model or a hostile repository would.

Root findings skip with their reason when the suite is not root; the accounting ones when
this worker may make no cgroup (an unprivileged worker without a delegated subtree).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.tasks import review_request
from refloop.activities.tool_activities import ToolActivities
from refloop.settings import Settings
from refloop.tools import os_sandbox
from refloop.tools.cgroups import accounting
from refloop.tools.safe_git import GitError, allowed_config, git_diff
from tests.security.test_containment import SECRET, Box, run_cmd
from tests.security.test_edges import AS_ROOT, SANDBOXED, git

ACCOUNTED = pytest.mark.skipif(accounting().kind == "none", reason="this worker may make no "
                               f"cgroup: {accounting().reason}")
MIB = 1024 * 1024
# How much more than the command's own limit the host's available memory may fall while it
# runs: the sandbox's own processes, page cache, and the other users of a shared machine.
MARGIN_MB = 300


@pytest.fixture
def reachable(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory every uid may traverse, as a deployment's workspace root is
    (pytest's own is private to its user, which keeps a root worker's former profile)."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    top = Path(tempfile.mkdtemp(prefix="refloop-ws-"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def available_mb(output: str) -> list[int]:
    return [int(line.split()[1]) // 1024 for line in output.splitlines()
            if line.startswith("MemAvailable:")]


# ---------------------------------------------------------------- 1. memory in tmpfs


@SANDBOXED
async def test_private_tmpfs_cannot_take_the_hosts_memory(tmp_path: Path):
    """3 x 200 MB to /dev/shm and 2 x 200 MB to /tmp under a 256 MB limit: at most the limit
    is held (the files are full, or the group's OOM killer stepped in), and the host's
    available memory, read by the command while it holds what it wrote, fell by at most the
    limit plus MARGIN_MB."""
    box = Box(tmp_path, refloop_cmd_memory_mb=256)
    fill = (f"cd /dev/shm; for i in 0 1 2; do head -c {200 * MIB} /dev/zero > f$i; done; "
            f"cd /tmp; for i in 3 4; do head -c {200 * MIB} /dev/zero > f$i; done")
    result = await run_cmd(box, f"grep MemAvailable /proc/meminfo; {fill}; "
                                "du -sk /dev/shm /tmp; grep MemAvailable /proc/meminfo")
    held_kb = [int(line.split()[0]) for line in result.output.splitlines()
               if line.endswith(("/dev/shm", "/tmp")) and line.split()[0].isdigit()]
    assert held_kb or result.data.get("memory_limit_hit"), result
    assert sum(held_kb) <= 256 * 1024 + 64, result.output  # + du's directory blocks
    readings = available_mb(result.output)
    if len(readings) == 2:  # else the group's OOM killer ended the shell first
        assert readings[0] - readings[1] <= 256 + MARGIN_MB, result.output
    box.assert_outside_untouched()


# ---------------------------------------------------------------- 2. memory per command


@SANDBOXED
@ACCOUNTED
async def test_three_processes_share_one_memory_limit(tmp_path: Path):
    """Three processes of 150 MB each under a 256 MB limit per command: not all three can
    hold their memory at once (each alone is under the per-process limit)."""
    box = Box(tmp_path, refloop_cmd_memory_mb=256)
    box.settings = box.settings.model_copy(update={"refloop_cmd_timeout_s": 12.0})
    box.tools = ToolActivities(box.settings, box.tools.store)
    # Each holds its memory for 3 s: on a loaded machine their starts overlap all the same.
    # A slow machine may see each say `held` before the next one's memory gets it killed:
    # what cannot happen is all three holding theirs to the end.
    hog = ("python3 -c \"import time; b = b'x' * (150 << 20); print('held', flush=True); "
           "time.sleep(3); print('done', flush=True)\"")
    result = await run_cmd(box, f"grep MemAvailable /proc/meminfo; {hog} & {hog} & {hog} & "
                                "sleep 2; grep MemAvailable /proc/meminfo; wait", limit_s=16)
    assert result.output.count("done") < 3, result.output
    assert result.data.get("memory_limit_hit") is True, result
    assert "reached its memory limit of 256 MiB" in result.output
    readings = available_mb(result.output)
    if len(readings) == 2:
        assert readings[0] - readings[1] <= 256 + MARGIN_MB, result.output
    box.assert_outside_untouched()


# ---------------------------------------------------------------- 4. a root fork bomb


@AS_ROOT
@SANDBOXED
@ACCOUNTED
async def test_a_root_workers_fork_bomb_is_bounded(tmp_path: Path):
    """RLIMIT_NPROC binds no root uid; the command's pids group does: at most the limit of
    processes ever ran, counted from inside (its pid namespace is its own)."""
    box = Box(tmp_path, refloop_cmd_max_processes=40)
    bomb = ("import os, time\nforked = 0\nfor _ in range(300):\n    try:\n"
            "        if os.fork() == 0:\n            time.sleep(2)\n            os._exit(0)\n"
            "        forked += 1\n    except OSError:\n        break\nprint('forked', forked)")
    result = await run_cmd(box, f"python3 -c \"{bomb}\"")
    forked = [line for line in result.output.splitlines() if line.startswith("forked")]
    assert forked and 1 <= int(forked[0].split()[1]) < 40, result.output


# ---------------------------------------------------------------- 3. no host identity


@AS_ROOT
@SANDBOXED
async def test_a_root_workers_command_is_an_unprivileged_host_uid(reachable: Path):
    """A root-only file made after the worker started (no mask could know it) is unreadable:
    the command is uid 65534 on the host, not root seen as nobody. What it creates stays
    the worker's to read, journal and remove; what the worker writes, it can change."""
    box = Box(reachable)
    late = f"/etc/refloop-late-secret-{uuid.uuid4().hex[:8]}"
    fd = os.open(late, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, SECRET.encode())
    os.close(fd)
    try:
        result = await run_cmd(box, f"cat {late}; echo made > made.txt; id -u")
    finally:
        os.unlink(late)
    assert SECRET not in result.output and "Permission denied" in result.output
    made = box.ws / "made.txt"
    assert made.stat().st_uid == box.settings.refloop_cmd_uid
    assert made.read_text() == "made\n"
    written = await box.call("write_file", path="sub/tool.txt", content="from the tool\n")
    assert written.ok, written.error
    changed = await run_cmd(box, "echo changed >> sub/tool.txt && rm made.txt && "
                                 "cat sub/tool.txt")
    assert changed.ok and changed.output.endswith("from the tool\nchanged\n"), changed
    (box.ws / "sub" / "tool.txt").unlink()  # the worker removes what the command changed
    box.assert_outside_untouched()


@AS_ROOT
@SANDBOXED
async def test_a_workspace_of_an_ordinary_user_runs_as_that_user(reachable: Path):
    box = Box(reachable)
    os.chown(box.ws, 1000, 1000)
    os.chown(box.ws / "a.txt", 1000, 1000)
    result = await run_cmd(box, "echo x >> a.txt; echo y > b.txt")
    assert result.ok, result
    assert (box.ws / "b.txt").stat().st_uid == 1000
    assert (box.ws / "a.txt").read_text().endswith("x\n")


@AS_ROOT
def test_the_root_only_scan_is_gone_for_reachable_workspaces(reachable: Path):
    command = os_sandbox.sandboxed_command(["true"], workspace=reachable, allow_network=False,
                                           env={}, settings=Settings(
                                               refloop_data_dir=reachable / "d"))
    try:
        assert command.identity is not None and command.identity.uid == 65534
        argv = command.profile()
        masked = [argv[i + 2] for i, arg in enumerate(argv)
                  if arg == "--ro-bind" and argv[i + 1] == "/dev/null"]
        assert set(masked) <= set(os_sandbox.MASKED_FILES)
    finally:
        command.close()


# ---------------------------------------------------------------- 5, 6. git


def repository(top: Path) -> Path:
    repo = top / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "one")
    (repo / "a.txt").write_text("one\ntwo\n")
    git(repo, "commit", "-qam", "two")
    return repo


def test_a_git_file_naming_another_repository_is_refused(tmp_path: Path):
    (tmp_path / "srv").mkdir()
    other = repository(tmp_path / "srv")
    (other / "a.txt").write_text("OTHER SECRET\n")
    git(other, "commit", "-qam", "secret")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").write_text(f"gitdir: {other / '.git'}\n")
    with pytest.raises(GitError, match="the .git file points outside the repository"):
        git_diff(ws, "HEAD~1", Settings(refloop_data_dir=tmp_path / "data"))


def test_a_planted_commondir_outside_is_refused(tmp_path: Path):
    other = repository(tmp_path)
    ws = tmp_path / "ws"
    (ws / "gd").mkdir(parents=True)
    (ws / ".git").write_text("gitdir: gd\n")
    (ws / "gd" / "commondir").write_text(str(other / ".git") + "\n")
    (ws / "gd" / "HEAD").write_text("ref: refs/heads/master\n")
    with pytest.raises(GitError, match="commondir points outside the repository"):
        git_diff(ws, "HEAD~1", Settings(refloop_data_dir=tmp_path / "data"))


def plant_filter_driver(repo: Path, marker: Path, plant: str, more_config: str = "") -> Path:
    """A repository whose filter and diff drivers (in its config, an included file or its
    info/attributes) run a hook that writes to `marker`; the hook's path."""
    hook = repo / ".git" / "planted"
    hook.write_text(f"#!/bin/sh\nid -u >> {marker}\ncat\n")
    hook.chmod(0o755)
    attributes = "a.txt filter=x diff=x\n"
    if plant == "info/attributes":
        (repo / ".git" / "info").mkdir(exist_ok=True)
        (repo / ".git" / "info" / "attributes").write_text(attributes)
    else:
        (repo / ".gitattributes").write_text(attributes)
    config = repo / ".git" / "config" if plant != "include.path" else repo / ".git" / "more"
    with config.open("a") as handle:
        handle.write(f"[filter \"x\"]\n\tclean = {hook}\n\tsmudge = {hook}\n"
                     f"[diff \"x\"]\n\tcommand = {hook}\n\ttextconv = {hook}\n"
                     + more_config.format(hook=hook))
    if plant == "include.path":
        git(repo, "config", "include.path", str(config))
    return hook


@SANDBOXED
@pytest.mark.parametrize("plant", ["config", "include.path", "info/attributes"])
def test_a_repositorys_filter_driver_never_runs(tmp_path: Path, plant: str):
    repo = repository(tmp_path)
    marker = repo / "pwned"
    plant_filter_driver(repo, marker, plant)
    (repo / "a.txt").write_text("one\ntwo\nthree\n")  # a working-tree diff runs the filter
    args = argparse.Namespace(workdir=str(repo), desc="review", format="json", model=None,
                              snippet=None, file=None, git_range="HEAD~1", diff=None)
    request = review_request(args, Settings(refloop_data_dir=tmp_path / "data"))
    assert not marker.exists(), marker.read_text()
    assert "+two" in request.content and "+three" in request.content
    assert "filter" in (repo / ".git" / "config").read_text() or plant == "include.path"


def test_only_allowlisted_config_reaches_git():
    text = ("[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n"
            "\tfsmonitor = /bin/evil\n\tpager = evil\n\tworktree = /etc\n"
            "[include]\n\tpath = /etc/other\n[filter \"x\"]\n\tclean = evil\n"
            "[extensions]\n\tobjectformat = sha256\n"
            "[core \"sub\"]\n\tbare = true\n[core]\n\tbare = \"quoted\"\n")
    assert allowed_config(text) == ("[core]\n\trepositoryformatversion = 0\n"
                                    "[core]\n\tfilemode = true\n"
                                    "[extensions]\n\tobjectformat = sha256\n")


def test_a_git_symlink_is_refused(tmp_path: Path):
    other = repository(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").symlink_to(other / ".git")
    with pytest.raises(GitError, match="symbolic link"):
        git_diff(ws, "HEAD~1", Settings(refloop_data_dir=tmp_path / "data"))


# ---------------------------------------------------------------- an unprivileged worker

AS_USER = """
import asyncio, json, sys, tempfile
from pathlib import Path
from refloop.settings import Settings
from refloop.tools.cgroups import accounting
from refloop.tools.command import run_bounded
from refloop.tools.os_sandbox import sandboxed_command

ws = Path(tempfile.mkdtemp())
settings = Settings(refloop_data_dir=ws / "data", refloop_cmd_memory_mb=256)
command = sandboxed_command(["/bin/sh", "-c", sys.argv[1]], workspace=ws,
                            allow_network=False, env={}, settings=settings)
try:
    code, out, _, _ = asyncio.run(run_bounded(command.argv, cwd="/", env=command.env,
                                              preexec_fn=command.preexec_fn, limit_s=10,
                                              cap=4096, pass_fds=command.pass_fds,
                                              started=command.admit))
finally:
    command.close()
print(json.dumps({"accounting": accounting().describe(), "output": out.decode()}))
"""


@AS_ROOT
@SANDBOXED
def test_an_unprivileged_worker_without_cgroups_still_bounds_its_tmpfs(tmp_path: Path):
    """The same tmpfs attack from a worker running as an ordinary uid with no delegated
    cgroup: it says so, and /tmp plus /dev/shm still hold at most the memory limit."""
    import json
    import sys

    fill = (f"cd /dev/shm; for i in 0 1 2; do head -c {200 * MIB} /dev/zero > f$i; done; "
            f"cd /tmp; for i in 3 4; do head -c {200 * MIB} /dev/zero > f$i; done; "
            "touch /dev/planted; du -sk /dev/shm /tmp")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-c", AS_USER, fill], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).parents[2],
                          env={"PATH": os.environ["PATH"], "HOME": "/tmp"}, check=False)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    assert "per process only" in said["accounting"], said
    held_kb = [int(line.split()[0]) for line in said["output"].splitlines()
               if line.endswith(("/dev/shm", "/tmp"))]
    assert len(held_kb) == 2 and sum(held_kb) <= 256 * 1024 + 64, said["output"]
    assert "Read-only file system" in said["output"]  # /dev itself takes no file


def test_the_worker_says_how_commands_are_counted(tmp_path: Path, caplog):
    from activities.tool_activities import ToolActivities
    from refloop.store.db import store_for

    with caplog.at_level("INFO", logger="refloop"):
        ToolActivities(Settings(refloop_data_dir=tmp_path / "d"),
                       store_for(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert any(r.getMessage().startswith("command accounting: ") for r in caplog.records)
