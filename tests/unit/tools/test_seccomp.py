"""The seccomp program decides every system call as its rule tables say.

The filter is a binary search over syscall numbers (cheaper for the kernel to load than a
chain of rules); a mistake in a jump would let a denied call through or refuse an ordinary
one. A small classic-BPF interpreter runs the program as the kernel would, for every
syscall number of the architecture and beyond, with arguments that do and do not carry the
bits the rules look at, and compares each verdict with the tables.
"""

from __future__ import annotations

import errno
import functools
import struct

import pytest

from refloop.tools import seccomp
from refloop.tools.seccomp import (
    ALLOW,
    ARCHES,
    DENIED,
    MODE_ARG,
    NEW_NAMESPACES,
    NOT_IMPLEMENTED,
    O_CREAT,
    O_TMPFILE_BIT,
    OPEN_ARGS,
    SETID_BITS,
    build_filter,
)

EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
# Argument values the rules test (set-id bits, creation flags, namespace flags) and ones
# they let through.
ARGUMENTS = (0, 0o755, 0o4755, 0o2700, SETID_BITS, O_CREAT, O_TMPFILE_BIT | 0o200000,
             0x10000000, 0x40000000, 0x20000 | 0x100, 0x00011200, 0xFFFFFFFF)


NAMES = {machine: {number: name for name, number in numbers.items()}
         for machine, (_, numbers, _) in ARCHES.items()}


def run(program: bytes, nr: int, arch: int, args: tuple[int, ...]) -> int:
    """What the kernel's classic BPF does with this struct seccomp_data."""
    data = struct.pack("<II", nr, arch) + struct.pack("<Q", 0) + struct.pack(
        "<6Q", *args, *[0] * (6 - len(args)))
    ops = _decoded(program)
    accumulator, pc = 0, 0
    for _ in range(len(ops)):  # forward jumps only: at most one pass
        code, jt, jf, k = ops[pc]
        if code == 0x20:  # LD W ABS
            accumulator = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == 0x06:  # RET K
            return k
        elif code in (0x15, 0x35, 0x45):  # JEQ, JGE, JSET with K
            taken = {0x15: accumulator == k, 0x35: accumulator >= k,
                     0x45: bool(accumulator & k)}[code]
            pc += 1 + (jt if taken else jf)
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
    raise AssertionError("the program ran off its end")


@functools.cache
def _decoded(program: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack_from("<HBBI", program, 8 * n) for n in range(len(program) // 8)]


def expected(machine: str, nr: int, arch: int, args: tuple[int, ...]) -> int:
    """The verdict the tables of `seccomp` ask for."""
    audit_arch, numbers, foreign = ARCHES[machine]
    if arch != audit_arch or (foreign is not None and nr >= foreign):
        return EPERM
    name = NAMES[machine].get(nr, "")
    if name in DENIED:
        return EPERM
    if name in NOT_IMPLEMENTED:
        return ENOSYS
    if name in MODE_ARG:
        return EPERM if args[MODE_ARG[name]] & SETID_BITS else ALLOW
    if name in OPEN_ARGS:
        flags, mode = OPEN_ARGS[name]
        creates = args[flags] & (O_CREAT | O_TMPFILE_BIT)
        return EPERM if creates and args[mode] & SETID_BITS else ALLOW
    if name == "clone":
        return EPERM if args[0] & NEW_NAMESPACES else ALLOW
    return ALLOW


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_every_syscall_number_gets_the_verdict_of_the_tables(machine: str):
    program = build_filter(machine)
    assert program is not None
    audit_arch, numbers, foreign = ARCHES[machine]
    candidates = [*range(0, 600), 0x3FFFFFFF, 0x40000000, 0x40000001, 0xFFFFFFFF]
    checked = 0
    for nr in candidates:
        for value in ARGUMENTS:
            for position in range(4):  # the value in one argument, the others zero
                args = tuple(value if n == position else 0 for n in range(6))
                assert run(program, nr, audit_arch, args) == expected(
                    machine, nr, audit_arch, args), (machine, nr, args)
                checked += 1
            args = (value,) * 6  # and in all of them at once
            assert run(program, nr, audit_arch, args) == expected(
                machine, nr, audit_arch, args), (machine, nr, args)
    assert checked > 20000
    # A number of the rules under a foreign architecture value is refused outright.
    for nr in numbers.values():
        assert run(program, nr, audit_arch ^ 1, (0,) * 6) == EPERM


def test_every_rule_is_reached():
    """No rule hides behind another: each denied and each checked call is decided by its
    own target (a denied call refused, a checked call allowed with harmless arguments)."""
    program = build_filter("x86_64")
    assert program is not None
    audit_arch, numbers, _ = ARCHES["x86_64"]
    for name in (*DENIED, *NOT_IMPLEMENTED, *MODE_ARG, *OPEN_ARGS, "clone"):
        if name not in numbers:
            continue
        verdict = run(program, numbers[name], audit_arch, (0,) * 6)
        wanted = EPERM if name in DENIED else ENOSYS if name in NOT_IMPLEMENTED else ALLOW
        assert verdict == wanted, name


def test_a_jump_out_of_reach_is_refused_not_truncated():
    """A classic BPF jump offset is one byte: a program that would need more fails to
    build rather than jump somewhere else."""
    items = [("op", 0x15, 1, "far", None),
             *[("op", 0x06, ALLOW, None, None)] * 300, ("label", "far"),
             ("op", 0x06, ALLOW, None, None)]
    with pytest.raises(ValueError, match="out of reach"):
        seccomp._assemble(items)
