"""Where tasks may work: workspace roots, refused system directories, and safe IDs.

The API accepts a workspace (or a code review's working directory) only when it resolves,
symlinks included, inside one of REFLOOP_WORKSPACE_ROOTS (default: the directory the server
was started in and `<data dir>/workspaces`). `/`, the data dir itself and system directories
are refused even when configured. The CLI (a user on their own machine) skips the roots but
still refuses `/` and system directories.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

from refloop.settings import Settings

# Client-supplied IDs (code-review task IDs, session IDs, task IDs in paths).
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ID_RE = re.compile(ID_PATTERN)

# Nothing at or under these is ever a workspace.
SYSTEM_DIRS = tuple(Path(p) for p in (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr", "/var/lib", "/var/log", "/var/run", "/var/spool", "/var/cache"))
# These directories themselves are refused; a directory below them is fine.
REFUSED_EXACT = tuple(Path(p) for p in ("/", "/home", "/root", "/tmp", "/var", "/srv", "/opt",
                                        "/mnt", "/media"))


class WorkspaceError(ValueError):
    """A workspace the server refuses; the message says why (and names the roots)."""


def is_safe_id(value: str) -> bool:
    return bool(ID_RE.fullmatch(value))


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def system_refusal(path: Path) -> str | None:
    """Why `path` (already resolved) can never be a workspace, or None."""
    if path in REFUSED_EXACT:
        return f"{path} is refused as a workspace"
    for system in SYSTEM_DIRS:
        if _inside(path, system):
            return f"{path} is inside the system directory {system}"
    return None


def data_dir(settings: Settings) -> Path:
    return settings.refloop_data_dir.resolve()


def managed_root(settings: Settings) -> Path:
    """`<data dir>/workspaces`: where tasks without a workspace get a fresh directory."""
    return data_dir(settings) / "workspaces"


def workspace_roots(settings: Settings) -> list[Path]:
    """The configured roots, resolved; unset: the server's start directory + managed root."""
    raw = settings.refloop_workspace_roots
    if raw:
        parts = [p.strip() for p in re.split(rf"[,{re.escape(os.pathsep)}]", raw) if p.strip()]
        roots = [Path(p).expanduser().resolve() for p in parts]
    else:
        roots = [Path.cwd().resolve(), managed_root(settings)]
    return roots


def check_user_workspace(raw: str | Path) -> Path:
    """The CLI's rule: any existing directory the user names, but not `/` or system dirs."""
    path = Path(raw).expanduser().resolve()
    reason = system_refusal(path)
    if reason:
        raise WorkspaceError(reason)
    if not path.is_dir():
        raise WorkspaceError(f"not a directory: {path}")
    return path


def resolve_workspace(raw: str, settings: Settings) -> Path:
    """The API's rule: an existing directory inside a workspace root, never a system dir."""
    if "\x00" in raw:
        raise WorkspaceError("workspace contains a NUL byte")
    path = Path(raw).expanduser().resolve()  # symlinks followed: the real place counts
    reason = system_refusal(path)
    data = data_dir(settings)
    if reason is None and path == data:
        reason = f"{path} is the data directory"
    if reason is None and _inside(path, data) and not _inside(path, managed_root(settings)):
        reason = f"{path} is inside the data directory"
    if reason is None and path == managed_root(settings):
        reason = f"{path} holds every task's workspace; name one below it"
    roots = workspace_roots(settings)
    allowed = [root for root in roots if system_refusal(root) is None and root != data]
    if reason is None and not any(_inside(path, root) for root in allowed):
        reason = f"{path} is outside the workspace roots"
    if reason is not None:
        names = ", ".join(str(r) for r in allowed) or "(none usable)"
        raise WorkspaceError(f"{reason}; workspaces must be inside one of: {names} "
                             "(REFLOOP_WORKSPACE_ROOTS)")
    if not path.is_dir():
        raise WorkspaceError(f"workspace {raw!r} is not an existing directory")
    return path


def fresh_workspace(settings: Settings) -> Path:
    """A new empty directory under `<data dir>/workspaces` for a task that named none."""
    path = managed_root(settings) / f"ws-{uuid.uuid4().hex[:12]}"
    path.mkdir(parents=True)
    return path
