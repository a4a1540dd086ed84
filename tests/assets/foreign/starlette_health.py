"""A rollout server written with nothing but Starlette (no part of osmosis-rollout): it reads
the port the platform gives, answers /health, and prints what it was started with. In mode
``accept`` it also takes every ``POST /rollout`` (202) and never finishes one: a run against it
waits until it is stopped."""

import os
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

MODE = sys.argv[1] if len(sys.argv) > 1 else "serve"


async def health(request):
    return JSONResponse(
        {"status": "ok", "instance_id": os.environ.get("_OSMOSIS_ROLLOUT_INSTANCE_ID")}
    )


async def accept(request):
    body = await request.json()
    return JSONResponse({"rollout_id": body.get("rollout_id")}, status_code=202)


if MODE == "die":
    print("loading the rollout...", flush=True)
    print("RuntimeError: the dataset is missing", file=sys.stderr, flush=True)
    sys.exit(3)
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
