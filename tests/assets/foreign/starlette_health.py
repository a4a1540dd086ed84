"""A rollout server written with nothing but Starlette (no part of osmosis-rollout): it reads
the port the platform gives, answers /health, and prints what it was started with. In mode
``accept`` it also takes every ``POST /rollout`` (202) and never finishes one: a run against it
waits until it is stopped. In mode ``rollout`` it runs each one as a v2 server would, with the
standard library's HTTP client: one chat turn on the prompt, then the completion and grader
callbacks (reward 1.0), each with its key. Mode ``boom`` is ``rollout`` with a grader that
raises: a traceback on stderr, and a grader callback that fails with ``agent_error``. Mode
``chatty`` prints its ``FOREIGN_API_KEY`` and 5000 long lines before it serves."""

import asyncio
import json
import os
import sys
import urllib.request

import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse
from starlette.routing import Route

MODE = sys.argv[1] if len(sys.argv) > 1 else "serve"


async def health(request):
    return JSONResponse(
        {"status": "ok", "instance_id": os.environ.get("_OSMOSIS_ROLLOUT_INSTANCE_ID")}
    )


def _post(url, body, key):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


async def run_rollout(body):
    messages = list(body["initial_messages"])
    chat = {"model": "default", "messages": messages}
    reply = await asyncio.to_thread(
        _post, body["chat_completions_url"] + "/chat/completions", chat, body["llm_api_key"]
    )
    messages.append(reply["choices"][0]["message"])
    done = {"rollout_id": body["rollout_id"], "status": "success"}
    key = body["controller_api_key"]
    await asyncio.to_thread(_post, body["completion_callback_url"], done, key)
    graded = {**done, "sample": {"messages": messages, "reward": 1.0}}
    if MODE == "boom":
        print("Traceback (most recent call last):", file=sys.stderr, flush=True)
        print('  File "grader.py", line 7, in grade', file=sys.stderr, flush=True)
        print("ValueError: boom in grader", file=sys.stderr, flush=True)
        failed = {
            "status": "failure",
            "err_message": "boom in grader",
            "err_category": "agent_error",
        }
        graded = {**done, **failed, "sample": {"messages": messages}}
    await asyncio.to_thread(_post, body["grader_callback_url"], graded, key)


async def accept(request):
    body = await request.json()
    task = BackgroundTask(run_rollout, body) if MODE in ("rollout", "boom") else None
    return JSONResponse({"rollout_id": body.get("rollout_id")}, status_code=202, background=task)


if MODE == "die":
    print("loading the rollout...", flush=True)
    print("RuntimeError: the dataset is missing", file=sys.stderr, flush=True)
    sys.exit(3)
if MODE == "chatty":  # more than a pipe holds: it blocks unless its output is read
    print(f"settings: FOREIGN_API_KEY={os.environ.get('FOREIGN_API_KEY')}", flush=True)
    for number in range(5000):
        print(f"line {number} " + "x" * 120)
    print("chatty: done", flush=True)
if MODE == "silent":  # listens on the wrong port: never answers where it was told
    port = int(os.environ["_OSMOSIS_ROLLOUT_PORT"]) + 1
else:
    port = int(os.environ["_OSMOSIS_ROLLOUT_PORT"])
if MODE == "stubborn":
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a server that ignores SIGTERM
print(
    f"serving on {port} (ROLLOUT_PORT={os.environ.get('ROLLOUT_PORT')}, "
    f"OSMOSIS_HOST={os.environ.get('OSMOSIS_HOST')})",
    flush=True,
)
uvicorn.run(
    Starlette(routes=[Route("/health", health), Route("/rollout", accept, methods=["POST"])]),
    host="127.0.0.1",
    port=port,
    log_level="warning",
)
