"""Where tasks may work: workspace roots, refused system directories, and safe IDs.

The API accepts a workspace (or a code review's working directory) only when it resolves,
symlinks included, inside one of REFLOOP_WORKSPACE_ROOTS (default: the directory the server
was started in and `<data dir>/workspaces`). `/`, the data dir itself and system directories
are refused even when configured. The CLI (a user on their own machine) skips the roots but
still refuses `/` and system directories.
"""

from __future__ import annotations

import os
import posixpath
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
    """The configured roots, resolved; unset: the server's start directory. The managed
    root is always one: fresh session workspaces are made there, inside the roots."""
    raw = settings.refloop_workspace_roots
    if raw:
        parts = [p.strip() for p in re.split(rf"[,{re.escape(os.pathsep)}]", raw) if p.strip()]
        roots = [Path(p).expanduser().resolve() for p in parts]
    else:
        roots = [Path.cwd().resolve()]
    return [*roots, managed_root(settings)] if managed_root(settings) not in roots else roots


ECHO_CHARS = 80  # an error quotes at most this much of a client's input


def quote(value: object) -> str:
    text = str(value)
    return repr(text[:ECHO_CHARS] + ("…" if len(text) > ECHO_CHARS else ""))


def _resolved(raw: str | Path) -> Path:
    """The real place (symlinks followed); a path the filesystem cannot resolve (a name too
    long, a symlink loop, no permission) is a refusal, never a crash."""
    try:
        return Path(raw).expanduser().resolve()
    except RuntimeError as err:  # Python < 3.13: a symlink loop
        raise WorkspaceError(f"workspace {quote(raw)} cannot be resolved: a symlink "
                             "loop") from err
    except OSError as err:
        raise WorkspaceError(f"workspace {quote(raw)} cannot be resolved: "
                             f"{err.strerror or type(err).__name__}") from err


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def guarded_dirs(settings: Settings) -> list[tuple[str, Path]]:
    """refloop's own state: no workspace may contain one, or lie inside one (beyond the
    managed root's task directories), or a task could read another's stored content."""
    dirs = (("the data directory", data_dir(settings)),
            ("the journal directory", settings.journal_dir),
            ("the index directory", settings.index_dir))
    return [(name, d.expanduser().resolve()) for name, d in dirs]


def guard_refusal(path: Path, settings: Settings) -> str | None:
    managed = managed_root(settings)
    if path == managed:
        return f"{quote(path)} holds every task's workspace; name one below it"
    for name, guarded in guarded_dirs(settings):
        if _inside(guarded, path):
            return f"{quote(path)} is or contains {name} ({guarded})"
        if _inside(path, guarded) and not _inside(path, managed):
            return f"{quote(path)} is inside {name} ({guarded})"
    return None


def check_user_workspace(raw: str | Path) -> Path:
    """The CLI's rule: any existing directory the user names, but not `/` or system dirs."""
    path = _resolved(raw)
    reason = system_refusal(path)
    if reason:
        raise WorkspaceError(reason)
    if not _is_dir(path):
        raise WorkspaceError(f"not a directory: {quote(path)}")
    return path


def host_workspace(raw: str, host: str) -> str:
    """A workspace on another host's disk, as a client names it: absolute and normalised,
    lexically (this machine need not see it, and its links say nothing about that disk;
    the host resolves the path itself and refuses one outside its roots), never a system
    directory."""
    if "\x00" in raw:
        raise WorkspaceError("workspace contains a NUL byte")
    if not posixpath.isabs(raw):
        raise WorkspaceError(f"workspace {quote(raw)}: name an absolute path on host {host!r}")
    path = "/" + posixpath.normpath(raw).lstrip("/")
    reason = system_refusal(Path(path))
    if reason:
        raise WorkspaceError(reason)
    return path


def resolve_workspace(raw: str, settings: Settings) -> Path:
    """The API's rule: an existing directory inside a workspace root, never a system dir,
    never refloop's own state. Errors quote at most 80 characters of the input."""
    if "\x00" in raw:
        raise WorkspaceError("workspace contains a NUL byte")
    path = _resolved(raw)
    reason = system_refusal(path)
    if reason is not None:
        reason = reason.replace(str(path), quote(path), 1)
    else:
        reason = guard_refusal(path, settings)
    data = data_dir(settings)
    roots = workspace_roots(settings)
    allowed = [root for root in roots if system_refusal(root) is None and root != data]
    if reason is None and not any(_inside(path, root) for root in allowed):
        reason = f"{quote(path)} is outside the workspace roots"
    if reason is not None:
        names = ", ".join(str(r) for r in allowed) or "(none usable)"
        raise WorkspaceError(f"{reason}; workspaces must be inside one of: {names} "
                             "(REFLOOP_WORKSPACE_ROOTS)")
    if not _is_dir(path):
        raise WorkspaceError(f"workspace {quote(raw)} is not an existing directory")
    return path


def fresh_workspace(settings: Settings) -> Path:
    """A new empty directory under `<data dir>/workspaces` for a task that named none."""
    path = managed_root(settings) / f"ws-{uuid.uuid4().hex[:12]}"
    path.mkdir(parents=True)
    return path


def stale_empty_workspaces(settings: Settings, older_than_s: float, keep: set[str],
                           now: float | None = None) -> list[Path]:
    """Fresh task directories under the managed root that are still empty, untouched for
    `older_than_s`, and not in `keep` (the workspaces of tasks that still run)."""
    import time

    now = time.time() if now is None else now
    try:
        candidates = list(managed_root(settings).glob("ws-*"))
    except OSError:
        return []
    stale = []
    for path in candidates:
        try:
            if (str(path) not in keep and path.is_dir() and not path.is_symlink()
                    and now - path.stat().st_mtime >= older_than_s
                    and next(path.iterdir(), None) is None):
                stale.append(path)
        except OSError:  # removed meanwhile, or unreadable: not ours to judge
            continue
    return stale


def ensure_fresh_workspace(raw: str, settings: Settings) -> None:
    """A fresh directory removed while empty comes back when its session starts a task."""
    path = Path(raw)
    if managed_root(settings) in path.parents and not path.exists():
        path.mkdir(parents=True, exist_ok=True)
