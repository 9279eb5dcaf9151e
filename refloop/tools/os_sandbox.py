"""The OS sandbox every command the model writes runs in (bubblewrap), with resource limits.

`sandboxed_command` turns an argv into the argv, environment and pre-exec limits to start it
with. Under bubblewrap the command sees, read-only, the system directories (/usr, /etc,
/lib*, /bin, /sbin) and, read-write, the task's workspace; a private /tmp, a fresh /proc and
/dev, and nothing else of the host: not the data dir, not /root, not other workspaces, not
the worker's processes. It gets no network unless the task allows it, a new session, and
dies with its parent. Its environment is an allowlist, never the worker's.

`REFLOOP_SANDBOX=none` runs commands unconfined; it is never chosen silently: when bubblewrap
is missing or broken, and the setting is not `none`, `sandbox_mode` raises.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from refloop.settings import Settings

SandboxMode = Literal["bwrap", "none"]

# Mounted read-only when present: a directory is bound, a symlink (merged /usr) recreated.
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Files of /etc a command never needs and that may hold credentials: hidden.
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-",
                "/etc/sudoers")
MASKED_DIRS = ("/etc/ssh", "/etc/sudoers.d")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The whole environment a command starts from; callers add explicit variables on top.
BASE_ENV = {
    "PATH": PATH, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
    "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1",
}
MIB = 1024 * 1024


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is wanted (the default) but cannot run here; never falls back to none."""


@dataclass
class SandboxedCommand:
    argv: list[str]
    env: dict[str, str]
    preexec_fn: Callable[[], None] | None = None
    sandboxed: bool = True
    limits: dict[str, int] = field(default_factory=dict)


def sandbox_mode(settings: Settings) -> SandboxMode:
    """`none` only when chosen; otherwise bubblewrap, or an error saying why it can't run."""
    wanted = (settings.refloop_sandbox or "bwrap").strip().lower()
    if wanted == "none":
        return "none"
    if wanted != "bwrap":
        raise SandboxUnavailableError(
            f"REFLOOP_SANDBOX={wanted!r} is not supported (use bwrap, or none to run "
            "commands unconfined)")
    problem = _bwrap_problem(shutil.which("bwrap") or "")
    if problem:
        raise SandboxUnavailableError(
            f"the command sandbox (bubblewrap) cannot run: {problem}. Install it "
            "(apt-get install bubblewrap) and allow user namespaces, or set "
            "REFLOOP_SANDBOX=none to run the model's commands unconfined")
    return "bwrap"


@functools.cache
def _bwrap_problem(bwrap: str) -> str:
    """Empty when the real profile runs `true`; else what went wrong (probed once)."""
    if not bwrap:
        return "`bwrap` is not on PATH"
    with tempfile.TemporaryDirectory(prefix="refloop-probe-") as probe:
        argv = _bwrap_prefix(bwrap, Path(probe), allow_network=False)
        try:
            done = subprocess.run([*argv, "true"], capture_output=True, timeout=10,
                                  env=dict(BASE_ENV), check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return str(err)
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
    return ""


def _bwrap_prefix(bwrap: str, workspace: Path, allow_network: bool,
                  extra_ro: tuple[str, ...] = (),
                  hidden: tuple[Path, ...] = ()) -> list[str]:
    argv = [bwrap, "--unshare-all"]
    if allow_network:
        argv.append("--share-net")
    # The environment is the spawner's `env=` (the minimal one below), never `--setenv`:
    # every local user can read a process's command line in /proc.
    argv += ["--new-session", "--die-with-parent"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in MASKED_FILES:
        if os.path.isfile(path):
            argv += ["--ro-bind", "/dev/null", path]
    for path in MASKED_DIRS:
        if os.path.isdir(path):
            argv += ["--tmpfs", path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in extra_ro:  # after /tmp: a path under it stays visible
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    ws = str(workspace)
    argv += ["--bind", ws, ws]
    for path in hidden:  # refloop's own state, should it sit inside the workspace
        covered = any(other in path.parents for other in hidden)
        if path != workspace and workspace in path.parents and path.is_dir() and not covered:
            argv += ["--tmpfs", str(path)]
    argv += ["--chdir", ws, "--"]
    return argv


def resource_limits(settings: Settings) -> dict[str, int]:
    """Per command: CPU seconds, address space, largest file, processes of the user."""
    return {
        "cpu_s": int(settings.refloop_cmd_timeout_s) + 1,
        "address_space": settings.refloop_cmd_memory_mb * MIB,
        "file_size": settings.refloop_cmd_file_mb * MIB,
        "processes": settings.refloop_cmd_max_processes,
    }


def _limiter(limits: Mapping[str, int]) -> Callable[[], None]:
    pairs = [
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_AS, limits["address_space"]),
        (resource.RLIMIT_FSIZE, limits["file_size"]),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_CORE, 0),
    ]

    def apply() -> None:  # runs in the child between fork and exec: syscalls only
        for which, value in pairs:
            soft, hard = resource.getrlimit(which)
            cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (cap, cap))

    return apply


def _prlimit_prefix(limits: Mapping[str, int]) -> list[str] | None:
    """util-linux `prlimit` sets the limits and execs the command: the worker spawns without
    a pre-exec hook, which would force a full fork of its (large) process."""
    prlimit = shutil.which("prlimit")
    if not prlimit:
        return None
    return [prlimit, f"--cpu={limits['cpu_s']}", f"--as={limits['address_space']}",
            f"--fsize={limits['file_size']}", f"--nproc={limits['processes']}", "--core=0",
            "--"]


def sandboxed_command(argv: list[str], *, workspace: Path, allow_network: bool,
                      env: Mapping[str, str], settings: Settings) -> SandboxedCommand:
    """How to start `argv` confined to `workspace` (or unconfined, when chosen). The limits
    come as a `prlimit` prefix where it exists (then preexec_fn is None), else preexec_fn."""
    full_env = {**BASE_ENV, **env}
    limits = resource_limits(settings)
    limited = _prlimit_prefix(limits)
    preexec = None if limited else _limiter(limits)
    if sandbox_mode(settings) == "none":
        return SandboxedCommand(argv=[*(limited or []), *argv], env=full_env,
                                preexec_fn=preexec, sandboxed=False, limits=limits)
    hidden = tuple(Path(p).resolve() for p in (settings.refloop_data_dir, settings.index_dir,
                                                settings.journal_dir))
    prefix = _bwrap_prefix(shutil.which("bwrap") or "bwrap", Path(workspace).resolve(),
                           allow_network, tuple(settings.sandbox_ro_paths), hidden)
    return SandboxedCommand(argv=[*(limited or []), *prefix, *argv], env=full_env,
                            preexec_fn=preexec, sandboxed=True, limits=limits)


UNSANDBOXED_WARNING = (
    "UNSANDBOXED: REFLOOP_SANDBOX=none, so the model's commands run with this worker's full "
    "authority (files, network, processes). Use it only on a machine you can throw away."
)
