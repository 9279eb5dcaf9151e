"""Red team: each attack a prompt-injected model or a hostile repository can make, one tool
call each, through the real tool activity (ToolActivities.run in an activity environment).

Every test asserts the outcome (refused, or ran and failed inside the sandbox), that nothing
outside the workspace changed (probe files under a temporary directory, never real system
files), that no process survived the call, and that the call returned in time.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import json
import os
import resource
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from refloop.activities.tool_activities import ToolActivities
from refloop.contract.activity_io import RunToolInput, ToolResult
from refloop.runtime.net import free_port
from refloop.settings import Settings
from refloop.store.db import store_for
from refloop.tools.cgroups import accounting

TIMEOUT_S = 3.0
SECRET = "sk-leak-" + uuid.uuid4().hex


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    # The worker's own secrets, as a real deployment sets them.
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("REFLOOP_API_TOKEN", SECRET)
    monkeypatch.setenv("DATABASE_URL", f"postgresql://refloop:{SECRET}@db/refloop")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    yield Box(tmp_path)


class Box:
    """A workspace, a probe directory beside it, and the real tool activity."""

    def __init__(self, tmp: Path, **overrides) -> None:
        self.ws = tmp / "ws"
        self.ws.mkdir()
        (self.ws / "a.txt").write_text("one\ntwo\nthree\n")
        self.outside = tmp / "outside"
        self.outside.mkdir()
        (self.outside / "probe.txt").write_text("untouched\n")
        (self.outside / "keep").mkdir()
        (self.outside / "keep" / "file.txt").write_text("keep me\n")
        self.data = tmp / "data"
        self.settings = Settings(refloop_data_dir=self.data, refloop_cmd_timeout_s=TIMEOUT_S,
                                 refloop_max_write_bytes=1024 * 1024, **overrides)
        self.tools = ToolActivities(self.settings, store_for(f"sqlite:///{tmp / 'db.sqlite'}"))
        self.before = self.state()

    def state(self) -> dict[str, str]:
        """Every entry under the probe directory, with its content digest."""
        found = {}
        for folder, dirs, files in os.walk(self.outside):
            for name in dirs + files:
                path = Path(folder, name)
                found[str(path)] = ("link" if path.is_symlink() else "dir" if path.is_dir()
                                    else hashlib.sha256(path.read_bytes()).hexdigest())
        return found

    async def call(self, tool: str, allow_network: bool = False, shell: bool = True,
                   call_id: str | None = None, limit_s: float = TIMEOUT_S + 2,
                   **arguments) -> ToolResult:
        inp = RunToolInput(call_id=call_id or uuid.uuid4().hex, name=tool, arguments=arguments,
                           workspace=str(self.ws), allow_network=allow_network,
                           allow_shell_operators=shell)
        started = time.monotonic()
        result = await ActivityEnvironment().run(self.tools.run, inp)
        assert time.monotonic() - started < limit_s, "the call outlived its timeout"
        if tool == "run_cmd" and result.data.get("sandboxed"):
            await self.assert_sandbox_gone()
        return result

    async def assert_sandbox_gone(self) -> None:
        """bubblewrap's own processes carry the workspace in their command line; once they
        are gone, so is the pid namespace and every process in it."""
        marker = f"--chdir {self.ws} "
        for _ in range(20):
            if not survivors(marker):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the sandbox outlived the call: {survivors(marker)}")

    def assert_outside_untouched(self) -> None:
        assert self.state() == self.before


def survivors(marker: str) -> list[str]:
    """Processes on this machine whose command line carries `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


async def assert_gone(marker: str) -> None:
    """No process carries `marker` (the kernel tears a namespace down asynchronously)."""
    for _ in range(40):
        if not survivors(marker):
            return
        await asyncio.sleep(0.05)
    assert survivors(marker) == []


def unique_sleep() -> str:
    """A sleep with a duration no other process uses, to find it again."""
    return f"{40 + int.from_bytes(os.urandom(2), 'big') / 1000:.3f}"


async def run_cmd(box: Box, command: str, **kw) -> ToolResult:
    return await box.call("run_cmd", command=command, **kw)


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("command", [
    "cat /proc/$PPID/environ", "cat /proc/1/environ", "env", "cat /proc/*/environ",
    "grep -r sk-leak /proc/self /tmp /etc 2>/dev/null", "set",
])
async def test_no_secret_reaches_a_command(box: Box, command: str):
    result = await run_cmd(box, command)
    assert SECRET not in result.output + (result.error or "")
    assert result.data["sandboxed"] is True
    box.assert_outside_untouched()


async def test_the_host_and_refloop_state_are_not_visible(box: Box):
    (box.data / "journal").mkdir(parents=True)
    (box.data / "journal" / "entry.json").write_text("{}")
    result = await run_cmd(box, f"ls -A /root {box.data} {box.outside} /work /home; "
                                "ps -e | wc -l")
    assert "entry.json" not in result.output and "probe.txt" not in result.output
    assert "No such file" in result.output
    assert result.output.strip().splitlines()[-1].strip() in {"3", "4", "5"}  # own processes


# ---------------------------------------------------------------- network


@pytest.fixture
def http_server() -> Iterator[tuple[int, list[str]]]:
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"reached")

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], hits
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("command", [
    "python3 -c \"print(__import__('urllib.request').request.urlopen("
    "'http://127.0.0.1:{port}/py', timeout=2).read())\"",
    "c''url -s -m 2 http://127.0.0.1:{port}/curl",
    "w\\get -q -T 2 -O- http://127.0.0.1:{port}/wget",
    "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"",
])
async def test_loopback_server_stays_unreachable(box: Box, http_server, command: str):
    port, hits = http_server
    result = await run_cmd(box, command.format(port=port))
    assert not result.ok and "reached" not in result.output
    assert hits == []
    box.assert_outside_untouched()


async def test_network_when_the_task_allows_it(box: Box, http_server):
    port, hits = http_server
    result = await run_cmd(box, f"python3 -c \"print(__import__('urllib.request').request."
                                f"urlopen('http://127.0.0.1:{port}/ok', timeout=2).read())\"",
                           allow_network=True)
    assert result.ok and "reached" in result.output and hits == ["/ok"]


# ---------------------------------------------------------------- writes and deletes


WRITES = [
    "python3 -c \"open('{probe}', 'w').write('owned')\"",
    "python3 -c \"open('{new}', 'w').write('owned')\"",
    "cp a.txt {probe}", "cp a.txt {new}",
    "echo owned | tee {probe}", "echo owned | tee -a {probe}",
    "sh -c 'echo owned 1>{probe}'", "sh -c 'echo owned 2>{probe} >&2'",
    "/bin/rm -rf {keep}", "rm -f {probe}",
    "python3 -c \"__import__('shutil').rmtree('{keep}')\"",
    "python3 -c \"import os; os.rename('{probe}', 'stolen.txt')\"",
    "mv {keep} .", "ln -s {probe} link && echo owned > link",
    "touch {new}", "mkdir {new}", "chmod 000 {probe}", "truncate -s 0 {probe}",
]


@pytest.mark.parametrize("command", WRITES)
async def test_no_write_or_delete_outside_the_workspace(box: Box, command: str):
    probe, keep = box.outside / "probe.txt", box.outside / "keep"
    result = await run_cmd(box, command.format(probe=probe, keep=keep,
                                               new=box.outside / "new.txt"))
    # rm -f of a path the sandbox does not have succeeds, having removed nothing.
    assert not result.ok or "rm -" in command, result.output
    box.assert_outside_untouched()
    assert probe.read_text() == "untouched\n"


async def test_writes_inside_the_workspace_work(box: Box):
    result = await run_cmd(box, "echo made > made.txt && cp a.txt b.txt && mkdir -p d/e")
    assert result.ok and (box.ws / "made.txt").read_text() == "made\n"
    assert (box.ws / "b.txt").exists() and (box.ws / "d" / "e").is_dir()


@pytest.mark.parametrize("command", [
    "echo x > {probe}", "echo x 1>{probe}", "echo x 2>{probe}", "echo x >> {probe}",
])
async def test_redirects_out_are_refused_early(box: Box, command: str):
    result = await run_cmd(box, command.format(probe=box.outside / "probe.txt"), shell=False)
    assert not result.ok and "E_POLICY" in result.error
    box.assert_outside_untouched()


# ---------------------------------------------------------------- chaining


@pytest.mark.parametrize("command", ["ls\nrm a.txt", "ls & rm a.txt", "ls ; rm a.txt",
                                     "ls && rm a.txt", "ls $(rm a.txt)"])
async def test_chaining_is_refused_early(box: Box, command: str):
    result = await run_cmd(box, command, shell=False)
    assert not result.ok and "E_POLICY" in result.error and "one command per call" in result.error
    assert (box.ws / "a.txt").exists()


@pytest.mark.parametrize("command", ["ls\nrm a.txt", "ls & rm a.txt", "ls | sh",
                                     "cat a.txt && rm a.txt", "ls `rm a.txt`"])
async def test_allowlist_checks_every_command(tmp_path: Path, command: str):
    box = Box(tmp_path, refloop_cmd_allowlist="ls,cat")
    result = await run_cmd(box, command)
    assert not result.ok and "not in the allowlist" in result.error
    assert (box.ws / "a.txt").exists()


# ---------------------------------------------------------------- processes


@pytest.mark.parametrize("template", [
    "setsid sleep {n} &", "nohup sleep {n} > /dev/null 2>&1 &", "(sleep {n} &) ; true",
    "python3 -c \"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:"
    "\n        os.execvp('sleep', ['sleep', '{n}'])\"",
    "setsid -f sleep {n}",
])
async def test_no_process_outlives_the_call(box: Box, template: str):
    n = unique_sleep()
    result = await run_cmd(box, template.format(n=n))
    assert result.data["sandboxed"] is True
    await assert_gone(f"sleep {n}")


@pytest.mark.parametrize("template", ["setsid sleep {n}", "sleep {n}", "sleep {n} & wait",
                                      "trap '' TERM INT HUP; sleep {n}"])
async def test_the_call_returns_at_the_timeout(box: Box, template: str):
    n = unique_sleep()
    started = time.monotonic()
    result = await run_cmd(box, template.format(n=n), timeout_s=1)
    assert time.monotonic() - started < 1 + 2
    assert not result.ok and "E_TIMEOUT" in result.error
    await assert_gone(f"sleep {n}")


@pytest.mark.parametrize("command", [
    "yes", "cat /dev/zero", "yes | tr -d '\\n'",
    "python3 -c \"import sys\nwhile True: sys.stdout.write('x' * 65536)\"",
])
async def test_endless_output_is_bounded(box: Box, command: str):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await run_cmd(box, command)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert not result.ok and result.error.startswith(("E_OUTPUT_LIMIT", "E_TIMEOUT"))
    assert len(result.output) < box.settings.refloop_max_output_bytes + 200
    assert grown_mib < 50


async def test_memory_and_file_size_limits(tmp_path: Path):
    box = Box(tmp_path, refloop_cmd_memory_mb=256, refloop_cmd_file_mb=2)
    hog = await run_cmd(box, "python3 -c \"b = bytearray(1024 * 1024 * 1024)\"")
    assert not hog.ok and "MemoryError" in hog.output
    big = await run_cmd(box, "head -c 10000000 /dev/zero > big.bin")
    assert not big.ok and (box.ws / "big.bin").stat().st_size <= 2 * 1024 * 1024


@pytest.mark.skipif(os.geteuid() == 0 and accounting().kind == "none", reason="RLIMIT_NPROC "
                    "does not bind root, and this root worker may make no cgroup")
async def test_fork_bomb_is_contained(tmp_path: Path):
    box = Box(tmp_path, refloop_cmd_max_processes=64)
    # A marker of this test's own: the scan sees every process on the machine.
    marker = f"fork_bomb_{os.urandom(4).hex()}"
    result = await run_cmd(box, f"python3 -c \"import os\n{marker} = 1\nwhile True:\n"
                                "    os.fork()\"", timeout_s=2)
    assert not result.ok
    await assert_gone(marker)


# ---------------------------------------------------------------- file tools: links


async def test_hard_link_to_an_outside_file_is_refused(box: Box):
    os.link(box.outside / "probe.txt", box.ws / "shipped.txt")
    read = await box.call("read_file", path="shipped.txt")
    assert not read.ok and "E_HARDLINK" in read.error and "untouched" not in read.output
    grep = await box.call("grep", pattern="untouched")
    assert "untouched" not in grep.output
    view = await box.call("str_replace_based_edit_tool", command="view", path="shipped.txt")
    assert not view.ok and "E_HARDLINK" in view.error
    for tool, args in [("write_file", {"path": "shipped.txt", "content": "owned"}),
                       ("str_replace_based_edit_tool", {"command": "str_replace",
                        "path": "shipped.txt", "old_str": "untouched", "new_str": "owned"}),
                       ("json_edit_tool", {"operation": "set", "file_path": "shipped.txt",
                                           "json_path": "$", "value": 1})]:
        write = await box.call(tool, **args)
        assert not write.ok and "E_HARDLINK" in write.error, tool
    box.assert_outside_untouched()


async def test_shipped_symlinks_never_steer_a_tool_out(box: Box):
    probe = box.outside / "probe.txt"
    os.symlink(probe, box.ws / "link.txt")
    os.symlink(box.outside, box.ws / "linkdir")
    # Named like the old temporary file of write_file.
    os.symlink(probe, box.ws / ".a.txt.refloop-tmp")
    os.symlink(probe, box.ws / ".new.txt.refloop-tmp")
    calls = [
        ("read_file", {"path": "link.txt"}), ("read_file", {"path": "linkdir/probe.txt"}),
        ("write_file", {"path": "link.txt", "content": "owned"}),
        ("write_file", {"path": "linkdir/probe.txt", "content": "owned"}),
        ("write_file", {"path": "linkdir/new.txt", "content": "owned"}),
        ("list_dir", {"path": "linkdir"}), ("grep", {"pattern": "untouched", "path": "linkdir"}),
        ("str_replace_based_edit_tool", {"command": "create", "path": "linkdir/c.txt",
                                         "file_text": "owned"}),
        ("json_edit_tool", {"operation": "view", "file_path": "linkdir/probe.txt"}),
        ("apply_patch", {"patch": "--- /dev/null\n+++ b/linkdir/p.txt\n@@ -0,0 +1 @@\n+owned\n"}),
    ]
    for tool, args in calls:
        result = await box.call(tool, **args)
        assert not result.ok and "untouched" not in result.output, (tool, args)
    glob = await box.call("glob_file_search", pattern="**/*.txt")
    assert glob.ok and "probe.txt" not in glob.output
    grep = await box.call("grep", pattern="untouched")
    assert "untouched" not in grep.output
    for name in ("a.txt", "new.txt"):
        wrote = await box.call("write_file", path=name, content="mine\n")
        assert wrote.ok and (box.ws / name).read_text() == "mine\n"
    box.assert_outside_untouched()


async def test_forged_workspace_journal_is_inert(box: Box):
    journal = box.ws / ".refloop" / "journal"
    journal.mkdir(parents=True)
    forged = {"call_id": "forged", "tool": "apply_patch", "created_ns": time.time_ns(),
              "pre_images": {str(box.outside / "probe.txt"): base64.b64encode(b"owned").decode(),
                             "../outside/keep/file.txt": None},
              "result": {"ok": True, "output": "", "error": None,
                         "data": {"edit_kind": "patch"}}, "undone": False}
    (journal / "forged.json").write_text(json.dumps(forged))
    result = await box.call("undo_patch")
    assert not result.ok and "E_NO_HISTORY" in result.error
    written = await run_cmd(box, f"echo '{json.dumps(forged)}' > .refloop/journal/f2.json")
    assert written.ok  # the command may write in its workspace, to no effect
    again = await box.call("undo_patch", patch_id="forged")
    assert not again.ok
    box.assert_outside_untouched()


@pytest.mark.parametrize("swap", ["symlink", "hardlink"])
async def test_undo_after_a_swap_does_not_write_through(box: Box, swap: str):
    edit = await box.call("str_replace_based_edit_tool", command="str_replace", path="a.txt",
                          old_str="two", new_str="TWO")
    assert edit.ok
    (box.ws / "a.txt").unlink()
    if swap == "symlink":
        os.symlink(box.outside / "probe.txt", box.ws / "a.txt")
    else:
        os.link(box.outside / "probe.txt", box.ws / "a.txt")
    undo = await box.call("str_replace_based_edit_tool", command="undo_edit", path="a.txt")
    assert not undo.ok and ("E_SYMLINK" in undo.error or "E_HARDLINK" in undo.error)
    box.assert_outside_untouched()


async def test_patch_undo_restores_through_safe_writes(box: Box):
    patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
    applied = await box.call("apply_patch", call_id="p1", patch=patch)
    assert applied.ok
    assert not (box.ws / ".refloop").exists()  # the journal lives under the data dir
    assert list((box.data / "journal").rglob("*.json"))
    (box.ws / "a.txt").unlink()
    os.symlink(box.outside / "probe.txt", box.ws / "a.txt")
    undo = await box.call("undo_patch", patch_id="p1")
    assert not undo.ok and "E_SYMLINK" in undo.error
    box.assert_outside_untouched()


# ---------------------------------------------------------------- limits


async def test_catastrophic_regex_is_linear(box: Box):
    """RE2 never backtracks: the classic blow-up pattern answers at once."""
    (box.ws / "long.txt").write_text("a" * 5000 + "b\n")
    started = time.monotonic()
    result = await box.call("grep", pattern="(a+)+$")
    assert result.ok and result.output == "(no matches)"
    assert time.monotonic() - started < 1


async def test_huge_write_is_refused_and_journals_nothing_big(box: Box):
    result = await box.call("write_file", path="big.txt", content="x" * (2 * 1024 * 1024))
    assert not result.ok and "E_TOO_LARGE" in result.error
    assert not (box.ws / "big.txt").exists()
    journal_bytes = sum(p.stat().st_size for p in box.data.rglob("*") if p.is_file())
    assert journal_bytes < 10_000
    (box.ws / "grow.txt").write_text("y" * (1024 * 1024 - 10) + "MARK")
    grown = await box.call("str_replace_based_edit_tool", command="str_replace",
                           path="grow.txt", old_str="MARK", new_str="z" * 100)
    assert not grown.ok and "E_TOO_LARGE" in grown.error


async def test_deep_json_is_a_tool_error(box: Box):
    (box.ws / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    result = await box.call("json_edit_tool", operation="view", file_path="deep.json")
    assert not result.ok and "E_JSON_DEPTH" in result.error
    (box.ws / "ok.json").write_text("{}")
    for levels, error in [(150, "E_JSON_DEPTH"), (5000, "E_INVALID_ARGS")]:
        value: list = []
        for _ in range(levels):
            value = [value]
        deep_value = await box.call("json_edit_tool", operation="set", file_path="ok.json",
                                    json_path="$.x", value=value)
        assert not deep_value.ok and error in deep_value.error


@pytest.mark.parametrize("path", ["a\x00b.txt", "x" * 5000, "d/" * 3000 + "f",
                                  "bad\udcffname.txt", "/".join(["y" * 300])])
@pytest.mark.parametrize("tool,key", [("read_file", "path"), ("write_file", "path"),
                                      ("list_dir", "path"), ("grep", "path"),
                                      ("str_replace_based_edit_tool", "path"),
                                      ("json_edit_tool", "file_path")])
async def test_malformed_paths_are_tool_errors(box: Box, path: str, tool: str, key: str):
    extra = {"write_file": {"content": "x"}, "grep": {"pattern": "x"},
             "str_replace_based_edit_tool": {"command": "view"},
             "json_edit_tool": {"operation": "view"}}.get(tool, {})
    result = await box.call(tool, **{key: path}, **extra)
    assert not result.ok and result.error.startswith(("E_INVALID_PATH", "E_INVALID_ARGS"))


async def test_malformed_glob_and_command_are_tool_errors(box: Box):
    glob = await box.call("glob_file_search", pattern="a\x00*")
    assert not glob.ok and "E_INVALID_PATH" in glob.error
    nul = await run_cmd(box, "echo a\x00b")
    assert not nul.ok


# ---------------------------------------------------------------- the one switch


async def test_unsandboxed_only_when_chosen_and_then_marked(tmp_path: Path):
    box = Box(tmp_path, refloop_sandbox="none")
    result = await run_cmd(box, "echo hi")
    assert result.ok and result.data["sandboxed"] is False
    assert result.output.startswith("[UNSANDBOXED]")


async def test_repo_map_and_index_skip_linked_files(box: Box):
    from refloop.search.symbols import read_source

    (box.outside / "secret.py").write_text("API_KEY = 'outside'\n")
    os.link(box.outside / "secret.py", box.ws / "hard.py")
    os.symlink(box.outside / "secret.py", box.ws / "soft.py")
    (box.ws / "own.py").write_text("x = 1\n")
    assert read_source(box.ws / "hard.py") is None
    assert read_source(box.ws / "soft.py") is None
    assert read_source(box.ws / "own.py") == "x = 1\n"


def test_a_killed_worker_takes_its_commands_along(tmp_path: Path):
    """The worker dies mid-command (SIGKILL, no clean-up): the sandbox dies with it."""
    import signal
    import subprocess
    import sys

    n = unique_sleep()
    command = f"setsid sleep {n} & sleep {n}"
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from refloop.contract.activity_io import RunToolInput\n"
        "from refloop.settings import Settings\n"
        "from refloop.tools.registry import execute_tool\n"
        f"call = RunToolInput(call_id='x', name='run_cmd', workspace={str(tmp_path)!r},\n"
        f"    allow_shell_operators=True, arguments={{'command': {command!r}}})\n"
        f"settings = Settings(refloop_data_dir=Path({str(tmp_path / 'data')!r}))\n"
        "asyncio.run(execute_tool(call, settings))\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script])
    def sleeping() -> list[str]:  # the sleeps themselves, not the worker's or bwrap's argv
        return [line for line in survivors(f"sleep {n}") if line.split(": ", 1)[1].startswith(
            f"sleep {n}")]

    try:
        for _ in range(300):  # the worker's imports are slow on a loaded machine
            if len(sleeping()) >= 2:
                break
            time.sleep(0.1)
        assert len(sleeping()) >= 2, "the command never started"
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    for _ in range(200):  # the kernel tears the namespace down asynchronously (slow under load)
        if not survivors(f"sleep {n}"):
            break
        time.sleep(0.05)
    assert survivors(f"sleep {n}") == []


async def test_a_journal_inside_the_workspace_is_refused(tmp_path: Path):
    box = Box(tmp_path, refloop_journal_dir=tmp_path / "ws" / "journal")
    result = await box.call("write_file", path="x.txt", content="x")
    assert not result.ok and "E_CONFIG" in result.error
    assert not (box.ws / "x.txt").exists()


async def test_a_default_data_dir_at_the_workspace_top_keeps_the_journal_out_of_reach(
        tmp_path: Path):
    box = Box(tmp_path)
    box.settings = box.settings.model_copy(update={"refloop_data_dir": box.ws / ".refloop-data"})
    box.tools.settings = box.settings
    assert (await box.call("write_file", path="x.txt", content="x")).ok
    journal = next((box.ws / ".refloop-data" / "journal").rglob("*.json"))
    forge = await box.call("write_file", path=str(journal.relative_to(box.ws)), content="{}")
    assert not forge.ok and "E_PATH_RESERVED" in forge.error
    seen = await run_cmd(box, "ls -A .refloop-data; echo forged > .refloop-data/x")
    assert "journal" not in seen.output and not (box.ws / ".refloop-data" / "x").exists()


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "o_nofollow_walk"])
async def test_both_resolvers_refuse_links(box: Box, monkeypatch: pytest.MonkeyPatch,
                                           openat2: bool):
    """Kernels without openat2 take the component-wise O_NOFOLLOW walk: same outcomes."""
    from refloop.tools import pinning

    monkeypatch.setattr(pinning, "has_openat2", lambda: openat2)
    os.symlink(box.outside, box.ws / "linkdir")
    os.symlink(box.outside / "probe.txt", box.ws / "link.txt")
    os.link(box.outside / "keep" / "file.txt", box.ws / "hard.txt")
    for tool, args, error in [
        ("read_file", {"path": "linkdir/probe.txt"}, "E_SYMLINK"),
        ("read_file", {"path": "link.txt"}, "E_SYMLINK"),
        ("read_file", {"path": "hard.txt"}, "E_HARDLINK"),
        ("write_file", {"path": "linkdir/new.txt", "content": "x"}, "E_SYMLINK"),
        ("write_file", {"path": "link.txt", "content": "x"}, "E_SYMLINK"),
        ("write_file", {"path": "hard.txt", "content": "x"}, "E_HARDLINK"),
        ("list_dir", {"path": "linkdir"}, "E_SYMLINK"),
    ]:
        result = await box.call(tool, **args)
        assert not result.ok and error in result.error, (tool, args, result.error)
    made = await box.call("write_file", path="deep/new/dir/f.txt", content="ok\n")
    assert made.ok and (box.ws / "deep" / "new" / "dir" / "f.txt").read_text() == "ok\n"
    read = await box.call("read_file", path="deep/new/dir/f.txt")
    assert read.ok and "ok" in read.output
    box.assert_outside_untouched()
