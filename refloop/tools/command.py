"""run_cmd: a command policy, then the command in its own process group with a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal

from pydantic import BaseModel, Field

from refloop.models import ToolResult
from refloop.tools.base import ToolContext, ToolError, tool
from refloop.tools.sandbox import truncate_bytes

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
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


class PolicyDecision(BaseModel):
    ok: bool
    reason: str = ""


class RunCmdArgs(BaseModel):
    command: str = Field(min_length=1)
    timeout_s: float | None = Field(default=None, gt=0)


# Chaining and substitution let one approved command smuggle in another.
SHELL_OPERATORS = [
    (r";", "';' command chaining"), (r"&&", "'&&' command chaining"),
    (r"\|\|", "'||' command chaining"), (r"`", "backtick substitution"),
    (r"\$\(", "$() substitution"),
]
# A redirect to an absolute path (other than /dev/null) or upwards leaves the workspace.
REDIRECT_OUT = re.compile(r"(?<![0-9&])>>?\s*(?!/dev/null\b)(/|~|\.\./|\S*/\.\./)")


def evaluate_command(command: str, allow_network: bool, allow_shell_operators: bool = False,
                     allowlist: list[str] | None = None) -> PolicyDecision:
    """Allowlist (when configured), deny list, shell operators, redirects, network."""
    if allowlist:
        first = command.strip().split()[0] if command.strip() else ""
        if first not in allowlist:
            return PolicyDecision(ok=False, reason=f"denied by policy: '{first}' is not in the "
                                                   f"allowlist ({', '.join(allowlist)})")
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


def sanitized_env() -> dict[str, str]:
    """Secrets never reach commands the model writes."""
    return {
        name: value for name, value in os.environ.items()
        if not name.startswith("OPENAI_") and not any(m in name.upper() for m in SECRET_MARKERS)
    }


@tool("run_cmd", RunCmdArgs, "Run a shell command in the workspace (policy-checked, timed out).",
      blocking=False)
async def run_cmd(ctx: ToolContext, args: RunCmdArgs) -> ToolResult:
    decision = evaluate_command(args.command, ctx.allow_network, ctx.allow_shell_operators,
                                ctx.settings.cmd_allowlist)
    if not decision.ok:
        raise ToolError(f"E_POLICY: {decision.reason}: {args.command}")
    timeout = min(args.timeout_s or ctx.settings.refloop_cmd_timeout_s,
                  ctx.settings.refloop_cmd_timeout_s)
    process = await asyncio.create_subprocess_shell(
        args.command, cwd=ctx.workspace, env=sanitized_env(), start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError) as err:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        if isinstance(err, asyncio.CancelledError):
            raise
        return ToolResult(ok=False, error=f"E_TIMEOUT: command killed after {timeout:g}s",
                          data={"exit_code": None, "timed_out": True})
    text = truncate_bytes(output.decode("utf-8", errors="replace"),
                          ctx.settings.refloop_max_output_bytes)
    code = process.returncode
    result = f"exit code {code}\n{text}"
    if code != 0:
        return ToolResult(ok=False, error=f"E_EXIT: command exited with {code}", output=result,
                          data={"exit_code": code})
    return ToolResult(ok=True, output=result, data={"exit_code": code})


