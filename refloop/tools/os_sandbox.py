"""The OS sandbox every command the model writes runs in (bubblewrap), with resource limits.

`sandboxed_command` turns an argv into the argv, environment and descriptors to start it
with. Under bubblewrap the command sees, read-only, the system directories (/usr, /etc,
/lib*, /bin, /sbin) and, read-write, the task's workspace; a private /tmp, a fresh /proc and
/dev, and nothing else of the host: not the data dir, not /root, not other workspaces, not
the worker's processes. It gets no network unless the task allows it, a new session, and
dies with its parent. Its environment is an allowlist, never the worker's.

It never holds a privilege of the host, even when the worker is root: it runs as `nobody`
in its own user namespace with every capability dropped and no further user namespace;
/proc/sys is read-only; files and directories of /etc that only root may read are hidden;
a seccomp filter (`refloop.tools.seccomp`) refuses tracing, mounting, keyrings, BPF,
namespaces, kernel modules and set-id bits. The workspace is bound from the descriptor the
tool call pinned (`sandbox.pin_workspace`), never by a path that could have been swapped.

Limits (CPU, memory, file size, processes) are set by the sandbox's own shell (`ulimit`)
before the command starts: no extra program to execute per command.

`REFLOOP_SANDBOX=none` runs commands unconfined; it is never chosen silently: when bubblewrap
is missing or broken, and the setting is not `none`, `sandbox_mode` raises.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import stat
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


# Who a command runs as inside its user namespace: nobody, with no capability.
SANDBOX_ID = "65534"
# Never walked for root-only entries: a tree this large would cost seconds at start.
UNSCANNED_DIRS = ("/usr",)
# bubblewrap options that take a descriptor number.
FD_OPTIONS = frozenset({"--seccomp", "--bind-fd", "--ro-bind-fd"})


@dataclass
class SandboxedCommand:
    """How to start one command: `pass_fds` are inherited by the spawn and must be closed
    by the caller right after it (`close`): bubblewrap has what it needs by then."""

    argv: list[str]
    env: dict[str, str]
    preexec_fn: Callable[[], None] | None = None  # kept for callers; always None now
    sandboxed: bool = True
    limits: dict[str, int] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()

    def close(self) -> None:
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pass_fds = ()


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
        command = _bwrap_command(bwrap, Path(probe), ["true"], allow_network=False)
        try:
            done = subprocess.run(command.argv, capture_output=True, timeout=10,
                                  env=dict(BASE_ENV), check=False, pass_fds=command.pass_fds)
        except (OSError, subprocess.TimeoutExpired) as err:
            return str(err)
        finally:
            command.close()
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
    return ""


@functools.cache
def root_only_entries() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(files, directories) under the bound system directories that are not world-readable
    but that this worker can read: the command's uid maps to the worker's, so a root
    worker's commands would read them (for an ordinary user there are usually none, and
    nothing to mount). Walked once per process; /usr is left out (large, and
    world-readable)."""
    files: list[str] = []
    dirs: list[str] = []
    for top in SYSTEM_DIRS:
        if top in UNSCANNED_DIRS or os.path.islink(top) or not os.path.isdir(top):
            continue
        for folder, subdirs, names, _ in _walk(top):
            for name in list(subdirs):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if not os.lstat(path).st_mode & stat.S_IROTH:
                        subdirs.remove(name)
                        if os.access(path, os.R_OK | os.X_OK):
                            dirs.append(path)
            for name in names:
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    info = os.lstat(path)
                    if stat.S_ISREG(info.st_mode) and not info.st_mode & stat.S_IROTH \
                            and os.access(path, os.R_OK):
                        files.append(path)
    return tuple(files), tuple(dirs)


def _walk(top: str):  # noqa: ANN202 - os.fwalk's tuples
    with contextlib.suppress(OSError):
        yield from os.fwalk(top)


def _masks() -> list[str]:
    argv = []
    files, dirs = root_only_entries()
    for path in (*MASKED_FILES, *files):
        if os.path.isfile(path):
            argv += ["--ro-bind", "/dev/null", path]
    for path in (*MASKED_DIRS, *dirs):
        if os.path.isdir(path):
            argv += ["--tmpfs", path]
    return argv


def _bwrap_command(bwrap: str, workspace: Path, argv: list[str], allow_network: bool,
                   extra_ro: tuple[str, ...] = (), hidden: tuple[Path, ...] = (),
                   workspace_fd: int | None = None) -> SandboxedCommand:
    """bubblewrap's argv around `argv`. With `workspace_fd` the workspace is bound from that
    descriptor (bubblewrap closes it); else by its path."""
    from refloop.tools.seccomp import native_filter

    prefix = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
              "--uid", SANDBOX_ID, "--gid", SANDBOX_ID, "--cap-drop", "ALL"]
    if allow_network:
        prefix.append("--share-net")
    # The environment is the spawner's `env=` (the minimal one below), never `--setenv`:
    # every local user can read a process's command line in /proc. No reaper process
    # (`--as-pid-1`): the command is the namespace's init, and every process it leaves
    # dies with it; one fewer process to start saves about a third of the cost.
    prefix += ["--new-session", "--die-with-parent", "--as-pid-1"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            prefix += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            prefix += ["--ro-bind", path, path]
    prefix += _masks()
    prefix += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev",
               "--tmpfs", "/tmp"]
    for path in extra_ro:  # after /tmp: a path under it stays visible
        if os.path.exists(path):
            prefix += ["--ro-bind", path, path]
    ws = str(workspace)
    fds: list[int] = []
    if workspace_fd is not None:
        fds.append(workspace_fd)
        prefix += ["--bind-fd", str(workspace_fd), ws]
    else:
        prefix += ["--bind", ws, ws]
    for path in hidden:  # refloop's own state, should it sit inside the workspace
        covered = any(other in path.parents for other in hidden)
        if path != workspace and workspace in path.parents and path.is_dir() and not covered:
            prefix += ["--tmpfs", str(path)]
    program = native_filter()
    if program is not None:
        fds.append(_memfd("refloop-seccomp", program))
        prefix += ["--seccomp", str(fds[-1])]
    prefix += ["--chdir", ws, "--"]
    return SandboxedCommand(argv=[*prefix, *argv], env={}, pass_fds=tuple(fds))


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def resource_limits(settings: Settings) -> dict[str, int]:
    """Per command: CPU seconds, address space, largest file, processes of the user."""
    return {
        "cpu_s": int(settings.refloop_cmd_timeout_s) + 1,
        "address_space": settings.refloop_cmd_memory_mb * MIB,
        "file_size": settings.refloop_cmd_file_mb * MIB,
        "processes": settings.refloop_cmd_max_processes,
    }


def limits_prologue(limits: Mapping[str, int]) -> str:
    """Shell that sets the limits (soft and hard) or stops: one `ulimit` per option, as dash
    takes only one; the process limit is `-u` in bash and `-p` in dash. File sizes count
    512-byte blocks in both (POSIX)."""
    steps = [f"ulimit -t {limits['cpu_s']}", f"ulimit -v {limits['address_space'] // 1024}",
             f"ulimit -f {limits['file_size'] // 512}", "ulimit -c 0",
             f"{{ ulimit -u {limits['processes']} 2>/dev/null || "
             f"ulimit -p {limits['processes']}; }}"]
    return " && ".join(steps) + " || exit 126\n"


def limited(argv: list[str], limits: Mapping[str, int]) -> list[str]:
    """`argv` started by a shell that sets the limits first: a `sh -c SCRIPT` gets them
    prepended (no second program), anything else is exec'd by that shell."""
    prologue = limits_prologue(limits)
    if len(argv) == 3 and argv[0] in ("/bin/sh", "sh") and argv[1] == "-c":
        return [argv[0], "-c", prologue + argv[2]]
    return ["/bin/sh", "-c", prologue + 'exec "$@"', "sh", *argv]


def sandboxed_command(argv: list[str], *, workspace: Path, allow_network: bool,
                      env: Mapping[str, str], settings: Settings,
                      workspace_fd: int | None = None) -> SandboxedCommand:
    """How to start `argv` confined to `workspace` (or unconfined, when chosen). Start it
    with `pass_fds`, then `close()` it; `workspace_fd` (a pinned directory descriptor, owned
    by the result from now on) binds the workspace instead of its path."""
    full_env = {**BASE_ENV, **env}
    limits = resource_limits(settings)
    if sandbox_mode(settings) == "none":
        if workspace_fd is not None:
            os.close(workspace_fd)
        return SandboxedCommand(argv=limited(argv, limits), env=full_env, sandboxed=False,
                                limits=limits)
    hidden = tuple(Path(p).resolve() for p in (settings.refloop_data_dir, settings.index_dir,
                                                settings.journal_dir))
    command = _bwrap_command(shutil.which("bwrap") or "bwrap", Path(workspace),
                             limited(argv, limits), allow_network,
                             tuple(settings.sandbox_ro_paths), hidden, workspace_fd)
    command.env, command.limits = full_env, limits
    return command


def with_fds_from_files(command: SandboxedCommand, directory: Path) -> list[str]:
    """The argv of `command` for a spawner that cannot pass descriptors (the MCP client):
    each descriptor's content goes to a private file that a shell reopens, as 3, 4...
    (sh takes one digit), before it execs bubblewrap. Directory descriptors are not
    supported here: bind the workspace by path."""
    redirects, argv = [], list(command.argv)
    for number, fd in enumerate(command.pass_fds, start=3):
        path = directory / f"fd-{os.getpid()}-{number}"
        with open(path, "wb") as handle:
            os.lseek(fd, 0, os.SEEK_SET)
            handle.write(os.read(fd, 1 << 20))
        os.chmod(path, 0o600)
        redirects.append(f"{number}<{shlex.quote(str(path))}")
        argv = [str(number) if arg == str(fd) and prev in FD_OPTIONS else arg
                for prev, arg in zip(["", *argv[:-1]], argv, strict=True)]
    command.close()
    if not redirects:
        return argv
    return ["/bin/sh", "-c", f'exec "$@" {" ".join(redirects)}', "sh", *argv]


UNSANDBOXED_WARNING = (
    "UNSANDBOXED: REFLOOP_SANDBOX=none, so the model's commands run with this worker's full "
    "authority (files, network, processes). Use it only on a machine you can throw away."
)
