"""The seccomp filter every sandboxed command runs under, built as classic BPF by hand.

bubblewrap loads it (`--seccomp FD`) just before it executes the command. It denies what an
agent's command never needs: tracing other processes, mounting, the kernel keyring, BPF,
new namespaces, kernel modules and kexec, io_uring (it would bypass this filter), reading
other processes' memory, and setting the set-user-ID or set-group-ID bit on a file (chmod,
a file created with those bits, mknod). A denied call fails with EPERM; clone3 and openat2
fail with ENOSYS, so the C library falls back to clone and openat, which the filter can
inspect. Calls of another ABI (32-bit, x32) are refused outright.

No library: the program is a few dozen 8-byte instructions (struct sock_filter).
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

# struct seccomp_data: nr (u32), arch (u32), ip (u64), args[6] (u64); little endian.
_NR, _ARCH = 0, 4


def _arg(index: int) -> int:
    return 16 + 8 * index  # the low 32 bits of a little-endian u64


_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
ALLOW = 0x7FFF0000
_ERRNO = 0x00050000

SETID_BITS = 0o6000
O_CREAT, O_TMPFILE_BIT = 0o100, 0o20000000
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
NEW_NAMESPACES = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000

DENIED = ("ptrace", "mount", "umount2", "pivot_root", "swapon", "swapoff", "reboot",
          "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
          "keyctl", "add_key", "request_key", "bpf", "unshare", "setns", "perf_event_open",
          "userfaultfd", "open_by_handle_at", "name_to_handle_at", "process_vm_readv",
          "process_vm_writev", "acct", "syslog", "iopl", "ioperm", "quotactl",
          "lookup_dcookie", "settimeofday", "clock_settime", "adjtimex", "clock_adjtime",
          "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
          "mount_setattr", "io_uring_setup", "io_uring_enter", "io_uring_register", "kcmp",
          "vhangup")
NOT_IMPLEMENTED = ("clone3", "openat2")
# syscall -> index of its mode argument: refused when the mode has a set-id bit
MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "mknod": 1,
            "mknodat": 2, "creat": 1}
# syscall -> (flags argument, mode argument): refused when creating with a set-id bit
OPEN_ARGS = {"open": (1, 2), "openat": (2, 3)}

_X86_64 = {
    "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "swapon": 167,
    "swapoff": 168, "reboot": 169, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "keyctl": 250,
    "add_key": 248, "request_key": 249, "bpf": 321, "unshare": 272, "setns": 308,
    "perf_event_open": 298, "userfaultfd": 323, "open_by_handle_at": 304,
    "name_to_handle_at": 303, "process_vm_readv": 310, "process_vm_writev": 311,
    "acct": 163, "syslog": 103, "iopl": 172, "ioperm": 173, "quotactl": 179,
    "lookup_dcookie": 212, "settimeofday": 164, "clock_settime": 227, "adjtimex": 159,
    "clock_adjtime": 305, "vhangup": 153, "kcmp": 312, "chmod": 90, "fchmod": 91,
    "fchmodat": 268, "mknod": 133, "mknodat": 259, "creat": 85, "open": 2, "openat": 257,
    "clone": 56,
}
_AARCH64 = {
    "ptrace": 117, "mount": 40, "umount2": 39, "pivot_root": 41, "swapon": 224,
    "swapoff": 225, "reboot": 142, "init_module": 105, "finit_module": 273,
    "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "keyctl": 219,
    "add_key": 217, "request_key": 218, "bpf": 280, "unshare": 97, "setns": 268,
    "perf_event_open": 241, "userfaultfd": 282, "open_by_handle_at": 265,
    "name_to_handle_at": 264, "process_vm_readv": 270, "process_vm_writev": 271,
    "acct": 89, "syslog": 116, "quotactl": 60, "lookup_dcookie": 18, "settimeofday": 170,
    "clock_settime": 112, "adjtimex": 171, "clock_adjtime": 266, "vhangup": 58,
    "kcmp": 272, "fchmod": 52, "fchmodat": 53, "mknodat": 33, "openat": 56, "clone": 220,
}
_UNIFIED = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
            "fsmount": 432, "fspick": 433, "mount_setattr": 442, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "clone3": 435, "openat2": 437,
            "fchmodat2": 452}
# machine -> (AUDIT_ARCH_*, syscall numbers, first number of a foreign ABI or None)
ARCHES = {
    "x86_64": (0xC000003E, {**_X86_64, **_UNIFIED}, 0x40000000),  # x32 starts here
    "aarch64": (0xC00000B7, {**_AARCH64, **_UNIFIED}, None),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _deny(code: int = errno.EPERM) -> bytes:
    return _op(_RET, _ERRNO | code)


def _mode_check(mode_arg: int) -> list[bytes]:
    return [_op(_LD_ABS, _arg(mode_arg)), _op(_JSET, SETID_BITS, 0, 1), _deny(),
            _op(_RET, ALLOW)]


def _rule(nr: int, body: list[bytes]) -> list[bytes]:
    """If the call is `nr`, run `body` (which always returns); else fall through."""
    return [_op(_LD_ABS, _NR), _op(_JEQ, nr, 0, len(body)), *body]


def build_filter(machine: str) -> bytes | None:
    """The filter program for `machine` (platform.machine()); None when unsupported."""
    if machine not in ARCHES:
        return None
    audit_arch, numbers, foreign = ARCHES[machine]
    program = [_op(_LD_ABS, _ARCH), _op(_JEQ, audit_arch, 1, 0), _deny()]
    if foreign is not None:
        program += [_op(_LD_ABS, _NR), _op(_JGE, foreign, 0, 1), _deny()]
    for name in DENIED:
        if name in numbers:
            program += _rule(numbers[name], [_deny()])
    for name in NOT_IMPLEMENTED:
        program += _rule(numbers[name], [_deny(errno.ENOSYS)])
    for name, mode_arg in MODE_ARG.items():
        if name in numbers:
            program += _rule(numbers[name], _mode_check(mode_arg))
    for name, (flags_arg, mode_arg) in OPEN_ARGS.items():
        if name in numbers:
            program += _rule(numbers[name], [_op(_LD_ABS, _arg(flags_arg)),
                                             _op(_JSET, O_CREAT | O_TMPFILE_BIT, 0, 3),
                                             *_mode_check(mode_arg)])
    program += _rule(numbers["clone"], [_op(_LD_ABS, _arg(0)),
                                        _op(_JSET, NEW_NAMESPACES, 0, 1), _deny(),
                                        _op(_RET, ALLOW)])
    program.append(_op(_RET, ALLOW))
    return b"".join(program)


@functools.cache
def native_filter() -> bytes | None:
    return build_filter(platform.machine())
