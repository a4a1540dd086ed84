"""Hostile model code, run in the sandbox: each attack that worked on a plain subprocess fails.

A stand-in for ``osmosis serve`` (a separate process) holds three secrets the way the server
does: one in its environment (``OSMOSIS_API_KEY``), one on its command line (``--api-key``) and
one only in memory (a rollout's ``api_key``). The model's program looks for all three.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from __PACKAGE__.sandbox import run_python

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("sandbox")]

PROJECT = Path(__file__).resolve().parents[1]

#: The server stand-in: reads the rollout key and the program from stdin, runs the program.
SERVER = """
import asyncio, json, subprocess, sys, tempfile
from pathlib import Path
from __PACKAGE__.sandbox import run_python
rollout_key = sys.stdin.readline().strip()  # only ever in this process's memory
code = sys.stdin.read()
if sys.argv[1] == "sandbox":
    output = asyncio.run(run_python(code, timeout_s=30, max_output_chars=100_000)).output
else:  # what the template did before: a plain child process with a clean environment
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "main.py").write_text(code)
        output = subprocess.run(
            [sys.executable, "-I", "main.py"], cwd=folder, env={"PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, timeout=60,
        ).stdout
print(json.dumps(output))
"""

#: Every key-shaped string in every process's environment, command line and readable memory.
STEAL_KEYS = r"""
import os, re
key = re.compile(rb"osk-[0-9a-f]{32}")
found = set()
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for part in ("environ", "cmdline"):
        try:
            found.update(key.findall(open(f"/proc/{pid}/{part}", "rb").read()))
        except OSError:
            pass
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
            for line in maps:
                span, perms = line.split()[:2]
                start, end = (int(x, 16) for x in span.split("-"))
                if perms[0] != "r" or end - start > 1 << 28:
                    continue
                try:
                    mem.seek(start)
                    found.update(key.findall(mem.read(end - start)))
                except (OSError, ValueError, OverflowError):
                    pass
    except OSError:
        pass
print(sorted(k.decode() for k in found))
"""


def _serve_and_run(mode: str, code: str) -> tuple[str, dict[str, str]]:
    keys = {part: f"osk-{secrets.token_hex(16)}" for part in ("environ", "cmdline", "memory")}
    done = subprocess.run(
        [sys.executable, "-c", SERVER, mode, "--api-key", keys["cmdline"]],
        input=f"{keys['memory']}\n{code}",
        env={**os.environ, "OSMOSIS_API_KEY": keys["environ"]},
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout), keys


def test_the_servers_keys_are_out_of_reach() -> None:
    """/proc/<server>/environ, its command line and its memory: no key is found."""
    unconfined, keys = _serve_and_run("plain", STEAL_KEYS)
    # The attack works on a plain subprocess, so its silence below means something.
    assert keys["environ"] in unconfined
    assert keys["cmdline"] in unconfined

    output, keys = _serve_and_run("sandbox", STEAL_KEYS)
    assert output.strip() == "[]"
    for key in keys.values():
        assert key not in output


async def test_only_its_own_processes_and_a_minimal_etc_are_visible() -> None:
    """No other process in /proc, a one-user /etc/passwd, no home, an empty environment."""
    code = (
        "import os\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(open('/etc/passwd').read(), end='')\n"
        "print(sorted(os.listdir('/etc')), os.path.exists('/root/.ssh'), os.path.exists('/home'))\n"
        "print(sorted(os.environ))\n"
    )
    result = await run_python(code)
    pids, passwd, etc, env = result.output.splitlines()
    assert pids == "['1']"  # the program alone: no bubblewrap init inside (--as-pid-1)
    assert passwd == "sandbox:x:65534:65534:sandbox:/tmp:/usr/sbin/nologin"
    assert etc == "['group', 'passwd'] False False"
    assert env == "['HOME', 'LANG', 'PATH', 'PWD']"


async def test_no_network_not_even_this_machines_loopback() -> None:
    """A listener on 127.0.0.1 outside is unreachable: the sandbox has its own network."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"print(socket.socket().connect_ex(('127.0.0.1', {port})) != 0)\n"
            "try:\n"
            "    socket.create_connection(('example.com', 80), timeout=2)\n"
            "except OSError as e:\n"
            "    print('no route', type(e).__name__)\n"
        )
        result = await run_python(code)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    assert result.output.splitlines()[0] == "True"
    assert result.output.splitlines()[1].startswith("no route")


async def test_memory_processes_and_file_size_are_limited() -> None:
    """1 GiB is a MemoryError, no process can be started (fork, subprocess), a big file fails."""
    code = (
        "import os, subprocess\n"
        "try:\n"
        "    block = bytearray(1 << 30)\n"
        "    print('allocated')\n"
        "except MemoryError:\n"
        "    print('MemoryError')\n"
        "forked = 0\n"
        "for _ in range(50):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os._exit(0)\n"
        "        forked += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print('forked', forked)\n"
        "try:\n"
        "    subprocess.run(['true'])\n"
        "except OSError as e:\n"
        "    print('subprocess', e.errno)\n"
        "try:\n"
        "    open('big', 'wb').write(b'x' * (100 << 20))\n"
        "except OSError as e:\n"
        "    print('file', e.errno)\n"
    )
    result = await run_python(code)
    assert result.output.splitlines() == ["MemoryError", "forked 0", "subprocess 1", "file 27"]


async def test_nothing_it_starts_outlives_the_time_limit() -> None:
    """A setsid() grandchild cannot be started, and the program is gone at the time limit."""
    marker = f"sandbox-marker-{secrets.token_hex(8)}"
    code = (
        "import os, subprocess, sys\n"
        "try:\n"
        f"    subprocess.Popen(['sleep', '600', {marker!r}], start_new_session=True)\n"
        "except OSError as e:\n"
        "    print('grandchild', e.errno, flush=True)\n"
        f"os.execv(sys.executable, [sys.executable, '-c', 'while True: pass', {marker!r}])\n"
    )
    result = await run_python(code, timeout_s=1.0)
    assert result.timed_out
    assert result.output == "grandchild 1\n"
    assert _processes_naming(marker) == []


def _processes_naming(marker: str) -> list[str]:
    """The pids on this machine whose command line contains ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def test_the_server_is_made_non_dumpable() -> None:
    """After its first run, the calling process cannot be ptraced or have its memory read by
    another process of the same user (prctl(PR_GET_DUMPABLE) is 0)."""
    probe = (
        "import asyncio, ctypes\n"
        "from __PACKAGE__.sandbox import run_python\n"
        "libc = ctypes.CDLL(None)\n"
        "before = libc.prctl(3, 0, 0, 0, 0)\n"
        "asyncio.run(run_python('pass'))\n"
        "print(before, libc.prctl(3, 0, 0, 0, 0))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["1", "0"]


#: Every file under /proc outside the program's own /proc/<pid> that opens for writing.
WRITABLE_PROC = r"""
import os
writable = []
for root, dirs, files in os.walk("/proc"):
    parts = root.split("/")
    if len(parts) > 2 and (parts[2].isdigit() or parts[2] in ("self", "thread-self")):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(root, name)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # opened, never written
        except OSError:
            continue
        writable.append(path)
print(sorted(writable))
print(bool(os.statvfs("/proc/sys").f_flag & os.ST_RDONLY))
"""


async def test_no_host_kernel_setting_can_be_written() -> None:
    """As root (``osmosis serve`` in a container), bubblewrap skipped its read-only cover of
    ``/proc/sys``, and model code could open ``kernel.core_pattern`` for writing (a known route
    to host root). Nothing under ``/proc`` but the program's own files opens for writing now,
    whoever runs the server. (The probe opens and closes; it never writes.)"""
    result = await run_python(WRITABLE_PROC, timeout_s=30)
    writable, read_only = result.output.splitlines()
    assert writable == "[]"
    assert read_only == "True"


async def test_ptrace_and_other_processes_memory_are_refused() -> None:
    """ptrace got around the process filter and the rlimits by attaching to bubblewrap's pid 1
    (20 processes, 1 GiB mapped against a 512 MiB limit): ptrace and process_vm_writev are
    refused (EPERM), and there is no other process inside to attach to."""
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(0, 0, None, None), ctypes.get_errno())\n"  # PTRACE_TRACEME
        "print(libc.ptrace(16, 1, None, None), ctypes.get_errno())\n"  # PTRACE_ATTACH pid 1
        "print(libc.process_vm_writev(os.getpid(), None, 0, None, 0, 0), ctypes.get_errno())\n"
    )
    result = await run_python(code)
    assert result.output.splitlines() == ["-1 1", "-1 1", "-1 1"]


async def test_dev_is_read_only_and_dev_shm_is_small() -> None:
    """``/dev`` and ``/dev/shm`` were tmpfs at half the RAM (3 GiB held in 7 s against the
    documented 64 MiB ``/tmp``): ``/dev`` is read-only and ``/dev/shm`` is bounded like
    ``/tmp``; the devices still work."""
    code = (
        "import os\n"
        "open('/dev/null', 'w').write('x')\n"
        "try:\n"
        "    open('/dev/hoard', 'wb')\n"
        "except OSError as e:\n"
        "    print('dev', e.errno)\n"
        "try:\n"
        "    with open('/dev/shm/hoard', 'wb') as f:\n"
        "        for _ in range(64):\n"
        "            f.write(b'x' * (1 << 20))\n"
        "except OSError as e:\n"
        "    print('shm', e.errno)\n"
    )
    result = await run_python(code)
    assert result.output.splitlines() == ["dev 30", "shm 28"]  # EROFS, ENOSPC
