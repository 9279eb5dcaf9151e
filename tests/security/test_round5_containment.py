"""Red team, round 5 (issue 54): nothing a workspace holds decides what the sandbox binds or
who runs it.

1. An MCP server's command inside a workspace, its `#!` line naming `/proc/self/cwd/...`:
   through the real MCP path as root, the worker's working directory at `/` and at a private
   directory, no root-only file reaches the model, and the server is refused with the reason.
2. The data dir or the journal below a workspace's top level: refused by the file tools by
   its resolved path, skipped by walks; `refloop run --workspace` refuses such a workspace.
3. A tree 3,000 levels deep: grep and glob answer, saying what they left; a command starts
   with no descriptor but 0-2; `refloop up` takes the scripted model's port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from refloop.activities.tool_activities import ToolActivities
from refloop.mcp import pool as mcp_pool
from refloop.runtime.net import free_port
from refloop.settings import Settings
from refloop.store.db import store_for
from refloop.tools.sandbox import MAX_WALK_DEPTH
from tests.security import test_sandbox_cost
from tests.security.test_containment import Box, run_cmd
from tests.security.test_edges import AS_ROOT, SANDBOXED
from tests.security.test_mcp_edges import activities_for, listing

SECRET = "ROOT-ONLY-SECRET-" + uuid.uuid4().hex
reachable = test_sandbox_cost.reachable  # a directory uid 65534 may traverse (a fixture)


@pytest.fixture
def private() -> Iterator[Path]:
    """A root-only directory holding a root-only file."""
    top = Path(tempfile.mkdtemp(prefix="refloop-private-"))
    top.chmod(0o700)
    (top / "X").mkdir(mode=0o700)
    secret = top / "X" / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    yield top
    shutil.rmtree(top, ignore_errors=True)


# ---------------------------------------------------------------- 1. MCP server binds


@AS_ROOT
@SANDBOXED
@pytest.mark.parametrize("cwd", ["/", "private"])
async def test_a_server_command_in_a_workspace_binds_nothing_it_names(
        settings, reachable: Path, private: Path, cwd: str, monkeypatch):
    """The operator's server is a project venv's entry point; the model rewrote its `#!`
    line to `/proc/self/cwd/<X>/bin/sh`, which the worker would resolve against its own
    working directory (binding that root-only directory, as host root since uid 65534
    cannot enter it) while the kernel, in the sandbox, runs the model's `<X>/bin/sh`. The
    server is refused, saying why; nothing of the secret comes back."""
    workdir = "/" if cwd == "/" else str(private)
    monkeypatch.chdir(workdir)
    ws = reachable / "proj"
    ws.mkdir()
    rel = str((private / "X").relative_to(workdir))
    entry = ws / ".venv" / "bin" / "some-server"
    entry.parent.mkdir(parents=True)
    entry.write_text(f"#!/proc/self/cwd/{rel}/bin/sh\n")
    entry.chmod(0o755)
    shell = ws / rel / "bin" / "sh"  # the model's own interpreter, in the workspace
    shell.parent.mkdir(parents=True)
    shell.write_text(f"#!/bin/sh\ncat {private}/X/secret /proc/self/cwd/{rel}/secret >&2\n"
                     "exit 1\n")
    shell.chmod(0o755)
    configured = settings.model_copy(update={"refloop_workspace_roots": str(reachable)})
    acts = activities_for(configured, reachable, {"s": {"command": str(entry)}})
    try:
        said = json.dumps((await listing(acts, ws, "s")).dropped)
    except ApplicationError as err:
        said = str(err)
    finally:
        await acts.pool.close()
    assert SECRET not in said
    assert "where a task may write" in said and str(entry) in said, said


@AS_ROOT
@SANDBOXED
def test_a_path_read_from_a_file_is_never_bound_as_host_root(settings, reachable: Path,
                                                               private: Path):
    """An operator's own script (root-owned, outside every workspace) whose `#!` names an
    interpreter only root can reach: its directory is read from the file, so it is refused
    rather than bound in the root-mapped profile; `/proc` in a `#!` line is refused too."""
    ws = reachable / "ws"
    ws.mkdir()
    tool = private / "X" / "bin" / "python"
    tool.parent.mkdir()
    tool.symlink_to(sys.executable)
    script = reachable / "server"
    configured = settings.model_copy(update={"refloop_workspace_roots": str(ws)})
    for first, why in ((f"#!{tool}", "would be bound as host root"),
                       ("#!/proc/self/cwd/bin/sh", "goes through /proc")):
        script.write_text(first + "\n")
        script.chmod(0o755)
        server = mcp_pool.McpServerConfig(command=str(script))
        with pytest.raises(Exception, match=why):
            mcp_pool.launch_spec("s", server, ws, configured, {})


def test_a_command_through_a_link_into_a_workspace_is_refused(settings, tmp_path: Path):
    """A link the operator made, pointing into a workspace: the file at its end is the
    model's to write, so nothing is read from it."""
    ws = tmp_path / "ws"
    (ws / "bin").mkdir(parents=True)
    (ws / "bin" / "srv").write_text("#!/bin/sh\n")
    link = tmp_path / "srv"
    link.symlink_to(ws / "bin" / "srv")
    with pytest.raises(mcp_pool.McpConfigError, match="where a task may write"):
        mcp_pool.operator_path("s", "command", str(link), ws, settings)
    assert mcp_pool.operator_path("s", "command", "/bin/sh", ws, settings).startswith("/")


# ---------------------------------------------------------------- 2. refloop's own state


def state_box(tmp: Path, **where: Path) -> Box:
    box = Box(tmp)
    box.settings = box.settings.model_copy(update=where)
    box.tools = ToolActivities(box.settings, store_for(f"sqlite:///{tmp / 'db.sqlite'}"))
    return box


@pytest.mark.parametrize("setting", ["refloop_data_dir", "refloop_journal_dir"])
async def test_state_below_the_top_level_is_refused_by_the_file_tools(tmp_path: Path,
                                                                      setting: str):
    state = tmp_path / "ws" / "app" / ".state-" / "here"
    box = state_box(tmp_path, **{setting: state})
    state.mkdir(parents=True)
    (state / "api-token").write_text(SECRET + "\n")
    rel = "app/.state-/here/api-token"
    for tool, args in (("read_file", {"path": rel}), ("list_dir", {"path": "app/.state-/here"}),
                       ("grep", {"pattern": "ROOT", "path": "app/.state-/here"})):
        result = await box.call(tool, **args)
        assert not result.ok and "E_PATH_RESERVED" in result.error, (tool, result)
    # Edits: the journal refuses to work in such a workspace at all, before any path.
    forged = await box.call("write_file", path=rel, content="forged")
    assert not forged.ok and forged.error.startswith(("E_PATH_RESERVED", "E_CONFIG")), forged
    found = await box.call("grep", pattern="ROOT-ONLY", path=".")
    assert found.ok and SECRET not in found.output, found
    listed = await box.call("glob_file_search", pattern="**/api-token")
    assert listed.ok and "api-token" not in listed.output, listed
    assert (state / "api-token").read_text() == SECRET + "\n"


def test_refloop_run_refuses_a_workspace_holding_the_data_dir(tmp_path: Path):
    ws = tmp_path / "ws"
    (ws / "app").mkdir(parents=True)
    env = {**os.environ, "REFLOOP_DATA_DIR": str(ws / "app" / ".refloop-data"),
           "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    done = subprocess.run([sys.executable, "-m", "refloop", "run", "--workspace", str(ws),
                           "say hi"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "contains the data directory" in done.stderr, done.stderr[-2000:]


def test_refloop_run_still_takes_a_workspace_beside_the_state(tmp_path: Path):
    """`make demo`'s workspace sits in the data dir: not refused (only the journal and the
    index may not hold or hold it)."""
    from refloop.cli.tasks import state_refusal

    data = tmp_path / "data"
    settings = Settings(refloop_data_dir=data)
    assert state_refusal(data / "demo-workspace", settings) is None
    assert state_refusal(data / "journal" / "x", settings)
    assert state_refusal(tmp_path, settings)


# ---------------------------------------------------------------- 3. smaller ones


def deep_tree(top: Path, levels: int) -> None:
    """`top/d/d/.../d` with a file near the top and one at the bottom (made by descriptors:
    the path is longer than the kernel takes)."""
    (top / "near.txt").write_text("needle near\n")
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    far = os.open("far.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(far, b"needle far\n")
    os.close(far)
    os.close(fd)


def remove_deep(top: Path) -> None:
    """Removes a tree too deep for shutil.rmtree (it recurses), bottom first."""
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    while "d" in os.listdir(fds[-1]):
        fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    for name in os.listdir(fds[-1]):
        os.unlink(name, dir_fd=fds[-1])
    while len(fds) > 1:
        os.close(fds.pop())
        for name in os.listdir(fds[-1]):
            if name == "d":
                os.rmdir(name, dir_fd=fds[-1])
            else:
                os.unlink(name, dir_fd=fds[-1])
    os.close(fds.pop())


@pytest.fixture
def deep_box(tmp_path: Path) -> Iterator[Box]:
    box = Box(tmp_path)
    deep_tree(box.ws, 3000)
    yield box
    remove_deep(box.ws)


async def test_grep_and_glob_answer_in_a_tree_3000_levels_deep(deep_box: Box):
    grep = await deep_box.call("grep", pattern="needle", path=".")
    assert grep.ok, grep
    assert "near.txt:1: needle near" in grep.output and "far.txt" not in grep.output
    assert f"more than {MAX_WALK_DEPTH} levels down" in grep.output, grep.output[-300:]
    glob = await deep_box.call("glob_file_search", pattern="**/*.txt")
    assert glob.ok and "near.txt" in glob.output, glob
    assert f"more than {MAX_WALK_DEPTH} levels down" in glob.output


@SANDBOXED
async def test_a_command_starts_with_no_descriptor_but_0_to_2(reachable: Path):
    """As root the command joins the worker's user namespace (`bwrap --userns`), whose
    descriptor bubblewrap keeps open; as any user, nothing else is open either."""
    box = Box(reachable)
    result = await run_cmd(box, "ls -l /proc/self/fd/")
    assert result.ok, result
    opened = {line.split()[-3]: line.split()[-1] for line in result.output.splitlines()
              if " -> " in line}
    extra = {fd: what for fd, what in opened.items() if fd not in ("0", "1", "2")}
    # ls's own handle on the directory it lists, and nothing else.
    assert len(extra) <= 1 and all(what.endswith("/fd") for what in extra.values()), opened


def test_refloop_up_takes_the_scripted_models_port(monkeypatch):
    """A flag (`up --scripted-port`) and a setting (REFLOOP_SCRIPTED_PORT) choose the port
    the scripted model listens on; unset, it takes a free one."""
    from refloop.cli.main import build_parser
    from refloop.worker.model_endpoint import model_endpoint

    port = free_port()
    assert build_parser().parse_args(["up", "--scripted-port", str(port)]).scripted_port == port
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("REFLOOP_SCRIPTED_PORT", str(port))
    with model_endpoint(Settings()) as effective:
        assert effective.openai_base_url == f"http://127.0.0.1:{port}/v1"
