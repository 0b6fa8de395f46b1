"""A seccomp filter for sandboxed programs: the kernel interfaces a test program never needs.

Namespaces and a dropped capability set already stop most of these calls; the filter closes
what an unprivileged process inside its own user namespace can still reach (nested
namespaces, ptrace of a sibling, io_uring, bpf, keyrings, perf, userfaultfd) and so shrinks
the kernel attack surface, as Docker's and Chrome's default profiles do. Denied calls fail
with EPERM; ``clone3`` fails with ENOSYS so glibc falls back to ``clone``, whose flags can be
inspected (clone3 passes them in memory, out of seccomp's reach). A syscall from another ABI
(i386 ``int 0x80``, x32) kills the process: the numbers below would not mean the same calls.

The program is classic BPF, built here with no library (bwrap ``--seccomp FD`` loads it after
its own setup). Only x86_64 has a table; elsewhere ``program()`` returns None and the sandbox
runs without the filter (``bwrap.BwrapBackend.seccomp`` says which).
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/filter.h, linux/seccomp.h, linux/audit.h
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0], low word on little-endian)
_X32_BIT = 0x40000000
_AUDIT_ARCH_X86_64 = 0xC000003E

NEW_NAMESPACE_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                       | 0x40000000)  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET

# x86_64 numbers (asm/unistd_64.h)
DENIED_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "unshare": 272, "setns": 308, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "quotactl": 179, "vhangup": 153,
    "iopl": 172, "ioperm": 173, "syslog": 103, "lookup_dcookie": 212,
    "clock_settime": 227, "settimeofday": 164, "adjtimex": 159, "clock_adjtime": 305,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
}
CLONE_X86_64, CLONE3_X86_64 = 56, 435


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter as bytes of ``struct sock_filter``, or None where there is no table for the arch."""
    if (machine or platform.machine()) != "x86_64":
        return None
    denied = sorted(DENIED_X86_64.values())
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    body = [
        _insn(_LD_ABS_W, _ARCH),
        _insn(_JEQ, _AUDIT_ARCH_X86_64, jt=1),
        _insn(_RET, _KILL_PROCESS),
        _insn(_LD_ABS_W, _NR),
        _insn(_JGE, _X32_BIT, jf=1),
        _insn(_RET, _KILL_PROCESS),
        _insn(_JEQ, CLONE3_X86_64, jf=1),
        _insn(_RET, enosys),
        _insn(_JEQ, CLONE_X86_64, jf=3),
        _insn(_LD_ABS_W, _ARG0),
        _insn(_JSET, NEW_NAMESPACE_FLAGS, jt=len(denied) + 2, jf=0),  # -> the EPERM return at the end
        _insn(_LD_ABS_W, _NR),
    ]
    for i, nr in enumerate(denied):  # each match jumps over the rest of the list and ALLOW to EPERM
        body.append(_insn(_JEQ, nr, jt=len(denied) - i))
    body += [_insn(_RET, _ALLOW), _insn(_RET, eperm)]
    return b"".join(body)
