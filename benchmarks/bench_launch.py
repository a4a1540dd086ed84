"""``osmosis test --launch``: the bench's own CPU a rollout against a launched server, beside
the same rows in process.

The calculator example (two LLM turns, tool calls) runs over generated rows on protocol v2 with
the mock LLM three ways: in process (the server's work is in the same process: the baseline),
launched (``--launch "python -m osmosis_rollout serve ..."``: the same server in its own
process, told its port as the platform tells it), and one-turn rows through the official SDK's
quickstart rollout (osmosis-ai 0.3.2 in its cached venv, ``tests/peer_sdk.py``; 0.3.8 over the
polling wire) when that venv can be had. The bench's CPU is this process's (``process_time``);
the launched server's is reported beside it (``RUSAGE_CHILDREN``, read once it is reaped).

    python benchmarks/bench_launch.py [--rows 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import print_table, ratio, write_results
from bench_test_throughput import TARGET, write_dataset

from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.launch import LaunchSpec

REPO = Path(__file__).resolve().parent.parent
SDK_ROLLOUT = REPO / "tests" / "assets" / "foreign" / "sdk_rollout"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _timed(options: TestOptions, rows: int) -> dict[str, Any]:
    wall, cpu, child = time.perf_counter(), time.process_time(), _children_cpu()
    report = await run_test(options)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    child = _children_cpu() - child
    return {
        "wall_s": round(wall, 3),
        "cpu_ms_per_rollout": round(cpu * 1000 / rows, 3),
        "server_cpu_ms_per_rollout": round(child * 1000 / rows, 3),
        "passed": sum(r.passed for r in report.rows),
    }


def _sdk_python(version: str) -> Path | None:
    """osmosis-ai ``version``'s interpreter in the tests' cached venv (made if missing, as the
    tests make it), or None where it cannot be had."""
    sys.path.insert(0, str(REPO))
    import pytest
    from tests.peer_sdk import python_of, sdk_venv

    try:
        return python_of(sdk_venv(version))
    except pytest.skip.Exception:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200, help="dataset rows")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of each")
    args = parser.parse_args()
    serve = shlex.join([sys.executable, "-m", "osmosis_rollout", "serve", str(REPO / TARGET)])
    sdk, polling_sdk = _sdk_python("0.3.2"), _sdk_python("0.3.8")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "rows.jsonl"
        write_dataset(dataset, args.rows)
        one_turn = Path(tmp) / "one_turn.jsonl"
        one_turn.write_text(
            "".join(
                json.dumps({"user_prompt": f"{i}+0?", "ground_truth": str(i),
                            "mock_replies": [{"content": str(i)}]}) + "\n"
                for i in range(args.rows)
            )
        )  # fmt: skip
        ways: dict[str, TestOptions] = {
            "in process": TestOptions(target=str(REPO / TARGET), dataset=dataset, protocol="v2"),
            # the conformance probes (on by default with --launch) are not the rows' cost
            "--launch osmosis serve": TestOptions(
                launch=LaunchSpec(serve, cwd=REPO),
                dataset=dataset,
                protocol="v2",
                conformance=False,
            ),
        }
        if sdk is not None:
            command = shlex.join([str(sdk), "main.py"])
            ways["--launch osmosis-ai 0.3.2 (1 turn)"] = TestOptions(
                launch=LaunchSpec(command, cwd=SDK_ROLLOUT),
                dataset=one_turn,
                protocol="v2",
                conformance=False,
            )
        if polling_sdk is not None:  # the same rollout on 0.3.8: the polling wire
            command = shlex.join([str(polling_sdk), "main.py"])
            ways["--launch osmosis-ai 0.3.8 (1 turn, polling)"] = TestOptions(
                launch=LaunchSpec(command, cwd=SDK_ROLLOUT),
                dataset=one_turn,
                protocol="polling",
                conformance=False,
            )
        rounds: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
        for _ in range(args.repeats):
            for way, options in ways.items():
                rounds[way].append(asyncio.run(_timed(options, args.rows)))
    best = {way: min(runs, key=lambda r: r["cpu_ms_per_rollout"]) for way, runs in rounds.items()}
    base = best["in process"]["cpu_ms_per_rollout"]
    print_table(
        f"{args.rows} rows, protocol v2 (0.3.8: polling), mock LLM (lowest CPU of {args.repeats})",
        ["", "bench CPU ms/rollout", "vs in process", "server CPU ms/rollout", "wall s", "passed"],
        [
            [way, r["cpu_ms_per_rollout"], ratio(r["cpu_ms_per_rollout"], base),
             r["server_cpu_ms_per_rollout"], r["wall_s"], r["passed"]]
            for way, r in best.items()
        ],
    )  # fmt: skip
    write_results("bench_launch", {"rows": args.rows, "rounds": rounds, "best": best})


if __name__ == "__main__":
    main()
