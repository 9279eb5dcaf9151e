"""A root worker's commands die with it, `kill -9` of the worker included.

bubblewrap's `--die-with-parent` asks the kernel to SIGKILL the sandbox's first process
when bubblewrap's outer process (the worker's child) dies. The kernel sends that signal
with the dying parent's credentials and checks them as kill(2) does. Where the outer
process and the command are the same uid (an unprivileged worker; a root worker's former
profile; a command started through `setpriv`) it holds. On a root worker's own path
(`bwrap --userns`, `refloop.tools.identity`) the outer process is host root with every
capability dropped and the command another uid: the signal is refused, and the command
lives on, reparented, for as long as it likes.

What holds there instead: every process of such a command is in one of the user namespaces
this worker made (`identity.user_namespace`, one per identity, used by no one else), and
none can leave it (no `setns` nor `unshare`: seccomp; no user namespace below it). A
reaper, started once per worker as root in a session of its own, is told each of those
namespaces, then reads its stdin, a pipe whose only writer is the worker (its lifeline).
However the worker ends, the kernel closes that end; the reaper reads end-of-file and kills
every process in those namespaces (bubblewrap's outer processes included), scanning until
none is left. Each sandbox's first process is among them, and with it the kernel kills the
rest of its pid namespace. The reaper is host root: no command can signal it, trace it or
hold its pipe open (the worker's end is never passed to a child).

Should the reaper be gone while the worker lives (only root could kill it), the next command
starts a new one and tells it every namespace again (`guard`).
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from dataclasses import dataclass, field

# The reaper: collects "dev:inode" lines until end-of-file, then SIGKILLs every process
# whose user namespace is one of them (pidfd first, so a reused pid is never hit), until a
# scan finds none.
_REAPER = r"""
import os, signal, time
for number in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
    signal.signal(number, signal.SIG_IGN)
watched, rest = set(), b""
while chunk := os.read(0, 4096):
    *lines, rest = (rest + chunk).split(b"\n")
    watched.update(line.decode() for line in lines if line)
me = os.getpid()
for _ in range(200):
    killed = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            pidfd = os.pidfd_open(int(name))
        except OSError:
            continue
        try:
            info = os.stat(f"/proc/{name}/ns/user")
            if f"{info.st_dev}:{info.st_ino}" in watched:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed += 1
        except OSError:
            pass
        finally:
            os.close(pidfd)
    if not killed:
        break
    time.sleep(0.005)
"""


@dataclass
class _Reaper:
    lifeline: int  # the worker's end of the reaper's stdin
    pidfd: int
    owner: int  # the worker process that started it (a forked child does not own it)


@dataclass
class _State:
    reaper: _Reaper | None = None
    watched: list[str] = field(default_factory=list)  # "dev:inode" of each namespace


_state = _State()


def guard(user_namespace: int | None = None) -> bool:
    """Makes sure this worker's reaper runs and knows `user_namespace` (a descriptor) and
    every namespace given before; True when it does. Costs a poll of the reaper per call
    once it runs."""
    if user_namespace is not None:
        info = os.fstat(user_namespace)
        key = f"{info.st_dev}:{info.st_ino}"
        if key in _state.watched:
            user_namespace = None
        else:
            _state.watched.append(key)
    reaper = _state.reaper
    if reaper is not None and reaper.owner == os.getpid() and not _ended(reaper.pidfd):
        if user_namespace is None:
            return True
        return _tell(reaper, _state.watched[-1:])
    if reaper is not None and reaper.owner == os.getpid():
        for fd in (reaper.lifeline, reaper.pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)
    _state.reaper = _start()
    return _state.reaper is not None and _tell(_state.reaper, _state.watched)


def _ended(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def _tell(reaper: _Reaper, keys: list[str]) -> bool:
    data = "".join(f"{key}\n" for key in keys).encode()
    try:
        while data:  # a few lines: far below a pipe's capacity, never blocks
            data = data[os.write(reaper.lifeline, data):]
    except OSError:
        return False
    return True


def _start() -> _Reaper | None:
    read_end, write_end = os.pipe()  # not inheritable: no child of the worker gets either
    try:
        reaper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER], stdin=read_end,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={}, start_new_session=True)
    except OSError:
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
    try:
        pidfd = os.pidfd_open(reaper.pid)
    except OSError:
        os.close(write_end)
        return None
    return _Reaper(write_end, pidfd, os.getpid())
