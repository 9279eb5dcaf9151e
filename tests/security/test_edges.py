"""Red team, round two: the edges of the sandbox. Each test is one attack from issue 29's
findings, run as a prompt-injected model or a hostile repository would, through the real
tool activity, the real index child process and the real `refloop review` git call.

The root findings (1) need the suite to run as root, as CI does: they skip otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from refloop.activities.workspace_activities import WorkspaceActivities, index_launch
from refloop.cli.tasks import review_request
from refloop.contract.activity_io import RunToolInput
from refloop.contract.task import WorkspaceInput
from refloop.search.index import scan
from refloop.search.symbols import read_source, read_source_bytes
from refloop.settings import Settings
from refloop.store.db import store_for
from refloop.tools import os_sandbox
from refloop.tools.seccomp import native_filter
from tests.security.test_containment import SECRET, Box, run_cmd


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Box:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # the worker's secrets, as deployed
    return Box(tmp_path)


AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="the root findings need the suite to "
                             "run as root (as CI does): as another user there is no root "
                             "privilege to lose")
SANDBOXED = pytest.mark.skipif(os_sandbox._bwrap_problem(
    __import__("shutil").which("bwrap") or "") != "", reason="bubblewrap cannot run here")


# ---------------------------------------------------------------- 1. a root worker


@AS_ROOT
@SANDBOXED
async def test_a_root_workers_command_is_nobody_without_capabilities(box: Box):
    result = await run_cmd(box, "id -u; id -g; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    assert result.ok, result.error
    lines = result.output.splitlines()[1:]
    assert lines[:2] == ["65534", "65534"]
    assert all(line.split()[-1] == "0000000000000000" for line in lines[2:5])


@AS_ROOT
@SANDBOXED
async def test_proc_sys_is_read_only(box: Box):
    # Writes back the value it read: harmless even if the write went through.
    before = Path("/proc/sys/kernel/printk_ratelimit").read_text()
    result = await run_cmd(box, "python3 -c \"p = '/proc/sys/kernel/printk_ratelimit'; "
                                "v = open(p).read(); open(p, 'w').write(v); print('WROTE')\"")
    assert "WROTE" not in result.output and "Read-only file system" in result.output, \
        result.output
    assert Path("/proc/sys/kernel/printk_ratelimit").read_text() == before


@AS_ROOT
@SANDBOXED
@pytest.mark.parametrize("command", [
    "cp /bin/true t && chmod u+s t", "cp /bin/true t && chmod 6755 t",
    "cp /bin/true t && chmod g+s t",
    "python3 -c \"import os; os.close(os.open('t', os.O_CREAT | os.O_WRONLY, 0o4755))\"",
    "python3 -c \"import os; open('t', 'w').close(); os.chmod('t', 0o2755)\"",
    "mknod t p && chmod u+s t",
])
async def test_no_setuid_file_survives_in_the_workspace(box: Box, command: str):
    await run_cmd(box, command)
    found = box.ws / "t"
    if found.exists():
        assert not found.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID), oct(
            found.lstat().st_mode)
    box.assert_outside_untouched()


@AS_ROOT
@SANDBOXED
async def test_root_only_host_files_are_unreadable(box: Box):
    """Files only root may read (mode 0600 and the like, e.g. /etc/default/cacerts, found on
    this host): the command's uid maps to root's, so they are hidden from it."""
    files, dirs = os_sandbox.root_only_entries()
    targets = [p for p in files if os.path.getsize(p) > 16][:8]
    if not targets and not dirs:
        pytest.skip("this host has no root-only file under the system directories")
    for path in targets:
        secret = Path(path).read_bytes()[:200].decode(errors="replace").strip().splitlines()[0]
        result = await run_cmd(box, f"cat {path}")
        assert secret not in result.output, path
    for path in dirs[:4]:
        result = await run_cmd(box, f"ls -A {path}")
        assert result.output.strip() == "exit code 0", (path, result.output)


@SANDBOXED
@pytest.mark.parametrize("probe", [
    "import ctypes; print(ctypes.CDLL(None, use_errno=True).ptrace(16, 1, 0, 0), "
    "ctypes.get_errno())",                                     # PTRACE_ATTACH
    "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.syscall(250, 0, 0, 0, 0), "
    "ctypes.get_errno())",                                     # keyctl
    "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.syscall(321, 0, 0, 0), "
    "ctypes.get_errno())",                                     # bpf
    "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.unshare(0x10000000), "
    "ctypes.get_errno())",                                     # CLONE_NEWUSER
    "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.unshare(0x20000), "
    "ctypes.get_errno())",                                     # CLONE_NEWNS
    "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.mount(b'x', b'/tmp', "
    "b'tmpfs', 0, None), ctypes.get_errno())",
    "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.syscall(313, -1, b'', 0),"
    " ctypes.get_errno())",                                    # finit_module
])
async def test_seccomp_denies_what_agents_never_need(box: Box, probe: str):
    if native_filter() is None:
        pytest.skip("no seccomp filter for this architecture")
    result = await run_cmd(box, f'python3 -c "{probe}"')
    text = result.output
    assert "-1 1" in text or "PermissionError" in text or "Operation not permitted" in text, \
        text


# ---------------------------------------------------------------- 2. a swapped workspace


def victim_call(victim: Path, tool: str, **arguments) -> RunToolInput:
    return RunToolInput(call_id=uuid.uuid4().hex, name=tool, arguments=arguments,
                        workspace=str(victim), allow_shell_operators=True)


@pytest.mark.parametrize("pinned_first", [True, False])
async def test_a_sibling_swapping_the_workspace_for_a_link_gets_nowhere(
        box: Box, pinned_first: bool):
    victim = box.ws / "victim"  # task B's workspace, inside task A's
    victim.mkdir()
    (victim / "mine.txt").write_text("B's file\n")
    b = box.tools
    if pinned_first:
        assert (await ActivityEnvironment().run(b.run, victim_call(victim, "list_dir",
                                                                   path="."))).ok
    swap = await run_cmd(box, f"mv victim victim.real && ln -s {box.outside} victim")
    assert swap.ok, swap.error
    results = [await ActivityEnvironment().run(b.run, victim_call(victim, tool, **args))
               for tool, args in (("write_file", {"path": "pwned.txt", "content": "x"}),
                                  ("run_cmd", {"command": "touch pwned2.txt"}),
                                  ("list_dir", {"path": "."}),
                                  ("read_file", {"path": "probe.txt"}))]
    for result in results:
        assert not result.ok and result.error.startswith("E_WORKSPACE_MOVED"), result
    box.assert_outside_untouched()


async def test_a_directory_swapped_in_after_the_task_started_is_refused(box: Box):
    victim = box.ws / "victim"
    victim.mkdir()
    b = box.tools
    assert (await ActivityEnvironment().run(b.run, victim_call(victim, "list_dir",
                                                               path="."))).ok
    assert (await run_cmd(box, "mv victim victim.real && mkdir victim")).ok
    result = await ActivityEnvironment().run(b.run, victim_call(
        victim, "write_file", path="planted.txt", content="x"))
    assert result.error.startswith("E_WORKSPACE_MOVED")
    assert not (victim / "planted.txt").exists()


async def test_a_link_pointed_at_etc_lists_nothing(box: Box):
    victim = box.ws / "victim"
    victim.symlink_to("/etc")
    result = await ActivityEnvironment().run(box.tools.run, victim_call(victim, "list_dir",
                                                                        path="."))
    assert result.error.startswith("E_WORKSPACE_MOVED") and "passwd" not in result.output


# ---------------------------------------------------------------- 3. the indexer


def test_the_index_child_never_imports_workspace_code(tmp_path: Path):
    """A `json.py` (imported by the index module at start) planted in the workspace, with
    the worker's directory set to it, as `refloop run` in a repository has it."""
    ws, marker = tmp_path / "ws", tmp_path / "imported"
    ws.mkdir()
    for name in ("json.py", "re.py", "enum.py", "refloop.py", "sitecustomize.py"):
        (ws / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    os.environ["REFLOOP_TEST_SECRET"] = "sk-leak"
    try:
        argv, cwd, env = index_launch(ws, tmp_path / "index", "no-such-model")
    finally:
        del os.environ["REFLOOP_TEST_SECRET"]
    # As the worker spawns it, but from the workspace, the worst case for a `-m` child.
    subprocess.run(argv, cwd=ws, env=env, capture_output=True, timeout=120, check=False)
    subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=120, check=False)
    assert not marker.exists(), marker.read_text()
    assert not cwd.startswith(str(ws)) and argv[1] == "-I"
    assert "sk-leak" not in json.dumps(env) and set(env) <= set(os.environ)


def test_the_index_reads_through_no_link_and_skips_fifos(tmp_path: Path):
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "a.py").write_text("SECRET = 'outside text'\n")
    (ws / "pkg" / "a.py").write_text("x = 1\n")
    os.mkfifo(ws / "z.py")
    started = time.monotonic()
    found = {f.path: f for f in scan(ws)}
    assert time.monotonic() - started < 5 and "z.py" not in found
    # A parent directory swapped for a link between the walk and the read.
    (ws / "pkg").rename(ws / "pkg.real")
    (ws / "pkg").symlink_to(outside)
    assert read_source(ws / "pkg" / "a.py") is None
    assert read_source_bytes(ws / "pkg" / "a.py") is None


# ---------------------------------------------------------------- 4. git config


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.mark.parametrize("plant", ["diff.external", "fsmonitor", "textconv"])
def test_review_git_range_never_runs_repository_config(tmp_path: Path, plant: str):
    repo = tmp_path / "repo"
    marker = repo / "pwned"  # inside: even the sandbox would let a hook write here
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "one")
    (repo / "a.txt").write_text("one\ntwo\n")
    git(repo, "commit", "-qam", "two")
    (repo / "a.txt").write_text("one\ntwo\nthree\n")  # a working-tree change, too
    hook = repo / ".git" / "hooks" / "planted"
    hook.write_text(f"#!/bin/sh\nid -u > {marker}\nenv >> {marker}\n")
    hook.chmod(0o755)
    if plant == "diff.external":
        git(repo, "config", "diff.external", str(hook))
    elif plant == "fsmonitor":
        git(repo, "config", "core.fsmonitor", str(hook))
    else:
        (repo / ".gitattributes").write_text("*.txt diff=evil\n")
        git(repo, "config", "diff.evil.textconv", str(hook))
    args = argparse.Namespace(workdir=str(repo), desc="review", format="json", model=None,
                              snippet=None, file=None, git_range="HEAD~1", diff=None)
    request = review_request(args, Settings(refloop_data_dir=tmp_path / "data"))
    assert not marker.exists(), marker.read_text()
    assert "+two" in request.content and "+three" in request.content


# ---------------------------------------------------------------- 5. patterns


@pytest.mark.parametrize("pattern", ["a{4294967294}", "a{8000000}", "(a{1000}){1000}",
                                     "((((a{100}){100}){100}){100})", "x" * 5000])
async def test_an_over_large_pattern_is_a_quick_tool_error(box: Box, pattern: str):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    results = [await box.call("grep", pattern=pattern, path="."),
               await box.call("grep", pattern="one", path=".", glob=pattern),
               await box.call("glob_file_search", pattern=pattern)]
    assert time.monotonic() - started < 3
    for result in results:
        assert result.ok or result.error.startswith(("E_PATTERN", "E_INVALID")), result
    assert not results[0].ok or pattern == "a{4294967294}"
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100


# ---------------------------------------------------------------- 6. odd names


async def test_a_name_that_is_not_utf8_is_shown_escaped(box: Box):
    (box.ws / "sub").mkdir()
    Path(os.fsdecode(os.path.join(os.fsencode(box.ws / "sub"), b"bad\xff\xfe.txt"))
         ).write_bytes(b"one\n")
    for tool, args in (("list_dir", {"path": "sub"}), ("glob_file_search", {"pattern": "**"}),
                       ("grep", {"pattern": "one", "path": "."})):
        result = await box.call(tool, **args)
        assert result.ok, result.error
        assert "bad\\xff\\xfe.txt" in result.output, result.output
        json.dumps(result.model_dump(), ensure_ascii=False).encode("utf-8")
    ran = await run_cmd(box, "ls sub")
    ran.model_dump_json()
    # The task's start: the repo map names the workspace's files (a .py this time).
    Path(os.fsdecode(os.path.join(os.fsencode(box.ws), b"odd\xff.py"))).write_bytes(b"x = 1\n")
    workspace = WorkspaceActivities(box.settings, store_for(f"sqlite:///{box.ws.parent}/w.db"))
    described = await ActivityEnvironment().run(workspace.describe,
                                                WorkspaceInput(workspace=str(box.ws)))
    described.model_dump_json()


# ---------------------------------------------------------------- 8. cost


@SANDBOXED
def test_the_sandbox_starts_one_process_and_no_limit_helper(tmp_path: Path):
    """Where the cost went (bench/bench_sandbox.py): a reaper process and a `prlimit` exec
    per command. The profile has neither; the limits still hold (test_containment)."""
    command = os_sandbox.sandboxed_command(["/bin/sh", "-c", "true"], workspace=tmp_path,
                                           allow_network=False, env={},
                                           settings=Settings(refloop_data_dir=tmp_path / "d"))
    try:
        assert "--as-pid-1" in command.profile() and "prlimit" not in " ".join(command.argv)
        assert command.argv[-3:-1] == ["/bin/sh", "-c"] and "ulimit -t" in command.argv[-1]
    finally:
        command.close()
