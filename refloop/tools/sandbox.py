"""Every path a tool touches is inside the task's workspace, and is the file it names.

The workspace root is resolved once. A path from the model is checked (no NUL, not too long,
valid UTF-8), normalised lexically and must stay under the root. It is then opened with no
symbolic link followed anywhere on the way (`openat2` with RESOLVE_NO_SYMLINKS where the
kernel has it, else one `O_NOFOLLOW` directory fd per component), so a link shipped in a
repository cannot steer a read or a write out of the workspace. Writes go to a fresh
temporary file in the same directory (O_EXCL, no-follow) renamed over the target. Files with
more than one hard link are refused for reads and writes: their other name may be outside.

The workspace root is never resolved again once the task started: `workspace_root` checks
it is the same directory, with no link in its path (`refloop.tools.pinning`).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import os
import posixpath
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from refloop.contract.errors import ToolError
from refloop.contract.text import escape_controls
from refloop.settings import Settings
from refloop.tools.pinning import (  # noqa: F401  (re-exported: the file tools' one import)
    _through_link,
    current_pin,
    has_openat2,
    open_nofollow,
    open_workspace,
    pinned_fd,
    pinned_workspace,
)

INTERNAL_DIR = ".refloop"  # refloop's own state in a workspace: tools may not touch it
DATA_DIR_NAME = ".refloop-data"  # the default data dir, should it sit inside a workspace
RESERVED = frozenset({INTERNAL_DIR, DATA_DIR_NAME})
SKIPPED_DIRS = frozenset({*RESERVED, ".git", "__pycache__", "node_modules", ".venv"})
MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255
# Reads of files larger than this are refused (grep skips them): nothing loads a whole disk.
MAX_READ_FILE_BYTES = 64 * 1024 * 1024
# How many directories down a walk (grep, glob_file_search) goes, as JSON edits' depth.
MAX_WALK_DEPTH = 100
# refloop's own state, resolved, for the tool call in progress (`keeping_out`).
_STATE: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar("state", default=())


@functools.lru_cache(maxsize=32)
def _resolved(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    return tuple(Path(p).resolve() for p in paths)


def state_dirs(settings: Settings) -> tuple[Path, ...]:
    """The data dir, the index and the journal, resolved (once per worker: settings do not
    change)."""
    return _resolved((settings.refloop_data_dir, settings.index_dir, settings.journal_dir))


@contextlib.contextmanager
def keeping_out(settings: Settings) -> Iterator[None]:
    """Inside, `resolve` refuses refloop's state by its resolved path wherever it sits in the
    workspace (`app/.refloop-data`, not only a top-level name), and walks skip it."""
    token = _STATE.set(state_dirs(settings))
    try:
        yield
    finally:
        _STATE.reset(token)


def below(path: Path, folder: Path) -> bool:
    """Whether `path` is strictly inside `folder` (both absolute and normalised)."""
    return str(path).startswith(str(folder).rstrip("/") + "/")


def _path_error(err: OSError, raw: str, path: Path | None = None) -> ToolError:
    if err.errno in (errno.ENOTDIR, errno.ENOENT) and _through_link(path):
        err = OSError(errno.ELOOP, "link")
    if err.errno == errno.ELOOP:
        return ToolError(f"E_SYMLINK: '{raw}' goes through a symbolic link; the file tools "
                         "never follow links (read the link's target by its own path)")
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return ToolError(f"E_NOT_FOUND: '{raw}' does not exist")
    if err.errno == errno.ENAMETOOLONG:
        return ToolError(f"E_INVALID_PATH: '{raw[:100]}' is too long")
    if err.errno == errno.EISDIR:
        return ToolError(f"E_IS_DIR: '{raw}' is a directory")
    return ToolError(f"E_IO: '{raw}': {err.strerror or err}")


def workspace_root(workspace: str | Path) -> Path:
    """The workspace's path, checked (no link in it, the directory pinned): never resolved
    again, as a link put in its path since the task started would steer every tool."""
    if "\x00" in str(workspace):
        raise ToolError("E_NO_WORKSPACE: the workspace path contains a NUL byte")
    root, fd = open_workspace(workspace)
    os.close(fd)
    return root


def check_path_text(raw: object) -> str:
    """A path the model wrote, refused with a readable reason when malformed."""
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("E_INVALID_ARGS: path must be a non-empty string")
    if "\x00" in raw:
        raise ToolError("E_INVALID_PATH: the path contains a NUL byte")
    if len(raw) > MAX_PATH_CHARS:
        raise ToolError(f"E_INVALID_PATH: the path is longer than {MAX_PATH_CHARS} characters")
    try:
        encoded = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("E_INVALID_PATH: the path is not valid UTF-8") from None
    if any(len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")):
        raise ToolError(f"E_INVALID_PATH: a name in the path is longer than {MAX_NAME_BYTES} "
                        "bytes")
    return raw


def resolve(root: Path, raw: str) -> Path:
    """The workspace path `raw` names (lexically; links are refused when it is opened)."""
    check_path_text(raw)
    joined = raw if raw.startswith("/") else posixpath.join(str(root), raw)
    resolved = Path(posixpath.normpath(joined))
    if resolved != root and root not in resolved.parents:
        raise ToolError(f"E_PATH_ESCAPE: '{raw}' resolves outside the workspace")
    parts = resolved.relative_to(root).parts
    if parts and parts[0] in RESERVED or any(
            below(state, root) and (resolved == state or below(resolved, state))
            for state in _STATE.get()):
        raise ToolError(f"E_PATH_RESERVED: '{raw}' is refloop's internal state")
    return resolved


def relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() or "."


# ---------------------------------------------------------------- entries


def lstat(path: Path) -> os.stat_result | None:
    """The entry itself (a link is a link), or None when it or a parent is missing."""
    try:
        parent = open_nofollow(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR) and not _through_link(path.parent):
            return None
        raise _path_error(err, str(path), path) from None
    try:
        return os.stat(path.name, dir_fd=parent, follow_symlinks=False) if path.name else \
            os.fstat(parent)
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)


def kind(path: Path) -> str | None:
    """'file', 'dir', 'link', 'other', or None when missing."""
    info = lstat(path)
    if info is None:
        return None
    if stat.S_ISREG(info.st_mode):
        return "file"
    if stat.S_ISDIR(info.st_mode):
        return "dir"
    return "link" if stat.S_ISLNK(info.st_mode) else "other"


def is_file(path: Path) -> bool:
    return kind(path) == "file"


def is_dir(path: Path) -> bool:
    return kind(path) == "dir"


def read_bytes(path: Path, raw: str, limit: int = MAX_READ_FILE_BYTES) -> bytes:
    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise _path_error(err, raw, path) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"E_NOT_FOUND: '{raw}' is not a file")
        if info.st_nlink > 1:
            raise ToolError(f"E_HARDLINK: '{raw}' has {info.st_nlink} hard links; the file "
                            "tools refuse them, as another name may be outside the workspace")
        if info.st_size > limit:
            raise ToolError(f"E_TOO_LARGE: '{raw}' is {info.st_size} bytes; the limit is "
                            f"{limit}")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ToolError(f"E_TOO_LARGE: '{raw}' is larger than {limit} bytes")
    return data


def read_text(path: Path, raw: str, limit: int = MAX_READ_FILE_BYTES) -> str:
    try:
        return read_bytes(path, raw, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"E_BINARY: '{raw}' is not a UTF-8 text file") from None


def _open_parent(path: Path, create: bool) -> int:
    """The fd of path's directory, creating missing directories (no link followed)."""
    try:
        return open_nofollow(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        if not create:
            raise
    pin = current_pin()
    if pin is not None and pin.root in path.parents:
        fd, parts = os.dup(pin.fd), path.parent.relative_to(pin.root).parts
    else:
        fd, parts = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), \
            path.parent.parts[1:]
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
                take_directory_owner(fd, part)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.dup(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes, raw: str | None = None,
                limit: int | None = None) -> None:
    """Atomic (temp file + rename in the same directory); refuses links and hard links."""
    raw = raw or path.name
    if limit is not None and len(data) > limit:
        raise ToolError(f"E_TOO_LARGE: writing {len(data)} bytes to '{raw}'; the limit is "
                        f"{limit} (REFLOOP_MAX_WRITE_BYTES)")
    try:
        parent = _open_parent(path, create=True)
    except OSError as err:
        raise _path_error(err, raw, path) from None
    temp = f".{path.name[:200]}.{secrets.token_hex(6)}.refloop-tmp"
    try:
        mode = 0o644
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                raise ToolError(f"E_IS_DIR: '{raw}' is a directory")
            if stat.S_ISLNK(info.st_mode):
                raise ToolError(f"E_SYMLINK: '{raw}' is a symbolic link; the file tools "
                                "never write through links")
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"E_NOT_FOUND: '{raw}' is not a regular file")
            if info.st_nlink > 1:
                raise ToolError(f"E_HARDLINK: '{raw}' has {info.st_nlink} hard links; the "
                                "file tools do not write to it")
            mode = stat.S_IMODE(info.st_mode)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=parent)
        try:
            take_directory_owner(parent, temp)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.rename(temp, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent)
            raise
    except OSError as err:
        raise _path_error(err, raw, path) from None
    finally:
        os.close(parent)


def take_directory_owner(parent: int, name: str) -> None:
    """A root worker's new entry belongs to whoever owns its directory: in a workspace
    handed to the commands' uid (`refloop.tools.identity`), they can still change it."""
    if os.geteuid() == 0:
        owner = os.fstat(parent)
        if owner.st_uid != 0:
            os.chown(name, owner.st_uid, owner.st_gid, dir_fd=parent, follow_symlinks=False)


def write_text(path: Path, text: str, raw: str | None = None, limit: int | None = None) -> None:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("E_INVALID_ARGS: the content is not valid UTF-8 text") from None
    write_bytes(path, data, raw, limit)


def unlink(path: Path, raw: str | None = None) -> None:
    """Remove the entry itself (a link, never its target); missing is fine."""
    raw = raw or path.name
    try:
        parent = open_nofollow(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return
    except OSError as err:
        raise _path_error(err, raw, path) from None
    try:
        os.unlink(path.name, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as err:
        raise _path_error(err, raw, path) from None
    finally:
        os.close(parent)


def list_entries(path: Path, raw: str) -> list[tuple[str, bool]]:
    """(name, is a directory) of a workspace directory; links are never followed."""
    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        if err.errno == errno.ENOTDIR and not _through_link(path):
            raise ToolError(f"E_NOT_FOUND: '{raw}' is not a directory") from None
        raise _path_error(err, raw, path) from None
    try:
        with os.scandir(fd) as entries:
            return sorted((entry.name, entry.is_dir(follow_symlinks=False))
                          for entry in entries)
    finally:
        os.close(fd)


class Walk:
    """Files under a workspace directory, sorted, skipping refloop's state and vendored
    folders; directory links are never entered. Iterative, so no tree is too deep to walk:
    it goes MAX_WALK_DEPTH directories down (paths of at most MAX_PATH_CHARS), and
    `too_deep` counts the directories it left below that."""

    def __init__(self, start: Path) -> None:
        self.start, self.too_deep = start, 0

    def note(self) -> str:
        """What the answer misses, said plainly ('' when nothing)."""
        if not self.too_deep:
            return ""
        return (f"\n[... {self.too_deep} directories more than {MAX_WALK_DEPTH} levels down "
                "(or past the path length limit) were not searched: name a path inside them]")

    def __iter__(self) -> Iterator[Path]:
        try:
            fd: int | None = open_nofollow(self.start, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        hidden = {state for state in _STATE.get() if below(state, self.start)}
        folder = self.start
        stack: list[tuple[int, Path, Iterator[str]]] = []  # the folders above, open
        try:
            while True:
                if fd is not None:
                    dirs, files = _entries(fd)
                    for name in files:
                        yield folder / name
                    dirs = [d for d in dirs if d not in SKIPPED_DIRS and folder / d not in hidden]
                    # A child's files must still be openable by path (PATH_MAX).
                    if len(stack) >= MAX_WALK_DEPTH or len(os.fsencode(folder)) \
                            + 2 * (MAX_NAME_BYTES + 1) > MAX_PATH_CHARS:
                        self.too_deep += len(dirs)
                        os.close(fd)
                    else:
                        stack.append((fd, folder, iter(dirs)))
                    fd = None
                if not stack:
                    return
                parent_fd, parent, rest = stack[-1]
                name = next(rest, None)
                if name is None:
                    stack.pop()
                    os.close(parent_fd)
                    continue
                with contextlib.suppress(OSError):  # a link now, or gone: not entered
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, dir_fd=parent_fd)
                    folder = parent / name
        finally:
            for held, _, _ in stack:
                os.close(held)
            if fd is not None:
                os.close(fd)


def _entries(fd: int) -> tuple[list[str], list[str]]:
    """(directories, everything else) of an open directory, each sorted; a link is not a
    directory."""
    dirs, files = [], []
    with os.scandir(fd) as entries:
        for entry in entries:
            (dirs if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
    return sorted(dirs), sorted(files)


def shown(name: str, keep: str = "") -> str:
    """A name as text that always serialises and says what it is: bytes that are not UTF-8
    (a file name the OS gave as lone surrogates) shown escaped, `\\xff`, and so are control
    characters (a newline in a name would forge a line of a listing; ESC would reach a
    terminal). `keep`: controls left as they are (a command's output keeps its newlines)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        name = "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF
                       else f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c
                       for c in name)
    return escape_controls(name, keep)


def line_count(text: str) -> int:
    return len(text.splitlines())


def numbered(text: str, start: int = 1) -> str:
    return "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(text.splitlines(), start=start))


def truncate_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", errors="ignore")
    return f"{kept}\n[... truncated {len(data) - limit} bytes ...]"
