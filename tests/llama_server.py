"""The real llama.cpp server and Qwen2.5-Coder-0.5B that ``/work/shared/real-model/setup.sh``
(or the same steps by hand) caches in ``~/.cache/osmosis-llama``, started on 127.0.0.1 for the
opt-in real-model test and ``benchmarks/bench_real_model.py``.

Opt in with ``OSMOSIS_REAL_MODEL=1``; without it, or without the cached files, the users of
this module skip and say which. The server runs with ``--threads 1`` by default: the machines
these run on are shared.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx2

__all__ = ["CACHE", "MODEL", "SERVER", "TAGLESS_TEMPLATE", "missing", "serve_llama"]

CACHE = Path(os.environ.get("OSMOSIS_LLAMA_CACHE", Path.home() / ".cache" / "osmosis-llama"))
SERVER = CACHE / "llama-server"
MODEL = CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
#: Qwen2.5's own chat template with the ``<tool_call>`` tags taken out of its tool-call
#: rendering: what this model writes, so llama.cpp's parser returns real ``tool_calls``.
TAGLESS_TEMPLATE = Path(__file__).parent / "assets" / "qwen2.5-bare-tool-calls.jinja"


def missing() -> str | None:
    """Why the real-model runs cannot happen here, or None when they can."""
    if os.environ.get("OSMOSIS_REAL_MODEL") != "1":
        return "set OSMOSIS_REAL_MODEL=1 to run against the real llama.cpp server"
    for path in (SERVER, MODEL):
        if not path.exists():
            return f"{path} is missing: run /work/shared/real-model/setup.sh (about 15 minutes)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve_llama(
    *args: str, threads: int = 1, parallel: int = 2, context: int = 8192, log: Path | None = None
) -> Iterator[str]:
    """Run llama-server on 127.0.0.1 (extra ``args`` after the usual ones) until it is healthy;
    yield its ``.../v1`` URL; stop it on exit."""
    port = _free_port()
    command: Sequence[str] = [
        str(SERVER), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
        "-c", str(context), "--parallel", str(parallel), "--threads", str(threads), *args,
    ]  # fmt: skip
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {process.returncode}: {command}")
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server was not healthy within 120 s")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log is not None and hasattr(out, "close"):
            out.close()
