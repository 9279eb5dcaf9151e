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


# Where a system call goes once its number is known: a shared return, or a check of its
# arguments. The syscall number picks the target through a binary search tree (`_search`):
# loading a filter, the kernel runs it for every syscall number of every ABI to learn which
# are always allowed (its action cache), so its cost grows with the path a number walks:
# about 0.3 ms per command for a chain of rules, 0.1 for the tree.
_EPERM, _ENOSYS, _CLONE = "eperm", "enosys", "clone"
_Item = tuple  # ("op", code, k, jt label | None, jf label | None) or ("label", name)


def _mode_body(mode_arg: int) -> list[_Item]:
    return [("op", _LD_ABS, _arg(mode_arg), None, None),
            ("op", _JSET, SETID_BITS, _EPERM, None), ("op", _RET, ALLOW, None, None)]


def _open_body(flags_arg: int, mode_arg: int) -> list[_Item]:
    """Creating (O_CREAT, O_TMPFILE) with a set-id bit is refused; anything else allowed."""
    return [("op", _LD_ABS, _arg(flags_arg), None, None),
            ("op", _JSET, O_CREAT | O_TMPFILE_BIT, f"mode{mode_arg}", None),
            ("op", _RET, ALLOW, None, None)]


def _search(keys: list[int], targets: dict[int, str], prefix: str) -> list[_Item]:
    """A binary search over the sorted `keys` (the accumulator holds the syscall number):
    each leaf compares a few numbers for equality and allows whatever matched none."""
    if len(keys) <= 3:
        return [*(("op", _JEQ, key, targets[key], None) for key in keys),
                ("op", _RET, ALLOW, None, None)]
    middle = len(keys) // 2
    right = f"{prefix}r"
    return [("op", _JGE, keys[middle], right, None),
            *_search(keys[:middle], targets, prefix + "l"), ("label", right),
            *_search(keys[middle:], targets, right)]


def _assemble(items: list[_Item]) -> bytes:
    """Classic BPF from `items`: jumps to labels, forward only, at most 255 instructions."""
    where, index = {}, 0
    for item in items:
        if item[0] == "label":
            where[item[1]] = index
        else:
            index += 1
    program, index = [], 0
    for item in items:
        if item[0] == "label":
            continue
        _, code, k, jt, jf = item
        offsets = []
        for label in (jt, jf):
            offset = 0 if label is None else where[label] - index - 1
            if not 0 <= offset <= 255:
                raise ValueError(f"seccomp jump to {label} out of reach ({offset})")
            offsets.append(offset)
        program.append(_op(code, k, *offsets))
        index += 1
    return b"".join(program)


def build_filter(machine: str) -> bytes | None:
    """The filter program for `machine` (platform.machine()); None when unsupported."""
    if machine not in ARCHES:
        return None
    audit_arch, numbers, foreign = ARCHES[machine]
    items: list[_Item] = [("op", _LD_ABS, _ARCH, None, None),
                          ("op", _JEQ, audit_arch, None, _EPERM),
                          ("op", _LD_ABS, _NR, None, None)]
    if foreign is not None:
        items.append(("op", _JGE, foreign, _EPERM, None))
    targets: dict[int, str] = {}
    bodies: list[_Item] = []
    for name in DENIED:
        if name in numbers:
            targets[numbers[name]] = _EPERM
    for name in NOT_IMPLEMENTED:
        targets[numbers[name]] = _ENOSYS
    for name, mode_arg in MODE_ARG.items():
        if name in numbers:
            targets[numbers[name]] = f"mode{mode_arg}"
    for name, (flags_arg, mode_arg) in OPEN_ARGS.items():
        if name in numbers:
            targets[numbers[name]] = f"open{flags_arg}"
            bodies += [("label", f"open{flags_arg}"), *_open_body(flags_arg, mode_arg)]
    targets[numbers["clone"]] = _CLONE
    for mode_arg in sorted({*MODE_ARG.values(), *(m for _, m in OPEN_ARGS.values())}):
        bodies += [("label", f"mode{mode_arg}"), *_mode_body(mode_arg)]
    items += _search(sorted(targets), targets, "n")
    items += bodies
    items += [("label", _CLONE), ("op", _LD_ABS, _arg(0), None, None),
              ("op", _JSET, NEW_NAMESPACES, _EPERM, None), ("op", _RET, ALLOW, None, None),
              ("label", _ENOSYS), ("op", _RET, _ERRNO | errno.ENOSYS, None, None),
              ("label", _EPERM), ("op", _RET, _ERRNO | errno.EPERM, None, None)]
    return _assemble(items)


@functools.cache
def native_filter() -> bytes | None:
    return build_filter(platform.machine())
