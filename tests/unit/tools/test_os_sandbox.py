"""The command sandbox's profile, on the real bubblewrap of this machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from refloop.settings import Settings
from refloop.tools import os_sandbox
from refloop.tools.os_sandbox import SandboxUnavailableError, sandbox_mode, sandboxed_command

SETTINGS = Settings(refloop_cmd_timeout_s=5)


def run(cmd: str, ws: Path, allow_network: bool = False, settings: Settings = SETTINGS,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    sandboxed = sandboxed_command(["/bin/sh", "-c", cmd], workspace=ws,
                                  allow_network=allow_network, env=env or {},
                                  settings=settings)
    done = sandboxed.run(timeout_s=20, cwd=str(ws))
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(),
                                       done.stderr.decode())


def test_default_is_bwrap_and_none_only_when_chosen():
    assert sandbox_mode(Settings()) == "bwrap"
    assert sandbox_mode(Settings(refloop_sandbox="none")) == "none"
    plain = sandboxed_command(["true"], workspace=Path("."), allow_network=False, env={},
                              settings=Settings(refloop_sandbox="none"))
    assert plain.argv[-1] == "true" and "bwrap" not in " ".join(plain.argv)
    assert not plain.sandboxed


def test_missing_bwrap_is_an_error_never_a_silent_fallback(monkeypatch):
    monkeypatch.setattr(os_sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError, match="REFLOOP_SANDBOX=none"):
        sandbox_mode(Settings())
    with pytest.raises(SandboxUnavailableError):
        sandboxed_command(["true"], workspace=Path("."), allow_network=False, env={},
                          settings=Settings())


def test_workspace_is_writable_and_the_host_is_not(tmp_path: Path):
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret")
    done = run(f"echo hi > note.txt; cat {outside}/secret.txt; echo x > {outside}/new; "
               "echo y > /usr/probe; ls /root; echo t > /tmp/t && cat /tmp/t", ws)
    assert (ws / "note.txt").read_text() == "hi\n"
    assert "s3cret" not in done.stdout
    assert not (outside / "new").exists() and not Path("/usr/probe").exists()
    assert done.stdout.strip().endswith("t")  # a private, writable /tmp


def test_environment_is_an_allowlist(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:pw@h/db")
    done = run("env; cat /proc/1/environ; cat /proc/$PPID/environ", tmp_path,
               env={"EXTRA": "1"})
    assert "sk-leak" not in done.stdout + done.stderr
    assert "pw@h" not in done.stdout + done.stderr
    assert "EXTRA=1" in done.stdout and "PATH=" in done.stdout


def test_no_network_unless_allowed(tmp_path: Path):
    closed = run("python3 -c \"import socket; print(len(socket.if_nameindex()))\"", tmp_path)
    assert closed.stdout.strip() == "1"  # loopback only, in a namespace of its own
    opened = run("python3 -c \"import socket; print(len(socket.if_nameindex()))\"", tmp_path,
                 allow_network=True)
    assert int(opened.stdout.strip()) >= 1


def test_resource_limits_apply(tmp_path: Path):
    settings = Settings(refloop_cmd_timeout_s=5, refloop_cmd_file_mb=1,
                        refloop_cmd_memory_mb=256)
    done = run("head -c 3000000 /dev/zero > big; ulimit -v; ulimit -f", tmp_path,
               settings=settings)
    assert (tmp_path / "big").stat().st_size <= 1024 * 1024
    assert "262144" in done.stdout  # ulimit -v in KiB
    hog = run("python3 -c \"b = bytearray(512 * 1024 * 1024)\"", tmp_path, settings=settings)
    assert hog.returncode != 0 and "MemoryError" in hog.stderr


def test_a_data_dir_inside_the_workspace_is_hidden(tmp_path: Path):
    data = tmp_path / ".refloop-data"
    (data / "journal").mkdir(parents=True)
    (data / "journal" / "entry.json").write_text("{}")
    done = run("ls -A .refloop-data; echo forged > .refloop-data/x", tmp_path,
               settings=Settings(refloop_cmd_timeout_s=5, refloop_data_dir=data))
    assert "journal" not in done.stdout
    assert not (data / "x").exists() and (data / "journal" / "entry.json").exists()


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_limits_come_from_the_commands_own_shell(tmp_path: Path, mode: str):
    """No `prlimit` exec and no pre-exec hook: the shell that starts the command sets the
    limits (soft and hard) first, sandboxed or not."""
    settings = Settings(refloop_cmd_timeout_s=5, refloop_cmd_file_mb=1, refloop_sandbox=mode)
    command = sandboxed_command(["true"], workspace=tmp_path, allow_network=False, env={},
                                settings=settings)
    command.close()
    assert command.preexec_fn is None and "prlimit" not in " ".join(command.argv)
    done = run("ulimit -f; ulimit -H -f; ulimit -t", tmp_path, settings=settings)
    assert done.stdout.split() == ["2048", "2048", "6"]  # dash counts 512-byte blocks


def test_refloop_run_shows_unsandboxed_results():
    from refloop.cli.output import describe_event
    from refloop.contract.task import Event

    def line(output: str) -> str:
        return describe_event(Event(seq=1, type="tool_result", ts="t", data={
            "tool": "run_cmd", "ok": True, "output": output}))

    assert line("[UNSANDBOXED] exit code 0\n").endswith("[UNSANDBOXED]")
    assert "UNSANDBOXED" not in line("exit code 0\n")


def test_worker_refuses_to_start_without_its_sandbox(tmp_path: Path, monkeypatch, caplog):
    from refloop.activities.tool_activities import ToolActivities
    from refloop.store.db import store_for

    store = store_for(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with caplog.at_level("WARNING", logger="refloop"):
        ToolActivities(Settings(refloop_sandbox="none"), store)
    assert "UNSANDBOXED" in caplog.text
    monkeypatch.setattr(os_sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="bubblewrap"):
        ToolActivities(Settings(), store)


def test_extra_read_only_paths(tmp_path: Path):
    ws, tools = tmp_path / "ws", tmp_path / "toolchain"
    ws.mkdir()
    tools.mkdir()
    (tools / "tool.sh").write_text("echo from the toolchain\n")
    settings = Settings(refloop_cmd_timeout_s=5, refloop_sandbox_ro_paths=f"{tools}, /nonexistent")
    done = run(f"sh {tools}/tool.sh; echo x > {tools}/new", ws, settings=settings)
    assert "from the toolchain" in done.stdout and not (tools / "new").exists()
    hidden = run(f"sh {tools}/tool.sh", ws)
    assert "from the toolchain" not in hidden.stdout


def test_a_commands_environment_never_rides_on_its_command_line(tmp_path):
    """Every local user can read /proc/<pid>/cmdline: secrets an MCP server's config
    resolves go to the process environment only."""
    secret = "sk-mcp-server-secret"
    settings = Settings(refloop_data_dir=tmp_path / "data")
    command = sandboxed_command(["server"], workspace=tmp_path, allow_network=False,
                                env={"SERVER_TOKEN": secret}, settings=settings)
    assert command.env["SERVER_TOKEN"] == secret
    assert not any(secret in part for part in command.argv)
