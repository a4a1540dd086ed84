"""The bubblewrap command line that confines one run, and whether it works on this machine.

What the program gets: its own user, pid, mount, network, IPC, UTS and cgroup namespaces (no
network at all, only its own processes in ``/proc``), read-only ``/usr`` and the interpreter's
folders (its virtualenv and installation), a minimal ``/etc`` (a ``passwd`` naming one user), a
small writable ``/tmp`` as its working folder, no home, an empty environment, no capabilities,
and ``sandbox_boot.py`` between bubblewrap and the program for rlimits and the
no-new-processes filter.

Host kernel interfaces are read-only whoever runs the server: when ``osmosis serve`` runs as
root (containers often do), the sandbox's user is root outside, and bubblewrap then skips its
own read-only cover of ``/proc/sys`` (a writable ``kernel.core_pattern`` is a known route to
host root), so ``/proc/sys`` and ``/proc/pressure`` are bound read-only here, and ``/dev`` is
remounted read-only with a small ``/dev/shm``. The program is the sandbox's pid 1
(``--as-pid-1``): no bubblewrap process sits inside, outside the limits, for it to attach to.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Limits", "bwrap_command", "prepare_workdir", "sandbox_problem"]

_MIB = 1024 * 1024
_BOOT = Path(__file__).with_name("sandbox_boot.py")
#: Where things are inside the sandbox.
_INSIDE_PROGRAM, _INSIDE_BOOT = "/sandbox/main.py", "/sandbox/boot.py"
_NOBODY = 65534
_PASSWD = f"sandbox:x:{_NOBODY}:{_NOBODY}:sandbox:/tmp:/usr/sbin/nologin\n"
_GROUP = f"sandbox:x:{_NOBODY}:\n"
#: Top-level folders that hold programs and libraries (symlinks into /usr on merged-/usr systems).
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_INSTALL = "install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap)"
#: The host kernel's settings under /proc, bound read-only over the sandbox's own /proc.
_KERNEL_SETTINGS = ("/proc/sys", "/proc/pressure")


@dataclass(frozen=True)
class Limits:
    """What one run may use besides wall time (the timeout) and output (max_output_chars)."""

    memory_bytes: int = 512 * _MIB  # address space: allocations beyond it are a MemoryError
    cpu_s: int = 10  # CPU seconds; raised to the timeout plus one when that is longer
    file_bytes: int = 16 * _MIB  # the largest file it may write
    tmp_bytes: int = 64 * _MIB  # all of /tmp (memory-backed)
    shm_bytes: int = 8 * _MIB  # all of /dev/shm (memory-backed; /dev itself is read-only)
    open_files: int = 64
    threads: int = 64  # enforced by Linux only when the server is not root

    def boot_arguments(self) -> list[str]:
        """The limits as ``sandbox_boot.py`` reads them."""
        values = [self.memory_bytes, self.cpu_s, self.file_bytes, self.open_files, self.threads]
        return [str(v) for v in values]


def find_bwrap() -> str | None:
    """The ``bwrap`` program on PATH, if any."""
    return shutil.which("bwrap")


def python_executable() -> str:
    """The interpreter the program runs on: this one, so its virtualenv's packages import."""
    return sys.executable


def prepare_workdir(workdir: Path, code: str) -> None:
    """Write the program, its boot script and the minimal /etc files that ``bwrap_command``
    binds read-only."""
    (workdir / "main.py").write_text(code, encoding="utf-8")
    # A copy, not the package's file: the package may sit where the sandbox cannot read it.
    shutil.copyfile(_BOOT, workdir / "boot.py")
    (workdir / "passwd").write_text(_PASSWD, encoding="utf-8")
    (workdir / "group").write_text(_GROUP, encoding="utf-8")


def bwrap_command(
    bwrap: str, workdir: Path, limits: Limits, *, python: str | None = None
) -> list[str]:
    """The command running ``workdir/main.py`` (see ``prepare_workdir``) in a fresh sandbox."""
    python = python or python_executable()
    command = [
        bwrap,
        "--unshare-all",  # net (loopback only, its own), pid, ipc, uts, cgroup
        "--unshare-user",
        "--disable-userns",  # no further user namespaces inside
        "--uid",
        str(_NOBODY),
        "--gid",
        str(_NOBODY),
        "--hostname",
        "sandbox",
        "--die-with-parent",  # the whole pid namespace dies with bwrap
        "--as-pid-1",  # the program is pid 1: no bwrap init inside to ptrace
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):
            command += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            command += ["--ro-bind", folder, folder]
    roots = _python_roots(python)
    # A root under /tmp (a virtualenv made there, as CI does) is bound after /tmp's own tmpfs,
    # which would hide it otherwise.
    in_tmp = [r for r in roots if r == "/tmp" or r.startswith("/tmp/")]
    for root in roots:
        if root not in in_tmp:
            command += ["--ro-bind", root, root]
    command += [
        "--ro-bind",
        str(workdir / "passwd"),
        "/etc/passwd",
        "--ro-bind",
        str(workdir / "group"),
        "/etc/group",
        "--ro-bind",
        str(workdir / "main.py"),
        _INSIDE_PROGRAM,
        "--ro-bind",
        str(workdir / "boot.py"),
        _INSIDE_BOOT,
        "--dev",
        "/dev",
        "--size",
        str(limits.shm_bytes),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--proc",
        "/proc",
        *(
            arg
            for path in _KERNEL_SETTINGS
            if os.path.isdir(path)
            for arg in ("--ro-bind", path, path)
        ),
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        "/tmp",
        *(arg for root in in_tmp for arg in ("--ro-bind", root, root)),
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--",
        python,
        "-I",
        "-S",
        _INSIDE_BOOT,
        *limits.boot_arguments(),
        _INSIDE_PROGRAM,
    ]
    return command


def _python_roots(python: str) -> list[str]:
    """The interpreter's folders (its virtualenv, its installation) not under /usr already."""
    real = Path(os.path.realpath(python)).parent.parent
    roots = {sys.prefix, sys.base_prefix, str(Path(python).parent.parent), str(real)}
    # Package folders on the path from elsewhere (a .pth naming another environment's
    # site-packages); never the project or the working folder, which stay outside.
    roots |= {
        p
        for p in sys.path
        if p.endswith(("site-packages", "dist-packages"))
        and not any(p.startswith(r + os.sep) for r in roots)
    }
    inside_usr = [r for r in roots if r == "/usr" or r.startswith("/usr/")]
    return sorted(r for r in roots - set(inside_usr) if os.path.isdir(r))


_checked: dict[tuple[str, str], str | None] = {}


def sandbox_problem() -> str | None:
    """Why model code cannot run confined on this machine, or None when the sandbox works.

    Checked once per process (a trivial program run the same way as the model's), so a missing
    program, disabled user namespaces or an old bubblewrap is one clear refusal, not a failed run.
    """
    bwrap = find_bwrap()
    if bwrap is None:
        return f"bubblewrap (bwrap) is not installed: {_INSTALL}"
    key = (bwrap, python_executable())
    if key not in _checked:
        _checked[key] = _probe(bwrap)
    return _checked[key]


def _probe(bwrap: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="sandbox-check-") as workdir:
        prepare_workdir(Path(workdir), "pass\n")
        try:
            done = subprocess.run(
                bwrap_command(bwrap, Path(workdir), Limits()),
                env={},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap ({bwrap}) could not be started: {exc}"
    said = (done.stderr + done.stdout).strip().splitlines()
    if done.returncode == 0 and not said:
        return None
    detail = said[-1] if said else f"exit code {done.returncode}"
    return (
        f"bubblewrap cannot make a sandbox on this machine ({detail}); it needs bubblewrap 0.8"
        " or newer and user namespaces allowed (see this project's README)"
    )
