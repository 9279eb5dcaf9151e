"""One command, one accounted unit: a cgroup per command, from the kernel's own accounting.

Every process a command starts, and every byte it puts in memory (its private tmpfs mounts
included: shmem pages are charged to the cgroup that touched them), count against one
`memory.max` (swap off for it) and one `pids.max`, for a root worker too, where
RLIMIT_NPROC binds nothing. No watcher polls anything: the kernel refuses the fork and
OOM-kills inside the group.

Where the groups live, probed once per worker (`accounting()`):
- cgroup v2: a `refloop-commands` group under the worker's own cgroup, or under the
  hierarchy's root, whichever lets this worker enable the memory and pids controllers (a
  root worker; an ordinary user given a delegated subtree);
- cgroup v1 (a hybrid host): `refloop-commands` under the worker's own group in the memory
  and pids hierarchies, when this worker may write there (root);
- otherwise none: the command still has its per-process limits and size-limited /tmp and
  /dev/shm (see `os_sandbox`), but its processes together are not bounded.

A command joins its group before it runs, with no program in between (`Gate`): bubblewrap
starts blocked, reading its options from a pipe; the worker writes bubblewrap's pid into
the group, then the options. bubblewrap has forked nothing yet, so every process of the
command starts inside the group. Should the worker die before it writes them, bubblewrap
reads none: no mount, so no program to run. Not a shell that joins and execs bubblewrap
(about 1 ms of CPU per command), nor a `preexec_fn` (Python then forks the whole worker
instead of vforking: 5 to 15 ms of CPU), nor bubblewrap's own hold (`--info-fd` and
`--block-fd`: the worker then waits for the sandbox to be set up, and the command's shell
must check its group).

A group holds one command at a time, but is not made anew for each: making and removing a
memory cgroup costs the worker about 0.4 ms of CPU per command. Once its command is over, a
group that is empty (no process, not even an unreaped one: `pids.current` is 0) and whose
memory limit never killed anything goes back to this worker's pool (`_pool`), and the next
command takes it; any other group is killed and removed, as before. What a group carries
from one command to the next is only reclaimable memory the kernel still counts (page
cache of files the last command read): nothing of the last command runs, and its private
/tmp, /dev/shm and IPC namespace died with it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import os
import secrets
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

GROUP_DIR = "refloop-commands"
CONTROLLERS = ("memory", "pids")
# Groups whose last process was still exiting when their command returned: removed later.
_leftovers: list[Path] = []
# Empty groups ready for the next command, with their limits (this process's only).
POOL_SIZE = 8
PIPE_BYTES = 65536  # a pipe's default capacity
_pool: list[CommandGroup] = []
_pool_owner = [os.getpid()]


@dataclass(frozen=True)
class Accounting:
    """Where this worker makes its command groups, or why it cannot."""

    kind: Literal["cgroup2", "cgroup1", "none"]
    parents: tuple[Path, ...] = ()  # v2: one directory; v1: memory's, then pids'
    reason: str = ""

    def describe(self) -> str:
        if self.kind == "none":
            return ("command accounting: per process only (" + self.reason + "): each "
                    "process of a command is limited, /tmp and /dev/shm are size-limited, but "
                    "a command's processes together are not bounded; give the worker a "
                    "delegated cgroup v2 subtree (or run it as root) to bound each command "
                    "as a whole")
        return (f"command accounting: one {self.kind} group per command under "
                f"{', '.join(str(p) for p in self.parents)} (memory with tmpfs, no swap, "
                "processes)")


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of the cgroup file systems."""
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            fstype, _, options = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((left.split()[4], fstype, set(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup per controller ('' for v2) from /proc/self/cgroup."""
    paths = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _try_group_dir(base: Path, enable: bool) -> str:
    """Make base/GROUP_DIR ready for command groups; '' when it is, else why not."""
    try:
        if enable:  # v2: a child gets a controller only if its parent hands it down
            available = (base / "cgroup.controllers").read_text().split()
            missing = [c for c in CONTROLLERS if c not in available]
            if missing:
                return f"{base} has no {', '.join(missing)} controller"
            handed = (base / "cgroup.subtree_control").read_text().split()
            if any(c not in handed for c in CONTROLLERS):
                (base / "cgroup.subtree_control").write_text(
                    " ".join(f"+{c}" for c in CONTROLLERS))
        group = base / GROUP_DIR
        with contextlib.suppress(FileExistsError):
            group.mkdir()
        if enable:
            handed = (group / "cgroup.subtree_control").read_text().split()
            if any(c not in handed for c in CONTROLLERS):
                (group / "cgroup.subtree_control").write_text(
                    " ".join(f"+{c}" for c in CONTROLLERS))
        probe = group / f"probe-{os.getpid()}-{secrets.token_hex(3)}"
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        return f"{base}: {err.strerror or err}"
    return ""


@functools.cache
def accounting() -> Accounting:
    """Probed once per worker: the cgroup layout this worker may make command groups in."""
    mounts, own, reasons = _mounts(), _own_paths(), []
    for point, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        bases = dict.fromkeys([Path(point + own[""].rstrip("/")), Path(point)])
        for base in bases:
            reason = _try_group_dir(base, enable=True)
            if not reason:
                _stale(base / GROUP_DIR, "cgroup2")
                return Accounting("cgroup2", (base / GROUP_DIR,))
            reasons.append(reason)
    v1 = {}
    for point, fstype, options in mounts:
        for controller in CONTROLLERS:
            if fstype == "cgroup" and controller in options and controller in own:
                v1[controller] = Path(point + own[controller].rstrip("/"))
    if len(v1) == len(CONTROLLERS):
        v1_reasons = [_try_group_dir(v1[c], enable=False) for c in CONTROLLERS]
        if not any(v1_reasons):
            for controller in CONTROLLERS:
                _stale(v1[controller] / GROUP_DIR, "cgroup1")
            return Accounting("cgroup1", tuple(v1[c] / GROUP_DIR for c in CONTROLLERS))
        reasons += [r for r in v1_reasons if r]
    if not mounts:
        reasons.append("no cgroup file system is mounted")
    return Accounting("none", reason="; ".join(reasons) or "no memory and pids controllers")


@dataclass
class CommandGroup:
    """The cgroup(s) of one command: made with its limits, joined by the child before it
    execs, killed and removed when the command is over (`close`)."""

    accounting: Accounting
    directories: list[Path] = field(default_factory=list)

    memory_bytes: int = 0
    processes: int = 0
    # Set once every pid given to `join` is in every group; None: never joined.
    joined: bool | None = None
    _oom: bool | None = None  # what `oom_killed` found, once the command is over

    @classmethod
    def create(cls, accounting: Accounting, memory_bytes: int, processes: int
               ) -> CommandGroup:
        """An empty group with these limits: from the pool when one is free, else made."""
        _sweep()
        group = _take(accounting)
        if group is not None:
            try:
                group._limit(memory_bytes, processes)
            except OSError:
                group.close(reuse=False)
                raise
            return group
        group = cls(accounting)
        name = f"cmd-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            for parent in accounting.parents:
                path = parent / name
                path.mkdir()
                group.directories.append(path)
            group._limit(memory_bytes, processes)
        except OSError:
            group.close(reuse=False)
            raise
        return group

    def _limit(self, memory_bytes: int, processes: int) -> None:
        """Writes the limits that differ from the group's (all of them for a new group)."""
        if self.accounting.kind == "cgroup2":
            path = self.directories[0]
            if memory_bytes != self.memory_bytes:
                _write(path / "memory.max", memory_bytes)
                with contextlib.suppress(FileNotFoundError):  # no swap on this kernel
                    _write(path / "memory.swap.max", 0)
            if processes != self.processes:
                _write(path / "pids.max", processes)
        else:
            memory, pids = self.directories
            if memory_bytes != self.memory_bytes:
                # The kernel keeps memory+swap >= memory at every step: a new group (0:
                # unlimited) or a lower limit writes memory first, a higher one swap first.
                order = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
                if self.memory_bytes and memory_bytes > self.memory_bytes:
                    order.reverse()
                for name in order:
                    with contextlib.suppress(FileNotFoundError):  # swap accounting is off
                        _write(memory / name, memory_bytes)
            if processes != self.processes:
                _write(pids / "pids.max", processes)
        self.memory_bytes, self.processes = memory_bytes, processes

    def launcher(self) -> list[str]:
        """The argv prefix that moves the starting shell into every group ('0' is the
        writer), then execs the rest: `[*launcher(), program, *args]`. For a spawner that
        cannot pass descriptors (no `Gate`)."""
        joins = " && ".join(f"echo 0 > {shlex.quote(str(path / 'cgroup.procs'))}"
                            for path in self.directories)
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh"]

    @property
    def name(self) -> str:
        return self.directories[0].name

    def join(self, pids: tuple[int, ...]) -> None:
        """Writes each pid into every group of the command."""
        self.joined = False
        for path in self.directories:
            for pid in pids:
                _write(path / "cgroup.procs", pid)
        self.joined = True

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this command for its memory limit."""
        if not self.directories:
            return False
        self._oom = self._read_oom()
        return bool(self._oom)

    def _read_oom(self) -> bool | None:
        """The kernel's count says whether this group's memory limit killed anything; None
        when it keeps no such count (an old v1 kernel: the fail count, which cannot tell,
        says True)."""
        with contextlib.suppress(OSError, ValueError):
            if self.accounting.kind == "cgroup2":
                events = _read(self.directories[0] / "memory.events").split()
                return int(events[events.index("oom_kill") + 1]) > 0
            text = _read(self.directories[0] / "memory.oom_control").split()
            if "oom_kill" in text:
                return int(text[text.index("oom_kill") + 1]) > 0
            return True if int(_read(self.directories[0] / "memory.failcnt")) else None
        return None

    def close(self, reuse: bool = True) -> None:
        """Back to the pool when the command left nothing (`_reusable`); else kill whatever
        is left in the groups and remove them (later, if still busy)."""
        if reuse and self.directories and self._reusable():
            _pool.append(self)
            return
        for path in self.directories:
            _kill_all(path, self.accounting.kind)
            _remove(path)
        self.directories = []

    def _reusable(self) -> bool:
        """Whether the next command may have this group: this process made it, every join
        went through (or none was made), no process of it is left, exited or not (`pids`
        counts a task until it is reaped; the pids group holds whatever the memory group
        holds, both joined alike), and its memory limit killed nothing (so `oom_killed`
        stays this command's own word)."""
        if _pool_owner[0] != os.getpid() or len(_pool) >= POOL_SIZE or self.joined is False:
            return False
        oom = self._oom if self._oom is not None else self._read_oom()
        if oom is not False:
            return False
        try:
            return _read_int(self.directories[-1] / "pids.current") == 0
        except (OSError, ValueError):
            return False


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _read_int(path: Path) -> int:
    text = _read(path).strip()
    return 2**63 - 1 if text == "max" else int(text)


def _take(accounting: Accounting) -> CommandGroup | None:
    """A free group of this layout from the pool, ready for a command (None: none)."""
    if _pool_owner[0] != os.getpid():  # a forked child: the groups are its parent's
        _pool.clear()
        _pool_owner[0] = os.getpid()
    while _pool:
        group = _pool.pop()
        if group.accounting == accounting:
            group.joined, group._oom = None, None
            return group
        group.close(reuse=False)
    return None


def _write(path: Path, value: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _kill_all(path: Path, kind: str) -> None:
    if kind == "cgroup2":
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")
            return
    with contextlib.suppress(OSError):
        for pid in _read(path / "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def _remove(path: Path, attempts: int = 5) -> None:
    for attempt in range(attempts):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # its last processes are still exiting
            time.sleep(0.002 * (attempt + 1))
    _leftovers.append(path)


@atexit.register
def _sweep_at_exit() -> None:
    if _pool_owner[0] == os.getpid():
        while _pool:
            _pool.pop().close(reuse=False)
    for path in list(_leftovers):
        _leftovers.remove(path)
        _remove(path, attempts=20)


def _sweep() -> None:
    for path in list(_leftovers):
        _leftovers.remove(path)
        _remove(path, attempts=1)


def _stale(group_dir: Path, kind: str) -> None:
    """Groups a worker that died left behind (the pid in their name, `cmd-<pid>-...`, runs
    no more): whatever still runs in them is killed and they are removed, at the next
    worker's start. A live worker's groups are left alone."""
    with contextlib.suppress(OSError):
        for child in group_dir.iterdir():
            parts = child.name.split("-")
            if child.name.startswith("cmd-") and parts[1].isdigit() and child.is_dir() \
                    and not _running(int(parts[1])):
                for _ in range(10):  # v1 kills pid by pid: a fork may land in between
                    _kill_all(child, kind)
                    if not _procs(child):
                        break
                    time.sleep(0.01)
                _remove(child, attempts=20)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _procs(path: Path) -> list[str]:
    try:
        return _read(path / "cgroup.procs").split()
    except OSError:
        return []


class Gate:
    """bubblewrap reads its options (every mount, namespace and identity: all but the
    command) from a pipe (`--args`) that the worker writes only once it has put bubblewrap
    in the command's group (`admit`): until then bubblewrap is blocked reading, before it
    has set anything up or started any process, so every process of the command starts
    inside the group. A worker that is gone before it admits the command closes the pipe
    with nothing in it: bubblewrap then gets no mount at all, and its empty root holds no
    program to run (`/bin/sh` included): nothing of the command runs."""

    def __init__(self, options: list[str]) -> None:
        self.options = options
        # The read end is bubblewrap's: passed to it, and closed with the command's other
        # passed descriptors (never here: its number may be another's by then).
        self.read_end, self.write_end = os.pipe()

    def argv(self) -> list[str]:
        return ["--args", str(self.read_end)]

    def admit(self, group: CommandGroup, pid: int) -> bool:
        """Joins bubblewrap (`pid`, still reading its options) to `group`, then hands it
        the options; False when bubblewrap is already gone (it failed: its own message
        says why). Other errors raise; the pipe is closed either way, and bubblewrap,
        given no options, runs nothing."""
        data = b"".join(os.fsencode(option) + b"\0" for option in self.options)
        try:
            group.join((pid,))
            if len(data) > PIPE_BYTES:  # written whole at once: never blocks the worker
                fcntl.fcntl(self.write_end, fcntl.F_SETPIPE_SZ, len(data))
            view = memoryview(data)
            while view:
                view = view[os.write(self.write_end, view):]
        except (ProcessLookupError, BrokenPipeError):
            return False
        finally:
            self.close()
        return True

    def close(self) -> None:
        """Ends the pipe: bubblewrap reads whatever was written, and no more."""
        if self.write_end >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_end)
        self.write_end = -1
