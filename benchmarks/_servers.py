"""The servers the benchmarks run, as child processes or inside the benchmark's own loop.

``python benchmarks/_servers.py KIND [--turns K] [--max-concurrent N]`` binds 127.0.0.1:0, prints
``PORT <n>`` and serves until SIGTERM. Kinds:

- ``standin``: a TrainGate stand-in that answers every chat turn and callback at once (raw ASGI
  under uvicorn, so it costs as little as a server can).
- ``sdk``: our ``serve()`` (``create_app`` under uvicorn) with :class:`TurnsAgent`; with
  ``--workers N`` and ``--state URL`` as ``osmosis serve`` takes them, and ``--http h11`` /
  ``--loop uvloop`` to measure what ``uvicorn[standard]`` changes (the HTTP parser uvicorn picks
  by itself, and the event loop ``serve()`` runs on).
- ``baseline``: the least a rollout server can do: a bare Starlette endpoint that answers the init,
  then posts the same chat turns and one completion callback with a shared ``httpx2`` client.
  ``--client lean`` makes those posts with the SDK's own ``Http1Transport`` instead (the floor
  with the lean client); on ``sdk``, ``--client httpx2`` sets ``OSMOSIS_HTTP_CLIENT=httpx2``, the
  TrainGate client the SDK used before ``Http1Transport``.

``--stack`` picks the server under the app: ``fast`` (uvicorn on uvloop + httptools, what
``serve()`` uses when they are installed), ``h11`` (uvicorn on asyncio + h11, the pure-Python
fallback) or ``granian`` (granian's Rust HTTP server, embedded in an asyncio loop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult

HOST = "127.0.0.1"
#: The one tool every benchmark agent declares (so init does real tool validation).
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}
#: What the stand-in answers to every chat turn: 48 completion tokens with ids and logprobs,
#: about the size of a short real reply from TrainGate.
REPLY_TOKENS = 48
REPLY: dict[str, Any] = {
    "id": "bench",
    "object": "chat.completion",
    "created": 0,
    "model": "default",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {
                "role": "assistant",
                "content": "The answer is 42. " * 10,
            },
        }
    ],
    "usage": {
        "prompt_tokens": 120,
        "completion_tokens": REPLY_TOKENS,
        "total_tokens": 120 + REPLY_TOKENS,
    },
    "token_ids": list(range(1000, 1000 + REPLY_TOKENS)),
    "logprobs": [-0.01 * (i % 7 + 1) for i in range(REPLY_TOKENS)],
}
REPLY_BYTES = json.dumps(REPLY).encode()
NEXT_USER = {"role": "user", "content": "Go on."}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class StandIn:
    """A TrainGate stand-in as a raw ASGI app: it answers chat turns and callbacks at once.

    ``on_completed(body)`` is called with each callback's raw JSON body (the throughput benchmark
    uses it to learn when a rollout has ended).
    """

    def __init__(self, on_completed: Callable[[bytes], None] | None = None) -> None:
        self.on_completed = on_completed
        self.chats = 0
        self.completions = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        if scope["path"].endswith("/chat/completions"):
            self.chats += 1
            body = REPLY_BYTES
        else:
            self.completions += 1
            if self.on_completed is not None:
                self.on_completed(b"".join(chunks))
            body = b"{}"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class TurnsAgent(RolloutAgentLoop):
    """Runs ``turns`` LLM turns (a user nudge between them), then completes with reward 1."""

    name = "bench-turns"

    def __init__(self, turns: int = 1) -> None:
        self.turns = turns

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return [TOOL]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for turn in range(self.turns):
            if turn:
                messages.append(NEXT_USER)
            result = await ctx.chat(messages)
            messages.append(result.message)
        return ctx.complete(messages, reward=1.0)


class SleepAgent(RolloutAgentLoop):
    """Sleeps ``metadata.sleep_s`` (work in flight), then completes; served by
    ``bench_replica_kill.py`` as ``benchmarks/_servers.py:SleepAgent``."""

    name = "bench-sleeper"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return [TOOL]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        await asyncio.sleep(float(ctx.request.metadata.get("sleep_s", 0)))
        return ctx.complete([*ctx.request.messages, {"role": "assistant", "content": "done"}])


def baseline_app(turns: int, client: str = "httpx2") -> Starlette:
    """The minimal rollout server: answer the init, post the turns and the callback.

    ``client`` is ``httpx2`` (a shared ``httpx2.AsyncClient``) or ``lean`` (the SDK's
    ``Http1Transport``, with the same limits).
    """
    http: Any = None
    tasks: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        nonlocal http
        if client == "lean":
            from osmosis_rollout.transport import Http1Transport

            http = Http1Transport(max_connections=None, attempt_timeout_s=60.0)
            try:
                yield
            finally:
                await http.aclose()
            return
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=200)
        async with httpx2.AsyncClient(limits=limits, timeout=60.0) as shared:
            http = shared
            yield

    async def rollout(init: dict[str, Any]) -> None:
        assert http is not None
        url = init["server_url"].rstrip("/")
        messages = list(init["messages"])
        headers = {"Content-Type": "application/json"}
        for turn in range(turns):
            if turn:
                messages.append(NEXT_USER)
            body = {"model": "default", "rollout_id": init["rollout_id"], "messages": messages}
            reply = await http.post(
                f"{url}/v1/chat/completions", content=json.dumps(body).encode(), headers=headers
            )
            messages.append(reply.json()["choices"][0]["message"])
        done = {
            "rollout_id": init["rollout_id"],
            "status": "COMPLETED",
            "final_messages": messages,
            "finish_reason": "stop",
            "reward": 1.0,
        }
        await http.post(
            f"{url}/v1/rollout/completed", content=json.dumps(done).encode(), headers=headers
        )

    async def init(request: Request) -> Response:
        body = json.loads(await request.body())
        task = asyncio.create_task(rollout(body))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        answer = {"rollout_id": body["rollout_id"], "tools": [TOOL]}
        return Response(json.dumps(answer), status_code=202, media_type="application/json")

    return Starlette(routes=[Route("/v1/rollout/init", init, methods=["POST"])], lifespan=lifespan)


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    sock.listen(2048)  # connections queue up until uvicorn starts accepting
    return sock


def _announce(sock: socket.socket) -> None:
    print(f"PORT {sock.getsockname()[1]}", flush=True)


#: uvicorn's (loop, http) for each ``--stack``.
UVICORN_STACKS = {"fast": ("uvloop", "httptools"), "h11": ("asyncio", "h11")}
STACKS = (*UVICORN_STACKS, "granian")


def _serve_granian(app: Any, lifespan: bool) -> None:
    """Serve ``app`` with granian's embedded server on a free 127.0.0.1 port until SIGTERM."""
    from granian.constants import Interfaces
    from granian.server.embed import Server

    probe = _bound_socket()
    port = probe.getsockname()[1]
    probe.close()  # granian binds by address; the port stays free for it in practice

    async def run() -> None:
        server = Server(
            app,
            address=HOST,
            port=port,
            interface=Interfaces.ASGI if lifespan else Interfaces.ASGINL,
            log_enabled=False,
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.stop)
        task = asyncio.create_task(server.serve())
        await asyncio.sleep(0.5)  # let it bind before the port is announced
        print(f"PORT {port}", flush=True)
        await task

    asyncio.run(run())


def main(argv: list[str]) -> None:
    """Serve one kind until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["standin", "sdk", "baseline"])
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--max-concurrent", type=int, default=100)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--state", default="memory")
    parser.add_argument("--stack", choices=STACKS, help="overrides --http and --loop")
    parser.add_argument("--http", choices=["auto", "h11"], default="auto")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument(
        "--client", choices=["default", "httpx2", "lean"], default="default",
        help="the HTTP client for the TrainGate calls (see the kinds above)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.kind == "sdk" and args.client == "httpx2":
        os.environ["OSMOSIS_HTTP_CLIENT"] = "httpx2"  # inherited by --workers processes too
    if args.stack is None or args.stack == "granian":
        loop, http = args.loop, args.http
    else:
        loop, http = UVICORN_STACKS[args.stack]
    if args.kind == "sdk":
        from osmosis_rollout.server import create_app, serve

        options: dict[str, Any] = {
            "max_concurrent": args.max_concurrent,
            "shutdown_grace_s": 2.0,
            "state": args.state,
        }
        with tempfile.TemporaryDirectory() as outbox:
            if args.stack == "granian":
                app = create_app(TurnsAgent(args.turns), outbox_dir=outbox, **options)
                _serve_granian(app, lifespan=True)
                return
            sock = _bound_socket()
            _announce(sock)
            serve(
                TurnsAgent(args.turns),
                sock=sock,
                log_level="warning",
                outbox_dir=outbox,
                workers=args.workers,
                loop=loop,
                http=http,
                **options,
            )
        return
    client = "lean" if args.client == "lean" else "httpx2"
    app: Any = StandIn() if args.kind == "standin" else baseline_app(args.turns, client)
    if args.stack == "granian":
        _serve_granian(app, lifespan=args.kind != "standin")
        return
    sock = _bound_socket()
    _announce(sock)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off" if args.kind == "standin" else "on",
        loop=loop,
        http=http,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])  # run() honours the loop (uvloop)
    finally:
        sock.close()


if __name__ == "__main__":
    main(sys.argv[1:])
