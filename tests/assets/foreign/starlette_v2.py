"""A protocol v2 rollout server written with nothing but Starlette and httpx2 (no part of
osmosis-rollout), with the defects the conformance probes look for, chosen by its argument
(comma-separated; ``sound`` has none):

- ``echo``: a 422 echoes the body it refuses (as FastAPI's default does, keys and all);
- ``crash``: a non-finite timeout raises, which Starlette answers 500;
- ``rerun``: a repeated ``rollout_id`` is started again (no deduplication).

With ``tools`` (not a defect) each chat call offers two tools the server runs itself, as an
official SDK workflow does: ``lookup`` always fails (its result reads ``error: ...``) and
``echo`` works, for up to four turns; the server's metrics count none of them.

Each rollout makes one chat call, then posts its completion and grader callbacks (reward 1.0),
and its status is kept. It serves on ``$_OSMOSIS_ROLLOUT_PORT``, as the platform starts one,
and with ``$SERVER_KEY`` set requires it as the bearer of every ``POST /rollout``.
"""

import asyncio
import math
import os
import sys

import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

DEFECTS = set((sys.argv[1] if len(sys.argv) > 1 else "sound").split(","))
REQUIRED = ("initial_messages", "chat_completions_url", "completion_callback_url")
started: dict[str, dict] = {}
outcomes: dict[str, str] = {}
tasks: set[asyncio.Task] = set()
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"{name} a text",
     "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                    "required": ["text"]}}}
    for name in ("lookup", "echo")
]  # fmt: skip


def run_tool(call: dict) -> dict:
    name = call["function"]["name"]
    content = "error: no such record" if name == "lookup" else call["function"]["arguments"]
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def run(body: dict) -> None:
    rid = body["rollout_id"]
    llm = {"authorization": f"Bearer {body['llm_api_key']}"} if body.get("llm_api_key") else {}
    key = body.get("controller_api_key")
    callback = {"authorization": f"Bearer {key}"} if key else {}
    messages = list(body["initial_messages"])
    offered = {"tools": TOOLS} if "tools" in DEFECTS else {}
    async with httpx2.AsyncClient(timeout=30) as http:
        for _ in range(4 if offered else 1):
            reply = await http.post(
                body["chat_completions_url"].rstrip("/") + "/chat/completions",
                json={"model": "default", "messages": messages, **offered},
                headers=llm,
            )
            message = reply.json()["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                break
            messages.extend(run_tool(call) for call in message["tool_calls"])
        await http.post(
            body["completion_callback_url"],
            json={"rollout_id": rid, "status": "success"},
            headers=callback,
        )
        outcomes[rid] = "success"
        if body.get("grader_callback_url"):
            sample = {"messages": messages, "reward": 1.0}
            await http.post(
                body["grader_callback_url"],
                json={"rollout_id": rid, "status": "success", "sample": sample},
                headers=callback,
            )


async def start(request: Request) -> JSONResponse:
    key = os.environ.get("SERVER_KEY")
    if key and request.headers.get("authorization") != f"Bearer {key}":
        return JSONResponse({"detail": "unauthorized"}, status_code=401)
    body = await request.json()  # Python's parser: the bare NaN token is a float
    missing = [name for name in REQUIRED if name not in body]
    if missing:
        if "echo" in DEFECTS:
            detail = [{"loc": ["body", name], "msg": "Field required", "input": body}
                      for name in missing]  # fmt: skip
            return JSONResponse({"detail": detail}, status_code=422)
        return JSONResponse({"detail": f"missing: {', '.join(missing)}"}, status_code=422)
    for name in ("agent_timeout_sec", "grader_timeout_sec"):
        value = body.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            if "crash" in DEFECTS:
                raise ValueError(f"{name} is not finite")  # Starlette answers 500
            return JSONResponse({"detail": f"{name} must be finite"}, status_code=422)
    rid = body.get("rollout_id")
    if rid in started and "rerun" not in DEFECTS:
        if started[rid] != body:
            return JSONResponse({"detail": "rollout_id already used"}, status_code=409)
        return JSONResponse({"rollout_id": rid}, status_code=202)  # the first answer again
    started[rid] = body
    task = asyncio.get_running_loop().create_task(run(body))
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return JSONResponse({"rollout_id": rid}, status_code=202)


async def status(request: Request) -> JSONResponse:
    rid = request.path_params["rid"]
    state = outcomes.get(rid, "running" if rid in started else "unknown")
    reward = 1.0 if state == "success" else None
    return JSONResponse({"rollout_id": rid, "status": state, "reward": reward})


async def cancel(request: Request) -> JSONResponse:
    ids = (await request.json()).get("ids") or []
    return JSONResponse({"dispositions": dict.fromkeys(ids, "not_found")})


app = Starlette(
    routes=[
        Route("/health", health),
        Route("/rollout", start, methods=["POST"]),
        Route("/rollout/cancel", cancel, methods=["POST"]),
        Route("/rollout/{rid}/status", status),
    ]
)

if __name__ == "__main__":
    port = int(os.environ["_OSMOSIS_ROLLOUT_PORT"])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
