"""Opening paths with no symbolic link followed, and the workspace pinned for a task.

`open_nofollow` opens an absolute path with no link followed anywhere on the way (`openat2`
with RESOLVE_NO_SYMLINKS where the kernel has it, else one `O_NOFOLLOW` directory fd per
component). The workspace itself is pinned: `open_workspace` opens its path the same way
and compares the directory with the one first seen at that path in this task (device and
inode); a component that became a link, or another directory put in its place, is
E_WORKSPACE_MOVED, and nothing is read or written. Inside `pinned_workspace` every open
under the root starts from the held descriptor (RESOLVE_BENEATH), so a swap during the call
changes nothing either; the command sandbox binds that same descriptor.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from refloop.contract.errors import ToolError
from refloop.runtime.nofollow import has_openat2, openat2, walk_open

# Workspaces pinned in this process, at most (the least recently used are forgotten).
MAX_PINS = 4096


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """An fd for `path` (absolute, normalised, under a resolved root) with no link followed;
    under the pinned workspace, opened from its held descriptor."""
    pin = _PINNED.get()
    if pin is not None and (path == pin.root or pin.root in path.parents):
        rel = path.relative_to(pin.root).as_posix() if path != pin.root else "."
        if has_openat2():
            return openat2(rel, flags | os.O_NOFOLLOW, mode, pin.fd, beneath=True)
        return walk_open(rel, flags, mode, pin.fd)
    if has_openat2():
        return openat2(str(path), flags | os.O_NOFOLLOW, mode)
    return walk_open(str(path), flags, mode)


# ---------------------------------------------------------------- the pinned workspace


class _Pin:
    def __init__(self, root: Path, fd: int) -> None:
        self.root, self.fd = root, fd


_PINNED: contextvars.ContextVar[_Pin | None] = contextvars.ContextVar("pinned", default=None)
_PINS: OrderedDict[str, tuple[int, int]] = OrderedDict()  # "task\0path" -> (dev, ino)
_PINS_LOCK = threading.Lock()


def _moved(workspace: str | Path, why: str) -> ToolError:
    return ToolError(f"E_WORKSPACE_MOVED: the workspace '{workspace}' is not the directory "
                     f"this task started in ({why}); nothing was read or written. Work only "
                     "inside the workspace, and never rename or replace it")


def open_workspace(workspace: str | Path) -> tuple[Path, int]:
    """(root, directory fd) of a workspace, opened with no link in its path, and checked
    against the directory first seen at that path by this process."""
    root = Path(os.path.normpath(os.path.abspath(workspace)))
    try:
        fd = open_nofollow_path(root)
    except OSError as err:
        if err.errno == errno.ELOOP or _through_link(root):
            raise _moved(workspace, "its path now goes through a symbolic link") from None
        raise ToolError(f"E_NO_WORKSPACE: workspace '{workspace}' does not exist") from None
    info = os.fstat(fd)
    identity, key = (info.st_dev, info.st_ino), f"{_task_scope()}\0{root}"
    with _PINS_LOCK:
        first = _PINS.setdefault(key, identity)
        _PINS.move_to_end(key)
        while len(_PINS) > MAX_PINS:
            _PINS.popitem(last=False)
    if first != identity:
        os.close(fd)
        raise _moved(workspace, "another directory was put at its path")
    return root, fd


def _task_scope() -> str:
    """Pins last for a task (its workflow): a later task may find a new checkout there."""
    from temporalio import activity

    return activity.info().workflow_id if activity.in_activity() else ""


def open_nofollow_path(path: Path) -> int:
    """A directory fd for an absolute path with no link followed on any component."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    return openat2(str(path), flags, 0) if has_openat2() else walk_open(str(path), flags, 0)


@contextlib.contextmanager
def pinned_workspace(workspace: str | Path) -> Iterator[Path]:
    """The checked root; inside, every open under it goes from its held descriptor."""
    root, fd = open_workspace(workspace)
    token = _PINNED.set(_Pin(root, fd))
    try:
        yield root
    finally:
        _PINNED.reset(token)
        os.close(fd)


def current_pin() -> _Pin | None:
    return _PINNED.get()


def pinned_fd() -> int | None:
    """A duplicate of the pinned workspace's descriptor (for the sandbox's bind), if any."""
    pin = _PINNED.get()
    return os.dup(pin.fd) if pin is not None else None


def _through_link(path: Path | None) -> bool:
    """Whether an existing component of `path` is a symbolic link (a directory link opened
    with O_DIRECTORY|O_NOFOLLOW fails with ENOTDIR, not ELOOP)."""
    if path is None:
        return False
    for candidate in (path, *path.parents):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(candidate).st_mode):
                return True
    return False
