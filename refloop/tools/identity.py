"""Who a command is on the host: never root, even when the worker is.

Inside its sandbox a command is `nobody` in its own user namespace; that namespace maps to
the host uid that started bubblewrap. For an ordinary worker that is the worker's own uid
(nothing to change). A root worker starts bubblewrap as an unprivileged host uid instead
(`command_identity`): the owner of the workspace when that is an ordinary user, else
REFLOOP_CMD_UID/GID. Files only root may read are then unreadable by construction, with no
list of them to keep. (bubblewrap resolves what it binds as that uid, so the workspace
must be reachable by it: `reachable`; a workspace under a private directory keeps the
former profile, with root-only files masked.)

How a root worker starts bubblewrap as that uid, without a program in between: bubblewrap
joins a user namespace the worker made once per identity (`user_namespace`), where the
sandbox's uid 65534 is that host uid (nothing else is mapped, so no host root and no
capability over a host file), and which may create no further user namespace
(`max_user_namespaces` 0 inside it). bubblewrap takes that uid before it sets up the
sandbox, and the worker has no supplementary groups to hand down (`drop_groups`). Where that
cannot be had (a spawner that passes no descriptors, the MCP client), `setpriv` does it:
about 2.5 ms of CPU per command more.

So that such a command can still work in a workspace the root worker made, the workspace's
root-owned entries are handed to that uid once (`hand_over`, no link followed, files with
other hard links left alone), and the worker's own writes take the owner of the directory
they land in (`sandbox.write_bytes`). The worker, being root, still reads, journals and
removes everything they create.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int

    def setpriv_prefix(self) -> list[str]:
        """The argv prefix that drops every group, then the ids, and execs the rest (a
        program, not a `preexec_fn`: with one, Python forks the worker instead of vforking
        it)."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--"]


# Run once per identity, as root: a new user namespace that may create none below it; it
# says "ready", then waits for the worker to map its ids, open its namespace and hang up.
_NAMESPACE_HOLDER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) != 0:
    sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
with open("/proc/sys/user/max_user_namespaces", "w") as limit:
    limit.write("0")
print("ready", flush=True)
sys.stdin.read()
"""
SANDBOX_ID = 65534  # the uid and gid a command has inside its sandbox


def drop_groups() -> bool:
    """A root worker keeps no supplementary group (it needs none: it is root), so that no
    process it starts inherits one; True when it has none."""
    if os.getgroups():
        with contextlib.suppress(OSError):
            os.setgroups([])
    return not os.getgroups()


@functools.cache
def user_namespace(identity: Identity) -> int | None:
    """A descriptor of the user namespace a root worker's commands of `identity` start
    bubblewrap in (`bwrap --userns`), made once per worker; None where it cannot be made
    (the caller then uses `setpriv_prefix`)."""
    if os.geteuid() != 0 or not drop_groups():
        return None
    try:
        holder = subprocess.Popen([sys.executable, "-I", "-S", "-c", _NAMESPACE_HOLDER],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env={})
    except OSError:
        return None
    assert holder.stdin is not None and holder.stdout is not None
    try:
        if holder.stdout.readline() != b"ready\n":
            return None
        proc = f"/proc/{holder.pid}"
        for name, text in (("setgroups", "deny"), ("uid_map", f"{SANDBOX_ID} {identity.uid} 1"),
                           ("gid_map", f"{SANDBOX_ID} {identity.gid} 1")):
            with open(f"{proc}/{name}", "w") as handle:
                handle.write(text)
        return os.open(f"{proc}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        holder.stdin.close()
        holder.stdout.close()
        holder.wait()


def command_identity(workspace_info: os.stat_result, default_uid: int, default_gid: int
                     ) -> Identity | None:
    """The host identity a command of this worker runs as; None: the worker's own (it is
    not root)."""
    if os.geteuid() != 0:
        return None
    if workspace_info.st_uid != 0:
        return Identity(workspace_info.st_uid, workspace_info.st_gid or default_gid)
    return Identity(default_uid, default_gid)


def hand_over(workspace_fd: int, identity: Identity, kept: frozenset[str]) -> None:
    """Give root's entries in the workspace to `identity` (a root worker's first command in
    a workspace it made). Walks directory descriptors, changes links themselves, skips the
    top-level names in `kept` (refloop's own state) and files with other hard links."""
    root = os.dup(workspace_fd)
    try:
        _give(root, ".", identity)
        for folder, dirs, files, dir_fd in os.fwalk(".", dir_fd=root, follow_symlinks=False):
            if folder == ".":
                dirs[:] = [d for d in dirs if d not in kept]
                files = [f for f in files if f not in kept]
            for name in (*dirs, *files):
                _give(dir_fd, name, identity)
    finally:
        os.close(root)


def _give(dir_fd: int, name: str, identity: Identity) -> None:
    with contextlib.suppress(OSError):
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if info.st_uid != 0 or (stat.S_ISREG(info.st_mode) and info.st_nlink > 1):
            return
        os.chown(name, identity.uid, identity.gid, dir_fd=dir_fd, follow_symlinks=False)


def reachable(workspace: Path, identity: Identity, also: tuple[str, ...] = ()) -> bool:
    """Whether `identity` may traverse every directory above the workspace, and reach each
    path of `also` (extra read-only binds: a toolchain, an MCP server's install):
    bubblewrap resolves the paths it binds as the uid that starts it. When it may not (a
    workspace under a private directory, like pytest's; an interpreter under /root), a
    root worker's command keeps the former profile: its uid maps to root's, and root-only
    files of the system directories are masked."""
    wanted = [*workspace.parents]
    for extra in also:
        path = Path(extra)
        if path.exists():
            wanted += [path, *path.parents]
    return all(_traversable(path, identity) for path in dict.fromkeys(wanted))


def _traversable(path: Path, identity: Identity) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    bit = stat.S_IXOTH if stat.S_ISDIR(info.st_mode) else stat.S_IROTH
    if info.st_mode & bit:
        return True
    if info.st_uid == identity.uid:
        return bool(info.st_mode & (bit << 6))
    return info.st_gid == identity.gid and bool(info.st_mode & (bit << 3))
