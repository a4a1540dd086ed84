"""Hostile peers, long: what a hostile TrainGate's replies cost the client, and what a crowd of
idle and slow sockets costs the server (docs/security.md, "Resource limits").

1. **replies**: a child process makes ``--calls`` concurrent chat calls to a raw server on
   127.0.0.1 answering with a gzip bomb (64 MiB inflated), an endless chunked body, a 1 TB
   ``Content-Length`` or a drip, on both carriers (the lean HTTP/1.1 one and httpx2, used behind
   a proxy); its peak RSS growth (``ru_maxrss``) and wall time are compared with a normal reply
   in the same run, and with the old bound (64 MiB, 300 s per attempt: ``--old``).
2. **crowd**: ``osmosis serve`` at a file limit of 1,024 (the review's case) gets 1,100 idle
   sockets and 20 heads dripping one byte every 0.5 s, while 200 rollouts run through it: the
   rollouts must all end once with no 5xx, the server's open files stay bounded and every idle
   or dripping socket is gone within the header timeout.

    python benchmarks/hostile_peers.py [--calls 8] [--rollouts 200] [--idle 1100]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from _bench import ROOT, print_table, verdict, write_results
from _torture import SERVER_KEY, osmosis_serve, tally
from tests.gates import ADD_CALL, ANSWER
from tests.torture import HostileGate, gzip_bomb

from osmosis_rollout.testing import Harness, MockTrainGate, ScriptedBackend

AGENT = "tests/assets/srv_agents.py:ToolAgent"
SHAPES = ("ok", "bomb", "endless", "long-length", "drip")
CHILD = Path(__file__).with_name("_hostile_client.py")


async def replies(args: argparse.Namespace) -> list[dict[str, object]]:
    gzip_bomb(64)
    rows: list[dict[str, object]] = []
    bounds = [("new", 4 * 2**20, 2.0)]
    if args.old:
        bounds.append(("old", 64 * 2**20, 30.0))
    for carrier in ("http1", "httpx2"):
        for bound, cap, deadline in bounds:
            if bound == "old" and carrier == "httpx2":
                continue  # httpx2 had no bound at all: an endless body would take the machine
            for shape in SHAPES:
                async with HostileGate(shape, drip_s=0.02).running() as gate:
                    command = [sys.executable, str(CHILD), carrier, gate.url, str(args.calls)]
                    command += [str(cap), str(deadline)]
                    child = await asyncio.create_subprocess_exec(
                        *command, stdout=asyncio.subprocess.PIPE, cwd=ROOT
                    )
                    out, _ = await child.communicate()
                figures = json.loads(out)
                rows.append({"carrier": carrier, "bound": bound, "shape": shape, **figures})
                print(f"  {carrier} {bound} {shape}: {figures}")
    return rows


def _drip(port: int, stop: threading.Event, answers: list[float]) -> None:
    started = time.monotonic()
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(0.5)
        for byte in b"POST /v1/rollout/init HTTP/1.1\r\nX-Slow: " + b"s" * 1000:
            if stop.is_set():
                return
            try:
                sock.send(bytes([byte]))
                if sock.recv(4096):
                    answers.append(time.monotonic() - started)
                return
            except TimeoutError:
                continue


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def crowd(args: argparse.Namespace, work: Path) -> dict[str, object]:
    gate = MockTrainGate(ScriptedBackend([ADD_CALL, ANSWER]))
    outbox = work / "outbox"
    with osmosis_serve(AGENT, work, "--log-level", "warning", limit_files=1024) as served:
        port = int(served.url.rsplit(":", 1)[1])
        files_before = _open_files(served.proc.pid)
        idle: list[socket.socket] = []
        refused_at_once = 0
        for _ in range(args.idle):
            with contextlib.suppress(OSError):
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                idle.append(sock)
        await asyncio.sleep(1.0)
        files_peak = _open_files(served.proc.pid)
        for sock in idle:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError, OSError):
                refused_at_once += sock.recv(64).startswith(b"HTTP/1.1 503")
        await asyncio.sleep(11)  # past the default 10 s header timeout
        still_open = 0
        for sock in idle:
            try:
                while sock.recv(65536):
                    pass
            except BlockingIOError:
                still_open += 1  # no EOF: the server kept it
            except OSError:
                pass
            sock.close()
        # Now 200 rollouts while 20 heads drip in a byte every 0.5 s.
        stop = threading.Event()
        answers: list[float] = []
        drips = [threading.Thread(target=_drip, args=(port, stop, answers)) for _ in range(20)]
        for thread in drips:
            thread.start()
        statuses: collections.Counter[int] = collections.Counter()
        accepted: list[str] = []
        started = time.monotonic()
        async with Harness(server_url=served.url, gate=gate, server_key=SERVER_KEY) as harness:
            for i in range(args.rollouts):
                outcome = await harness.run(
                    [{"role": "user", "content": "What is 3 + 4?"}], rollout_id=f"crowd-{i}"
                )
                statuses[outcome.init_status] += 1
                if outcome.init_status == 202:
                    accepted.append(f"crowd-{i}")
        wall = time.monotonic() - started
        for thread in drips:
            thread.join(timeout=30)
        stop.set()
        files_after = _open_files(served.proc.pid)
        rss = served.rss_mb()
    result = tally(accepted, gate, outbox)
    return {
        "idle_sockets": args.idle,
        "rollouts": args.rollouts,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "lost": len(result.lost),
        "duplicated": len(result.duplicated),
        "init_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "rollouts_wall_s": round(wall, 1),
        "idle_refused_503_at_once": refused_at_once,
        "idle_still_open_after_11_s": still_open,
        "drips_answered": len(answers),
        "drip_answer_s_max": round(max(answers), 1) if answers else None,
        "server_open_files_before_peak_after": [files_before, files_peak, files_after],
        "server_rss_mb": round(rss, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8, help="concurrent calls per reply shape")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--idle", type=int, default=1100)
    parser.add_argument("--old", action="store_true", help="also run with the old bounds")
    args = parser.parse_args()
    print("replies: peak RSS growth of a client making concurrent calls")
    reply_rows = asyncio.run(replies(args))
    print_table(
        f"Hostile replies: {args.calls} concurrent calls, RSS growth of the caller",
        ["carrier / bound / shape", "RSS growth MB", "peak RSS MB", "wall s", "outcome"],
        [
            [
                f"{r['carrier']} / {r['bound']} / {r['shape']}",
                r["rss_mb"],
                r["peak_rss_mb"],
                r["wall_s"],
                r["outcomes"],
            ]
            for r in reply_rows
        ],
    )
    with tempfile.TemporaryDirectory(prefix="osmosis-hostile-") as tmp:
        figures = asyncio.run(crowd(args, Path(tmp)))
    ok = figures["lost"] == figures["duplicated"] == figures["init_5xx"] == 0
    print_table(
        "Crowd: idle and slow sockets at a file limit of 1,024",
        ["", "value"],
        [[k, v] for k, v in figures.items()] + [["0 lost / dup / 5xx", verdict(bool(ok))]],
    )
    write_results("hostile_peers", {"replies": reply_rows, "crowd": figures})


if __name__ == "__main__":
    main()
