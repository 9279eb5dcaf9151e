"""Opening a path with no symbolic link followed on any component.

`openat2` with RESOLVE_NO_SYMLINKS where the kernel has it (Linux 5.6+), else one
`O_NOFOLLOW` directory descriptor per component. Used by the file tools (through
`refloop.tools.pinning`) and by the code index's reads (`refloop.search.symbols`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import stat

_SYS_OPENAT2 = 437  # the same number on every Linux architecture
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def openat2(path: str, flags: int, mode: int, dir_fd: int = _AT_FDCWD,
             beneath: bool = False) -> int:
    resolve_flags = _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                   resolve_flags | (_RESOLVE_BENEATH if beneath else 0))
    fd = _libc().syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd),
                         ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
                         ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


@functools.cache
def has_openat2() -> bool:
    """openat2 exists (Linux 5.6+) and no seccomp profile refuses it."""
    try:
        os.close(openat2("/", os.O_RDONLY | os.O_DIRECTORY, 0))
    except (OSError, AttributeError):
        return False
    return True


def walk_open(path: str, flags: int, mode: int, dir_fd: int | None = None) -> int:
    """Component by component from / (or `dir_fd`), each directory opened O_NOFOLLOW."""
    parts = [p for p in path.split("/") if p]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if dir_fd is None \
        else os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        if not parts:
            return os.dup(fd)
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        os.close(fd)


def open_regular(path: str, max_bytes: int) -> bytes | None:
    """The bytes of a regular file reached with no link followed, opened non-blocking (a
    FIFO or device is never waited on), with one name only (a hard link's other name may
    be anywhere); None for anything else or over `max_bytes`."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW
    try:
        fd = openat2(path, flags, 0) if has_openat2() else walk_open(path, flags, 0)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or info.st_size > max_bytes:
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
        return data if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)
