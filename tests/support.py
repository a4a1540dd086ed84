"""Helpers shared by tests: the small agents in tests/assets, servers on 127.0.0.1, polling."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import uvicorn

ASSETS = Path(__file__).parent / "assets"
#: The repository, and the Quickstart's calculator agent and dataset in it.
ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
DATASET = str(ROOT / "examples/calculator/dataset.jsonl")


def load_asset(name: str) -> ModuleType:
    """Import tests/assets/<name>.py as a module (a fresh copy each time)."""
    return load_path(ASSETS / f"{name}.py", f"assets_{name}")


def load_path(path: Path, name: str) -> ModuleType:
    """Import the file at ``path`` as the module ``name`` (a fresh copy each time)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def calculator_agent() -> Any:
    """The Quickstart's calculator agent (four sync tools)."""
    from osmosis_rollout.loader import load_agent

    calculator = Path(__file__).parents[1] / "examples" / "calculator" / "agent.py"
    return load_agent(f"{calculator}:CalculatorAgent")


@contextlib.contextmanager
def serve_in_thread(app: Any, *, lifespan: str = "off") -> Iterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 (ephemeral port) in a thread; yield its URL.

    The socket listens before uvicorn starts, so early connections wait in the backlog; the
    server is always stopped on exit.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, lifespan=lifespan, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (for subprocess servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def line_of(path: Path, marker: str) -> int:
    """The 1-based line of ``path`` that carries ``marker``."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in {path}")


def has_stray_null(value: Any) -> bool:
    """Whether a JSON value holds a ``null`` other than the one the wire keeps: an assistant
    message's ``"content": null`` beside its tool calls, sent as the legacy SDK sent it
    (docs/protocol.md, issue 41)."""
    if isinstance(value, dict):
        kept = value.get("content") is None and bool(value.get("tool_calls"))
        return any(has_stray_null(v) for k, v in value.items() if not (kept and k == "content"))
    if isinstance(value, list):
        return any(has_stray_null(v) for v in value)
    return value is None


async def wait_until(predicate: Any, timeout_s: float) -> None:
    """Poll ``predicate`` (the callbacks arrive in another thread, with no event to wait on)."""
    with anyio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - polling another thread's state
            await anyio.sleep(0.05)


def recording_bodies(app: Any, bodies: list[tuple[str, bytes]]) -> Any:
    """``app`` (the mock TrainGate's) wrapped to keep each request's path and raw body bytes."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            event = await receive()
            chunks.append(event.get("body", b""))
            more = event.get("more_body", False)
        body = b"".join(chunks)
        bodies.append((scope["path"], body))
        events = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay() -> Any:
            return events.pop() if events else {"type": "http.disconnect"}

        await app(scope, replay, send)

    return wrapped
