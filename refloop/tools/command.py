"""run_cmd: a friendly policy check, then the command in the OS sandbox (os_sandbox.py).

The policy below only refuses early, with a clear message, what is plainly unwanted; it is
not the security boundary. The boundary is the sandbox: the command sees the workspace and
read-only system directories, no network unless the task allows it, an allowlisted
environment, resource limits; its output is capped while it is read, and the call returns
at the timeout with the whole process tree killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import ToolError
from refloop.contract.text import escape_controls
from refloop.contract.tool_catalog import RunCmdArgs
from refloop.tools.base import ToolContext, tool
from refloop.tools.os_sandbox import SandboxUnavailableError, sandboxed_command
from refloop.tools.sandbox import pinned_fd

DENIED = [
    (r"\bsudo\b|\bsu\s", "privilege escalation"),
    (r"\brm\s+(-\w*\s+)*-\w*[rf]\w*\s+(/|~|\$HOME)(\s|$|\*)", "recursive delete of / or home"),
    (r"\bmkfs(\.\w+)?\b|\bfdisk\b|\bparted\b", "disk formatting"),
    (r"\bdd\b.*\bof=/dev/", "raw device write"),
    (r"\b(shutdown|reboot|halt|poweroff)\b|\binit\s+[06]\b", "power control"),
    (r":\(\)\s*\{\s*:\|:&\s*\};:", "fork bomb"),
    (r"\bchmod\s+(-\w+\s+)*777\s+/", "world-writable root"),
    (r">\s*/etc/|\btee\s+/etc/", "writes to /etc"),
    (r"\b(kill|pkill|killall)\s+(-9\s+)?(-1|1)\b", "killing every process"),
]
NETWORK = [
    r"\b(curl|wget|ssh|scp|sftp|rsync|nc|ncat|netcat|telnet|ftp|ping)\b",
    r"\b(pip3?|uv|poetry)\s+(install|download|add)\b",
    r"\b(npm|yarn|pnpm)\s+(install|add|i)\b",
    r"\bgit\s+(clone|fetch|pull|push|ls-remote)\b",
    r"\bapt(-get)?\s+(install|update)\b",
]
# Past this much output the command is stopped: `yes` or `cat /dev/zero` never run to the
# timeout. Only refloop_max_output_bytes of it is ever kept in memory.
OUTPUT_KILL_BYTES = 64 * 1024 * 1024
READ_CHUNK = 65536
# After the command exits, how long leftover output may still arrive.
DRAIN_GRACE_S = 0.5
# Ways a command can end besides its own exit.
TIMED_OUT, TOO_MUCH_OUTPUT = "timed_out", "too_much_output"


class PolicyDecision(BaseModel):
    ok: bool
    reason: str = ""



# Chaining and substitution let one approved command smuggle in another.
SHELL_OPERATORS = [
    (r";", "';' command chaining"), (r"&&", "'&&' command chaining"),
    (r"\|\|", "'||' command chaining"), (r"`", "backtick substitution"),
    (r"\$\(", "$() substitution"), (r"[\n\r]", "a newline chaining commands"),
    (r"(?<![&>0-9])&(?![&>])", "'&' running a command in the background"),
    (r"<\(|>\(", "process substitution"),
]
# A redirect to an absolute path (other than /dev/null) or upwards leaves the workspace.
REDIRECT_OUT = re.compile(r"(?<![&])>>?\|?\s*(?!/dev/null\b)(/|~|\.\./|\S*/\.\./)")
# Where a new command starts, for the allowlist: after any separator or pipe.
COMMAND_BREAK = re.compile(r"\|\|?|&&?|;|[\n\r]|\$\(|`|<\(|>\(")


def first_words(command: str) -> list[str]:
    """The program each piece of a command line runs: `a x | b && c` -> [a, b, c]."""
    words = []
    for piece in COMMAND_BREAK.split(command):
        try:
            tokens = shlex.split(piece, comments=False)
        except ValueError:  # unbalanced quotes: judge the raw words
            tokens = piece.split()
        while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
            tokens = tokens[1:]  # VAR=value prefixes
        if tokens:
            words.append(tokens[0])
    return words


def evaluate_command(command: str, allow_network: bool, allow_shell_operators: bool = False,
                     allowlist: list[str] | None = None) -> PolicyDecision:
    """Allowlist (when configured), deny list, shell operators, redirects, network.

    An early, friendly refusal; the sandbox is what actually contains a command."""
    if allowlist:
        for first in first_words(command) or [""]:
            if first not in allowlist:
                return PolicyDecision(ok=False, reason=f"denied by policy: '{first}' is not in "
                                                       f"the allowlist ({', '.join(allowlist)})")
    if not allow_shell_operators:
        for pattern, why in SHELL_OPERATORS:
            if re.search(pattern, command):
                return PolicyDecision(ok=False, reason=f"denied by policy: {why}; run one "
                                                       "command per call")
    if REDIRECT_OUT.search(command):
        return PolicyDecision(ok=False, reason="denied by policy: redirect out of the workspace")
    for pattern, why in DENIED:
        if re.search(pattern, command):
            return PolicyDecision(ok=False, reason=f"denied by policy: {why}")
    if not allow_network:
        for pattern in NETWORK:
            if re.search(pattern, command):
                return PolicyDecision(ok=False, reason="denied by policy: network access is off "
                                                        "for this task")
    return PolicyDecision(ok=True)


class CappedOutput:
    """Keeps the first `cap` bytes read from a pipe and counts the rest."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.kept = bytearray()
        self.total = 0
        self.eof = asyncio.get_running_loop().create_future()
        self.overflow = asyncio.get_running_loop().create_future()

    def on_readable(self) -> None:
        for _ in range(16):  # bounded per wake-up: the event loop stays responsive
            try:
                data = os.read(self.fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.stop()
                _settle(self.eof)
                return
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept += data[:room]
            self.total += len(data)
            if self.total > OUTPUT_KILL_BYTES:
                self.stop()
                _settle(self.overflow)
                return

    def stop(self) -> None:
        asyncio.get_running_loop().remove_reader(self.fd)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def run_bounded(argv: list[str], *, cwd: str, env: dict[str, str], preexec_fn,
                      limit_s: float, cap: int, pass_fds: tuple[int, ...] = (),
                      started: Callable[[int], Awaitable[bool]] | None = None
                      ) -> tuple[int | None, bytes, int, str | None]:
    """Run argv; return (exit code, first `cap` bytes of output, total bytes, how it was
    stopped). Returns by `limit_s` whatever the command does; the process group is always
    killed before returning (and, under the sandbox, the whole pid namespace with it).
    `started` is awaited with the pid once it is spawned (`SandboxedCommand.admit`)."""
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    try:
        # Not asyncio's subprocess: in Python 3.11 its wait() also waits for the pipe to close,
        # which a daemonised grandchild can hold open forever. Spawning returns at once.
        process = subprocess.Popen(  # noqa: ASYNC220
            argv, cwd=cwd, env=env, preexec_fn=preexec_fn, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, close_fds=True,
            pass_fds=pass_fds)
    except OSError as err:
        os.close(read_fd)
        raise ToolError(f"E_EXEC: cannot start the command: {err}") from None
    finally:
        os.close(write_fd)
    os.set_blocking(read_fd, False)
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError as err:  # out of descriptors: never leave the command running
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        os.close(read_fd)
        raise ToolError(f"E_EXEC: cannot watch the command: {err}") from None
    exited = loop.create_future()
    output = CappedOutput(read_fd, cap)
    def on_exit() -> None:
        loop.remove_reader(pidfd)  # level-triggered: readable from now on
        _settle(exited)

    loop.add_reader(pidfd, on_exit)
    loop.add_reader(read_fd, output.on_readable)
    stopped: str | None = None
    try:
        begun = time.monotonic()
        if started is not None:
            try:
                await asyncio.wait_for(started(process.pid), limit_s)
            except TimeoutError:
                pass  # still held: the wait below times out at once
            except OSError as err:
                raise ToolError(f"E_SANDBOX: cannot account the command: {err}") from None
        left = max(0.0, limit_s - (time.monotonic() - begun))
        done, _ = await asyncio.wait({exited, output.overflow}, timeout=left,
                                     return_when=asyncio.FIRST_COMPLETED)
        if output.overflow in done:
            stopped = TOO_MUCH_OUTPUT
        elif exited not in done:
            stopped = TIMED_OUT
        else:  # output written just before the exit is still in the pipe
            await asyncio.wait({output.eof, output.overflow}, timeout=DRAIN_GRACE_S,
                               return_when=asyncio.FIRST_COMPLETED)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        loop.remove_reader(read_fd)
        os.close(read_fd)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(exited), 5)
        loop.remove_reader(pidfd)
        os.close(pidfd)
        code = process.poll()
    return (None if stopped else code), bytes(output.kept), output.total, stopped


# Not idempotent and not journaled: one attempt. A worker that dies mid-command fails the
# call instead of running the command a second time.
@tool("run_cmd", blocking=False)
async def run_cmd(ctx: ToolContext, args: RunCmdArgs) -> ToolResult:
    decision = evaluate_command(args.command, ctx.allow_network, ctx.allow_shell_operators,
                                ctx.settings.cmd_allowlist)
    if not decision.ok:
        raise ToolError(f"E_POLICY: {decision.reason}: {args.command}")
    if "\0" in args.command:
        raise ToolError("E_INVALID_ARGS: the command contains a NUL byte")
    timeout = min(args.timeout_s or ctx.settings.refloop_cmd_timeout_s,
                  ctx.settings.refloop_cmd_timeout_s)
    try:  # the workspace is bound from the descriptor this call pinned, not by its path
        command = sandboxed_command(["/bin/sh", "-c", args.command], workspace=ctx.workspace,
                                    allow_network=ctx.allow_network, env={},
                                    settings=ctx.settings, workspace_fd=pinned_fd())
    except SandboxUnavailableError as err:
        raise ToolError(f"E_SANDBOX: {err}") from None
    cap = ctx.settings.refloop_max_output_bytes
    try:
        code, kept, total, stopped = await run_bounded(
            command.argv, cwd=str(ctx.workspace) if not command.sandboxed else "/",
            env=command.env, preexec_fn=command.preexec_fn, limit_s=timeout, cap=cap,
            pass_fds=command.pass_fds, started=command.admit)
        memory_hit = command.oom_killed()
    finally:
        command.close()
    # Escaped: a file name `ls` prints, or any output, never carries ESC sequences on.
    text = escape_controls(kept.decode("utf-8", errors="ignore" if total > cap else "replace"))
    if total > len(kept):
        text += f"\n[... truncated {total - len(kept)} bytes ...]"
    marker = "" if command.sandboxed else "[UNSANDBOXED] "
    data = {"exit_code": code, "sandboxed": command.sandboxed}
    if memory_hit:  # the kernel's own word: the command hit its memory limit
        data["memory_limit_hit"] = True
        text += (f"\n[a process was killed: the command as a whole reached its memory limit "
                 f"of {ctx.settings.refloop_cmd_memory_mb} MiB (REFLOOP_CMD_MEMORY_MB), "
                 "files in /tmp and /dev/shm included]")
    if stopped == TIMED_OUT:
        return ToolResult(ok=False, error=f"E_TIMEOUT: {marker}command killed after {timeout:g}s",
                          output=f"{marker}{text}", data={**data, "timed_out": True})
    if stopped == TOO_MUCH_OUTPUT:
        return ToolResult(ok=False, output=f"{marker}{text}", data=data,
                          error=f"E_OUTPUT_LIMIT: {marker}command killed after "
                                f"{OUTPUT_KILL_BYTES // (1024 * 1024)} MiB of output")
    result = f"{marker}exit code {code}\n{text}"
    if code != 0:
        return ToolResult(ok=False, error=f"E_EXIT: {marker}command exited with {code}",
                          output=result,
                          data=data)
    return ToolResult(ok=True, output=result, data=data)
