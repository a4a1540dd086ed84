"""The client side of ``hostile_peers.py``, in its own process so its RSS is its own:
``python _hostile_client.py CARRIER URL CALLS CAP DEADLINE`` makes CALLS concurrent chat calls
to URL through one ``TrainGateClient`` and prints its peak RSS growth and wall time as JSON."""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time

from osmosis_rollout.client import RetryPolicy, TrainGateClient, default_http_client
from osmosis_rollout.protocol import CompletionsRequest
from osmosis_rollout.transport import Httpx2Transport


async def main(carrier: str, url: str, calls: int, cap: int, deadline: float) -> None:
    retry = RetryPolicy(retries=0, attempt_timeout_s=deadline, max_reply_bytes=cap)
    if carrier == "http1":
        client = TrainGateClient(retry=retry)
    else:  # what default_transport builds behind a proxy
        http = default_http_client(retry, 100)
        transport = Httpx2Transport(http, owned=True, max_reply_bytes=cap, deadline_s=deadline)
        client = TrainGateClient(transport=transport, retry=retry)
    body = CompletionsRequest(rollout_id="r", messages=[{"role": "user", "content": "hi"}])

    async def one(i: int) -> str:
        try:
            await client.chat_completions(url, body, api_key=None, request_id=f"r:{i}")
        except Exception as exc:
            return type(exc).__name__
        return "ok"

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    outcomes = await asyncio.gather(*(one(i) for i in range(calls)))
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    await client.aclose()
    await client.transport.aclose()
    figures = {
        "rss_mb": round((after - before) / 1024, 1),
        "peak_rss_mb": round(after / 1024, 1),
        "wall_s": round(wall, 2),
    }
    print(json.dumps({**figures, "outcomes": sorted(set(outcomes))}))


if __name__ == "__main__":
    name, url, calls, cap, deadline = sys.argv[1:6]
    asyncio.run(main(name, url, int(calls), int(cap), float(deadline)))
