"""The first code run inside the sandbox: set its limits, forbid new processes, run the program.

bubblewrap has already given this process its own namespaces (no network, its own pids and
mounts); what namespaces cannot do is done here, before the model's program starts:

- rlimits: address space (memory), CPU seconds, the size of a written file, open files, and no
  core files;
- a seccomp filter refusing ``fork``, ``vfork`` and every ``clone`` that is not a thread, so
  the program is one process: Linux does not apply ``RLIMIT_NPROC`` to a process whose real
  user is root, which is what the sandbox is when ``osmosis serve`` runs as root; and refusing
  ``ptrace`` and ``process_vm_readv``/``process_vm_writev``, so the program cannot drive another
  process around the filter and the limits.

Then ``exec``: the program starts with the limits and the filter in place and cannot lift them
(``no_new_privs`` is set, the hard limits equal the soft ones). Standard library only, and only
cheap imports (it runs before every program); run as
``python -I -S sandbox_boot.py MEMORY CPU FILE OPEN_FILES THREADS PROGRAM``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import struct
import sys

#: Per machine: the kernel's audit arch, and the syscalls that start a process.
_MACHINES = {
    "x86_64": (
        0xC000003E,
        {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "ptrace": 101},
        (310, 311),  # process_vm_readv, process_vm_writev
    ),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435, "ptrace": 117}, (270, 271)),
}
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000  # x86_64's x32 ABI: the same syscalls under other numbers
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

#: The limits, in the order of the command line (bwrap.Limits.boot_arguments).
_LIMITS = (
    resource.RLIMIT_AS,  # memory
    resource.RLIMIT_CPU,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_NPROC,  # threads: enforced for a non-root user
)


def no_new_processes_filter(machine: str) -> bytes:
    """The seccomp program (classic BPF) for ``machine``: threads yes, processes no."""
    arch, calls, memory_calls = _MACHINES[machine]
    # (code, jump-if-true, jump-if-false, k); a jump is a label or 0 (the next instruction).
    program: list[tuple[int, str | int, str | int, int]] = [
        (_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ, 0, "kill", arch),
        (_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        program.append((_JGE, "kill", 0, _X32_BIT))
    for name in ("fork", "vfork", "ptrace"):
        if name in calls:
            program.append((_JEQ, "eperm", 0, calls[name]))
    for number in memory_calls:
        program.append((_JEQ, "eperm", 0, number))
    program.append((_JEQ, "enosys", 0, calls["clone3"]))  # glibc then falls back to clone
    program.append((_JEQ, 0, "allow", calls["clone"]))
    program.append((_LD_W_ABS, 0, 0, 16))  # clone's flags: args[0], low 32 bits
    program.append((_JSET, "allow", "eperm", _CLONE_THREAD))
    labels = {"allow": len(program), "eperm": len(program) + 1, "enosys": len(program) + 2}
    labels["kill"] = len(program) + 3
    program += [
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | errno.EPERM),
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),
        (_RET, 0, 0, _KILL),
    ]

    def offset(at: int, jump: str | int) -> int:
        return 0 if jump == 0 else labels[str(jump)] - at - 1

    return b"".join(
        struct.pack("HBBI", code, offset(at, jt), offset(at, jf), k)
        for at, (code, jt, jf, k) in enumerate(program)
    )


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_filter(program: bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    buffer = ctypes.create_string_buffer(program)
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def main(argv: list[str]) -> None:
    *limits, program = argv[1:]
    machine = os.uname().machine
    if machine not in _MACHINES:
        sys.exit(f"sandbox: no process filter for this machine ({machine}); not running the code")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for which, value in zip(_LIMITS, map(int, limits), strict=True):
        resource.setrlimit(which, (value, value))
    try:
        _install_filter(no_new_processes_filter(machine))
    except OSError as exc:
        sys.exit(f"sandbox: {exc}; not running the code")
    os.execv(sys.executable, [sys.executable, "-I", "-X", "utf8", program])


if __name__ == "__main__":
    main(sys.argv)
