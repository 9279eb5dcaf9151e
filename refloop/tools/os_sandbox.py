"""The OS sandbox every command the model writes runs in (bubblewrap), with resource limits.

`sandboxed_command` turns an argv into the argv, environment and descriptors to start it
with. Under bubblewrap the command sees, read-only, the system directories (/usr, /etc,
/lib*, /bin, /sbin) and, read-write, the task's workspace; a private /tmp, a fresh /proc and
/dev, and nothing else of the host: not the data dir, not /root, not other workspaces, not
the worker's processes. It gets no network unless the task allows it, a new session, and
dies with the worker, however the worker dies (`--die-with-parent`; on a root worker's
path, where that does not hold, `refloop.tools.lifeline`). Its environment is an
allowlist, never the worker's.

It never holds a privilege or the identity of the host's root, even when the worker is root:
it runs as `nobody` in a user namespace mapped to an unprivileged host uid
(`refloop.tools.identity`; a root worker makes one per identity, which bubblewrap joins),
with every capability dropped and no further user namespace;
/proc/sys is read-only; a few credential files of /etc are hidden; a seccomp filter
(`refloop.tools.seccomp`) refuses tracing, mounting, keyrings, BPF, namespaces, kernel
modules and set-id bits. The workspace is bound from the descriptor the tool call pinned
(`sandbox.pin_workspace`), never by a path that could have been swapped.

A command is one accounted unit: where the worker may make cgroups, all its processes and
every byte they hold in memory, tmpfs included, count against one memory and one process
limit (`refloop.tools.cgroups`), joined before the command starts (bubblewrap waits for
its options, which the spawner hands it in `SandboxedCommand.admit`). Its /tmp and
/dev/shm are tmpfs mounts of at most half the memory limit each, and /dev itself is
read-only, so a worker without cgroups still bounds what a command can park in memory
files. Per-process limits (CPU,
memory, file size, processes) are set by the sandbox's own shell (`ulimit`) before the
command starts.

`REFLOOP_SANDBOX=none` runs commands unconfined; it is never chosen silently: when bubblewrap
is missing or broken, and the setting is not `none`, `sandbox_mode` raises.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from refloop.settings import Settings
from refloop.tools.cgroups import CommandGroup, Gate, accounting
from refloop.tools.identity import Identity, command_identity, hand_over, reachable, user_namespace
from refloop.tools.lifeline import guard
from refloop.tools.sandbox import RESERVED, below, state_dirs

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
# How old the system directories' and credential masks' options may be (`_system_options`).
RECHECK_S = 5
# bubblewrap options that take a descriptor number.
FD_OPTIONS = frozenset({"--seccomp", "--bind-fd", "--ro-bind-fd", "--ro-bind-data"})


@dataclass
class SandboxedCommand:
    """How to start one command: `pass_fds` are inherited by the spawn and must be closed
    by the caller right after it (`close`): bubblewrap has what it needs by then."""

    argv: list[str]
    env: dict[str, str]
    sandboxed: bool = True
    limits: dict[str, int] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()
    group: CommandGroup | None = None  # the command's cgroup, when the worker may make one
    identity: Identity | None = None  # the host uid a root worker starts bubblewrap as
    preexec_fn: Callable[[], None] | None = None  # kept for callers; always None (vfork)
    # With a group: bubblewrap waits for its options until `admit` joined it to the group.
    gate: Gate | None = None

    def profile(self) -> list[str]:
        """The argv with bubblewrap's options in line, wherever they travel (a gated
        command reads them from a pipe): what the sandbox is, for tests and diagnostics."""
        if self.gate is None:
            return list(self.argv)
        at = self.argv.index("--args")
        return [*self.argv[:at], *self.gate.options, *self.argv[at + 2:]]

    def oom_killed(self) -> bool:
        return self.group is not None and self.group.oom_killed()

    async def admit(self, pid: int) -> bool:
        """Once spawned (`pid`: bubblewrap's): the command joins its group, then runs.
        False: bubblewrap ended first (its output says why). Every spawner of a command
        with a gate calls this (or `admit_blocking`), else the command never runs. Never
        waits: bubblewrap is blocked reading its options."""
        return self.admit_blocking(pid)

    def admit_blocking(self, pid: int, timeout_s: float = 0) -> bool:
        """`admit` for a synchronous caller (`timeout_s`: kept for callers; nothing is
        waited for)."""
        self._close_passed()
        if self.gate is None or self.group is None:
            return True
        return self.gate.admit(self.group, pid)

    def run(self, *, timeout_s: float, cwd: str = "/") -> subprocess.CompletedProcess[bytes]:
        """Runs the command to its end, output captured (spawn, `admit`, wait), then
        `close`s it. Raises OSError or subprocess.TimeoutExpired (the command killed)."""
        try:
            with subprocess.Popen(self.argv, cwd=cwd, env=self.env, pass_fds=self.pass_fds,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, start_new_session=True) as process:
                try:
                    self.admit_blocking(process.pid, timeout_s)
                    out, errors = process.communicate(timeout=timeout_s)
                finally:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
            return subprocess.CompletedProcess(self.argv, process.returncode, out, errors)
        finally:
            self.close()

    def _close_passed(self) -> None:
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pass_fds = ()

    def close(self) -> None:
        """Closes the descriptors; once the command is over, also kills what is left of it
        and removes its group."""
        self._close_passed()
        if self.gate is not None:
            self.gate.close()
            self.gate = None
        if self.group is not None:
            self.group.close()
            self.group = None


def sandbox_mode(settings: Settings) -> SandboxMode:
    """`none` only when chosen; otherwise bubblewrap, or an error saying why it can't run."""
    wanted = (settings.refloop_sandbox or "bwrap").strip().lower()
    if wanted == "none":
        return "none"
    if wanted != "bwrap":
        raise SandboxUnavailableError(
            f"REFLOOP_SANDBOX={wanted!r} is not supported (use bwrap, or none to run "
            "commands unconfined)")
    problem = _bwrap_problem(_bwrap())
    if problem:
        raise SandboxUnavailableError(
            f"the command sandbox (bubblewrap) cannot run: {problem}. Install it "
            "(apt-get install bubblewrap) and allow user namespaces, or set "
            "REFLOOP_SANDBOX=none to run the model's commands unconfined")
    return "bwrap"


def _bwrap() -> str:
    """bubblewrap's path on this PATH ('' when missing): looked up once per PATH."""
    return _which("bwrap", os.environ.get("PATH", os.defpath), shutil.which)


@functools.lru_cache(maxsize=8)
def _which(program: str, path: str, which: Callable[[str], str | None]) -> str:
    return which(program) or ""  # `path`: the key (which reads the same PATH)


@functools.cache
def _bwrap_problem(bwrap: str) -> str:
    """Empty when the real profile runs `true`; else what went wrong (probed once)."""
    if not bwrap:
        return "`bwrap` is not on PATH"
    with tempfile.TemporaryDirectory(prefix="refloop-probe-") as probe:
        os.chmod(probe, 0o755)  # a root worker probes as its commands' unprivileged uid
        # As a root worker's commands start it: as an unprivileged uid (65534 here).
        identity = command_identity(os.stat(probe), 65534, 65534)
        userns = _held_userns(identity)
        command = _bwrap_command(bwrap, Path(probe), ["true"], allow_network=False,
                                 userns_fd=userns)
        if identity is not None and userns is None:
            command.argv = [*identity.setpriv_prefix(), *command.argv]
        command.env = dict(BASE_ENV)
        try:
            done = command.run(timeout_s=10)
        except (OSError, subprocess.TimeoutExpired) as err:
            return str(err)
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
    return ""


@functools.cache
def root_only_entries() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(files, directories) under the bound system directories that are not world-readable
    but that this worker can read: only for a root worker whose commands cannot run as an
    unprivileged uid (`identity.reachable`), whose uid then maps to root's and would read
    them (for an ordinary user there are usually none, and
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


def _masks(root_only: bool, reader: Identity | None = None) -> list[str]:
    """Hides the credential files, and with `root_only` what only root may read. With a
    `reader` (the unprivileged host identity bubblewrap starts as), only what that
    identity could read at all: the rest is closed to it by construction, and each mount
    costs about 0.3 ms of CPU."""
    argv = []
    files, dirs = root_only_entries() if root_only else ((), ())
    for path in (*MASKED_FILES, *files):
        if os.path.isfile(path) and (reader is None or _may_read(path, reader)):
            argv += ["--ro-bind", "/dev/null", path]
    for path in (*MASKED_DIRS, *dirs):
        if os.path.isdir(path) and (reader is None or _may_read(path, reader)):
            argv += ["--tmpfs", path]
    return argv


def _may_read(path: str, reader: Identity) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return True  # unknown: hidden all the same
    if info.st_uid == reader.uid:
        return bool(info.st_mode & stat.S_IRUSR)
    if info.st_gid == reader.gid:
        return bool(info.st_mode & stat.S_IRGRP)
    return bool(info.st_mode & stat.S_IROTH)


def _held_userns(identity: Identity | None) -> int | None:
    """The worker's descriptor of `identity`'s user namespace (never closed)."""
    return user_namespace(identity) if identity is not None else None


class RefusedBindError(OSError):
    """A read-only bind read from a file's content that only the root-mapped profile could
    make: refused, never made as host root."""


def _closing(argv: list[str], fd: str) -> list[str]:
    """`argv` with descriptor `fd` (one digit) closed before anything of it runs."""
    if len(argv) >= 3 and argv[0] in ("/bin/sh", "sh") and argv[1] == "-c":
        return [*argv[:2], f"exec {fd}<&-\n{argv[2]}", *argv[3:]]
    return ["/bin/sh", "-c", f'exec "$@" {fd}<&-', "sh", *argv]


def _bwrap_command(bwrap: str, workspace: Path, argv: list[str], allow_network: bool,
                   extra_ro: tuple[str, ...] = (), hidden: tuple[Path, ...] = (),
                   workspace_fd: int | None = None, tmpfs_bytes: int = 512 * MIB,
                   mask_root_only: bool = False, overlays: Mapping[Path, bytes] | None = None,
                   userns_fd: int | None = None, gated: bool = False,
                   reader: Identity | None = None) -> SandboxedCommand:
    """bubblewrap's argv around `argv`. With `workspace_fd` the workspace is bound from that
    descriptor (bubblewrap closes it); else by its path. With `userns_fd` (the worker's
    own, `identity.user_namespace`) bubblewrap joins that user namespace instead of making
    one; `gated`: its options wait in a `Gate` until the worker admits it."""
    from refloop.tools.seccomp import native_filter

    fds: list[int] = []
    if userns_fd is None:
        prefix = ["--unshare-all", "--unshare-user", "--disable-userns"]
        if allow_network:
            prefix.append("--share-net")
    else:  # no user namespace below it (bubblewrap checks), nor any id but the sandbox's
        prefix = ["--userns", "", "--assert-userns-disabled",
                  "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        if not allow_network:
            prefix.append("--unshare-net")
    prefix += ["--uid", SANDBOX_ID, "--gid", SANDBOX_ID, "--cap-drop", "ALL"]
    # The environment is the spawner's `env=` (the minimal one below), never `--setenv`:
    # every local user can read a process's command line in /proc. No reaper process
    # (`--as-pid-1`): the command is the namespace's init, and every process it leaves
    # dies with it; one fewer process to start saves about a third of the cost.
    prefix += ["--new-session", "--die-with-parent", "--as-pid-1"]
    prefix += _system_options(mask_root_only, reader, int(time.monotonic() // RECHECK_S))
    # /dev is a tmpfs the command could fill: read-only, after its own sized /dev/shm.
    size = str(tmpfs_bytes)
    prefix += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev",
               "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
               "--size", size, "--tmpfs", "/tmp"]
    for path in extra_ro:  # after /tmp: a path under it stays visible
        if os.path.exists(path):
            prefix += ["--ro-bind", path, path]
    ws = str(workspace)
    if workspace_fd is not None:
        fds.append(workspace_fd)
        prefix += ["--bind-fd", str(workspace_fd), ws]
    else:
        prefix += ["--bind", ws, ws]
    for path in _inside(hidden, workspace):  # refloop's own state in the workspace
        if path.is_dir():  # looked at for each command: it may have been made since
            prefix += ["--tmpfs", str(path)]
    for path, data in (overlays or {}).items():  # files of the workspace the command sees
        fds.append(_memfd("refloop-overlay", data))  # replaced (safe_git: the repo config)
        prefix += ["--ro-bind-data", str(fds[-1]), str(path)]
    program = native_filter()
    if program is not None:
        fds.append(_memfd("refloop-seccomp", program))
        prefix += ["--seccomp", str(fds[-1])]
    prefix += ["--chdir", ws]
    gate = None
    try:
        gate = Gate(prefix) if gated else None  # options through a pipe written at `admit`
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    passed = (*fds, gate.read_end) if gate is not None else tuple(fds)
    launch: list[str] = []
    if userns_fd is not None:
        # bubblewrap keeps its --userns descriptor open into the command: a shell opens it
        # as a free digit, which the command's own shell closes first (dash takes digits).
        digit = str(min(set(range(3, 10)) - set(passed)))
        prefix[prefix.index("--userns") + 1] = digit  # the gate's options too
        launch = ["/bin/sh", "-c", f'exec "$@" {digit}</proc/{os.getpid()}/fd/{userns_fd}',
                  "sh"]
        argv = _closing(argv, digit)
    options = gate.argv() if gate is not None else prefix
    return SandboxedCommand(argv=[*launch, bwrap, *options, "--", *argv], env={},
                            pass_fds=passed, gate=gate)


@functools.lru_cache(maxsize=16)
def _system_options(mask_root_only: bool, reader: Identity | None, _period: int
                    ) -> tuple[str, ...]:
    """The read-only system directories and the credential masks: what they are is looked
    at again every RECHECK_S seconds (`_period`), not for each command (about 60 us)."""
    options: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            options += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            options += ["--ro-bind", path, path]
    return (*options, *_masks(mask_root_only, reader))


@functools.lru_cache(maxsize=64)
def _inside(hidden: tuple[Path, ...], workspace: Path) -> tuple[Path, ...]:
    """Those of `hidden` strictly inside `workspace` and not inside another of them."""
    return tuple(path for path in hidden if below(path, workspace)
                 and not any(below(path, other) for other in hidden))


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
                      workspace_fd: int | None = None, accounted: bool = True,
                      overlays: Mapping[Path, bytes] | None = None,
                      hand_over_workspace: bool = True, passes_fds: bool = True,
                      derived_ro: tuple[str, ...] = ()) -> SandboxedCommand:
    """How to start `argv` confined to `workspace` (or unconfined, when chosen). Start it
    with `pass_fds`, call `admit` with its pid, then `close()` it once it ended;
    `workspace_fd` (a pinned directory descriptor, owned by the result from now on) binds
    the workspace instead of its path. `accounted`: one cgroup for the command (a
    long-lived server goes without). `overlays`: workspace files the command sees with
    other, read-only content. `hand_over_workspace`: False for a command that only reads
    (its root-owned files stay root's). `passes_fds`: False for a spawner that cannot pass
    descriptors nor call `admit` (the MCP client): programs then take the identity and
    join the group (`setpriv`, `CommandGroup.launcher`), at a higher cost. `derived_ro`:
    read-only binds read from a file's content (an MCP server's interpreter), made only
    under an unprivileged identity: where a root worker would need its root-mapped profile
    for them, RefusedBindError."""
    full_env = {**BASE_ENV, **env}
    limits = resource_limits(settings)
    if sandbox_mode(settings) == "none":
        if workspace_fd is not None:
            os.close(workspace_fd)
        return SandboxedCommand(argv=limited(argv, limits), env=full_env, sandboxed=False,
                                limits=limits)
    hidden = state_dirs(settings)
    group = userns = None
    gated = False
    try:
        identity = _identity_for(Path(workspace), workspace_fd, settings,
                                 hidden if hand_over_workspace else None, derived_ro)
        if derived_ro and identity is None and os.geteuid() == 0:
            raise RefusedBindError(
                f"{', '.join(derived_ro)} (read from a file) would be bound as host root, "
                f"being out of reach of uid {settings.refloop_cmd_uid} or in a workspace "
                "under a private directory: refused (REFLOOP_SANDBOX_RO_PATHS binds a path "
                "by your word)")
        if accounted and accounting().kind != "none":
            group = CommandGroup.create(accounting(), limits["address_space"],
                                        limits["processes"])
        if passes_fds:
            userns = _held_userns(identity)
            gated = group is not None
        if userns is not None and not guard(userns):  # never a command that could outlive
            raise OSError("cannot start the reaper of this worker's commands")
    except OSError:
        if workspace_fd is not None:
            os.close(workspace_fd)
        if group is not None:
            group.close()
        raise
    command = _bwrap_command(_bwrap() or "bwrap", Path(workspace),
                             limited(argv, limits), allow_network,
                             (*settings.sandbox_ro_paths, *derived_ro), hidden, workspace_fd,
                             tmpfs_bytes=limits["address_space"] // 2,
                             mask_root_only=identity is None and os.geteuid() == 0,
                             overlays=overlays, userns_fd=userns, gated=gated,
                             reader=identity)
    command.env, command.limits, command.identity = full_env, limits, identity
    command.group = group
    if identity is not None and userns is None:  # run by a root shell or not at all
        command.argv = [*identity.setpriv_prefix(), *command.argv]
    if group is not None and not gated:
        command.argv = [*group.launcher(), *command.argv]
    return command


def _identity_for(workspace: Path, workspace_fd: int | None, settings: Settings,
                  hidden: tuple[Path, ...] | None, also: tuple[str, ...] = ()
                  ) -> Identity | None:
    """A root worker's commands run as an unprivileged host uid; root's entries of a
    workspace it made are handed to that uid first (refloop's own state stays root's),
    unless `hidden` is None (a command that only reads). `also`: more paths it must reach."""
    info = os.fstat(workspace_fd) if workspace_fd is not None else os.stat(workspace)
    identity = command_identity(info, settings.refloop_cmd_uid, settings.refloop_cmd_gid)
    if identity is not None and not reachable(workspace, identity,
                                              (*settings.sandbox_ro_paths, *also)):
        return None  # bubblewrap, as that uid, could not reach it (see `reachable`)
    if identity is not None and info.st_uid == 0 and hidden is not None:
        kept = set(RESERVED)  # refloop's own state, should it sit inside the workspace
        for path in hidden:
            if workspace in path.parents:
                kept.add(path.relative_to(workspace).parts[0])
        fd = workspace_fd if workspace_fd is not None else os.open(
            workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            hand_over(fd, identity, frozenset(kept))
        finally:
            if fd != workspace_fd:
                os.close(fd)
    return identity


def with_fds_from_files(command: SandboxedCommand, directory: Path) -> list[str]:
    """The argv of `command` for a spawner that cannot pass descriptors (the MCP client):
    each descriptor's content goes to a private file that a shell reopens, as 3, 4...
    (sh takes one digit), before it execs bubblewrap. Directory descriptors are not
    supported here: bind the workspace by path. A root worker's server starts bubblewrap
    as the command identity, which may not traverse the workspace's parents: the shell,
    still root, opens the workspace for it."""
    redirects, argv = [], list(command.argv)
    number = 2
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
    if command.identity is not None:  # bubblewrap (as that uid) gets the workspace opened
        bind = argv.index("--bind")
        number, workspace = number + 1, argv[bind + 1]
        redirects.append(f"{number}<{shlex.quote(workspace)}")
        argv[bind:bind + 2] = ["--bind-fd", str(number)]
    if not redirects:
        return argv
    return ["/bin/sh", "-c", f'exec "$@" {" ".join(redirects)}', "sh", *argv]


UNSANDBOXED_WARNING = (
    "UNSANDBOXED: REFLOOP_SANDBOX=none, so the model's commands run with this worker's full "
    "authority (files, network, processes). Use it only on a machine you can throw away."
)
