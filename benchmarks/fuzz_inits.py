"""Fuzz: 10,000+ hostile inits against ``osmosis serve`` over real sockets on 127.0.0.1.

The bodies come from ``tests/torture.py: hostile_inits`` (seeded): fields of the
wrong type, size or format, lists of up to ``--scale`` items, deep nesting, broken JSON, invalid
UTF-8, lone surrogates; about one in ten is valid and runs (the agent completes at once). The
goals: no 5xx, every response under 8 KB. It also prints the server's peak RSS and CPU time per
init; the baseline is the same number of valid inits sent the same way, in the same run.

Then ``--requests`` CSRF/SSRF shapes (``tests/torture.py: hostile_requests``): a web page's
content types and ``Origin``, a rebinding ``Host``, ``server_url`` aimed at an internal listener
on 127.0.0.1 (with a path, query, ``#`` or credentials), metadata and odd IPv4 addresses,
unknown or non-finite ``completion_params``. Goals: each gets its refusal, none a 5xx, and the
internal listener accepts no connection.

    python benchmarks/fuzz_inits.py [--inits 10200] [--requests 2000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import anyio
import httpx2
from _bench import print_table, ratio, verdict, write_results
from _torture import (
    SERVER_KEY,
    HostileRequest,
    Served,
    hostile_inits,
    hostile_requests,
    osmosis_serve,
    valid_init,
)

from osmosis_rollout.testing import Harness, MockTrainGate

AGENT = "tests/assets/hrd_agents.py:Quick"
GOAL_BYTES = 8192
HEADERS = {"Authorization": f"Bearer {SERVER_KEY}", "Content-Type": "application/json"}


async def send_all(
    http: httpx2.AsyncClient, bodies: Iterable[bytes], concurrency: int
) -> tuple[collections.Counter[int], int, int]:
    """POST every body; the statuses (0: connection closed by the server), the largest response
    in bytes, and how many were sent."""
    statuses: collections.Counter[int] = collections.Counter()
    largest = 0
    sent = 0
    limiter = anyio.Semaphore(concurrency)

    async def one(body: bytes) -> None:
        nonlocal largest
        async with limiter:
            try:
                response = await http.post("/v1/rollout/init", content=body, headers=HEADERS)
            except httpx2.TransportError:
                statuses[0] += 1  # e.g. the server answered 413 and closed mid-upload
                return
            statuses[response.status_code] += 1
            largest = max(largest, len(response.content))

    async with anyio.create_task_group() as tasks:
        for body in bodies:
            await limiter.acquire()  # keep at most `concurrency` bodies in memory
            limiter.release()
            tasks.start_soon(one, body)
            sent += 1
            if sent % 2000 == 0:
                print(f"  {sent:,} sent")
    return statuses, largest, sent


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    gate = MockTrainGate()
    with osmosis_serve(AGENT, work, "--log-level", "warning") as served:
        async with Harness(server_url=served.url, gate=gate, server_key=SERVER_KEY) as harness:
            assert harness.server_http is not None
            http = harness.server_http
            valid = [valid_init(f"base-{i}", gate.base_url, "tg-key") for i in range(args.baseline)]
            cpu0, t0 = served.cpu_s(), time.monotonic()
            base_statuses, base_largest, _ = await send_all(
                http, (_json(v) for v in valid), args.concurrency
            )
            base_cpu, base_wall = served.cpu_s() - cpu0, time.monotonic() - t0
            print(f"fuzz: {args.inits:,} hostile inits")
            bodies = hostile_inits(
                args.seed, args.inits, server_url=gate.base_url, api_key="tg-key", scale=args.scale
            )
            cpu0, t0 = served.cpu_s(), time.monotonic()
            statuses, largest, sent = await send_all(http, bodies, args.concurrency)
            cpu, wall = served.cpu_s() - cpu0, time.monotonic() - t0
            print(f"fuzz: {args.requests:,} CSRF/SSRF requests")
            shapes = await send_shapes(http, args, gate.base_url)
            health = await http.get("/health")
        peak = served.peak_rss_mb()
        alive = _alive(served)
    fivexx = sum(n for status, n in statuses.items() if status >= 500)
    return {
        "inits": sent,
        "scale": args.scale,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "responses_5xx": fivexx,
        "largest_response_bytes": largest,
        "server_cpu_ms_per_init": round(cpu / sent * 1000, 3),
        "wall_s": round(wall, 1),
        "baseline_valid_inits": args.baseline,
        "baseline_statuses": {str(k): v for k, v in sorted(base_statuses.items())},
        "baseline_largest_response_bytes": base_largest,
        "baseline_cpu_ms_per_init": round(base_cpu / args.baseline * 1000, 3),
        "baseline_wall_s": round(base_wall, 1),
        "cpu_per_init_vs_baseline": ratio(cpu / sent, base_cpu / args.baseline),
        "server_peak_rss_mb": round(peak, 1),
        **shapes,
        "health_after": health.status_code,
        "server_alive_after": alive,
    }


async def send_shapes(
    http: httpx2.AsyncClient, args: argparse.Namespace, gate_url: str
) -> dict[str, object]:
    """The CSRF/SSRF shapes against the server, with an internal listener on 127.0.0.1 that
    counts every connection it accepts (there must be none)."""
    connections = 0

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    listener = await asyncio.start_server(count, "127.0.0.1", 0)
    internal = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    statuses: collections.Counter[int] = collections.Counter()
    wrong = 0
    limiter = anyio.Semaphore(args.concurrency)

    async def one(request: HostileRequest) -> None:
        nonlocal wrong
        headers = {"Authorization": f"Bearer {SERVER_KEY}", **request.headers}
        async with limiter:
            response = await http.post("/v1/rollout/init", content=request.body, headers=headers)
        statuses[response.status_code] += 1
        wrong += response.status_code != request.expected

    try:
        async with anyio.create_task_group() as tasks:
            requests = hostile_requests(
                args.seed, args.requests, server_url=gate_url, internal_url=internal
            )
            for request in requests:
                tasks.start_soon(one, request)
        await asyncio.sleep(1.0)  # a rollout started by mistake would call out by now
    finally:
        listener.close()
        await listener.wait_closed()
    return {
        "shape_requests": args.requests,
        "shape_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "shape_responses_5xx": sum(n for status, n in statuses.items() if status >= 500),
        "shape_unexpected_status": wrong,
        "internal_connections": connections,
    }


def _json(body: dict[str, object]) -> bytes:
    import json

    return json.dumps(body).encode()


def _alive(served: Served) -> bool:
    return served.proc.poll() is None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inits", type=int, default=10_200)
    parser.add_argument("--requests", type=int, default=2_000, help="CSRF/SSRF shapes")
    parser.add_argument("--baseline", type=int, default=1_000, help="valid inits, same way")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--scale", type=int, default=200_000, help="largest list in a body")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="osmosis-fuzz-") as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    largest = int(figures["largest_response_bytes"])  # type: ignore[call-overload]
    shapes_ok = figures["shape_responses_5xx"] == figures["shape_unexpected_status"] == 0
    print_table(
        f"Fuzz: {figures['inits']:,} hostile inits (lists up to {args.scale:,} items)",
        ["", "value", "goal"],
        [
            ["statuses", figures["statuses"], ""],
            ["5xx", figures["responses_5xx"], f"0 {verdict(figures['responses_5xx'] == 0)}"],
            [
                "largest response (bytes)",
                largest,
                f"< {GOAL_BYTES} {verdict(largest < GOAL_BYTES)}",
            ],
            ["server CPU ms per init", figures["server_cpu_ms_per_init"], ""],
            ["baseline: valid inits, CPU ms each", figures["baseline_cpu_ms_per_init"], ""],
            ["CPU per init vs baseline", figures["cpu_per_init_vs_baseline"], ""],
            ["server peak RSS MB", figures["server_peak_rss_mb"], ""],
            ["CSRF/SSRF shapes: statuses", figures["shape_statuses"], ""],
            [
                "CSRF/SSRF: 5xx, unexpected status",
                f"{figures['shape_responses_5xx']}, {figures['shape_unexpected_status']}",
                f"0, 0 {verdict(shapes_ok)}",
            ],
            [
                "internal listener connections",
                figures["internal_connections"],
                f"0 {verdict(figures['internal_connections'] == 0)}",
            ],
            ["/health after", figures["health_after"], "200"],
        ],
    )
    write_results("fuzz_inits", figures)


if __name__ == "__main__":
    main()
