"""``osmosis view`` start-up over a large run: 10,000 rollouts with 500 MB of traces.

Generates a results file and a trace folder shaped like ``osmosis test --output --debug-dir``
writes them (three tool-calling turns per rollout, tool results padded so the traces reach the
requested size), then times what stands between ``osmosis view`` and a drawn table:

- **index**: ``build_index([results, traces])`` plus the ``/api/rollouts`` JSON body;
- **traces only**: the same for the trace folder alone (each trace's first line and tail);
- **one rollout**: ``index.load`` of one rollout, what opening a transcript costs;
- **baseline**: loading everything, i.e. parsing every results line and every trace in full.

Each is run ``--repeat`` times (the median is reported), wall and CPU time. Files are read from
the OS page cache after the generation (the warm case a user who just ran a test is in).

    python benchmarks/bench_view_index.py [--rollouts 10000] [--trace-mb 500] [--repeat 3]

Goal: the index in under 2 s.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _bench import console, median, print_table, ratio, verdict, write_results

from osmosis_rollout.trajectory import read_trace
from osmosis_rollout.view import build_index

GOAL_S = 2.0


def _generate(folder: Path, rollouts: int, trace_bytes: int) -> tuple[Path, Path, int]:
    """Write ``results.jsonl`` and ``traces/``; return them and the traces' total size."""
    traces = folder / "traces"
    traces.mkdir()
    rng = random.Random(7)
    turns = 3
    # Each trace holds `turns` tool results; pad them so the file reaches `trace_bytes`.
    pad = max(0, (trace_bytes - 3000) // turns)
    total = 0
    with (folder / "results.jsonl").open("w") as results:
        for i in range(1, rollouts + 1):
            rid = f"row-{i}-bench000"
            prompt = [
                {"role": "system", "content": "You are a careful calculator."},
                {"role": "user", "content": f"What is {i} + {i}?"},
            ]
            history = list(prompt)
            lines = [
                {"v": 2, "ts": 1.0, "event": "rollout_start", "rollout_id": rid, "agent": "bench"}
            ]
            for turn in range(1, turns + 1):
                reply = {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": f"c{turn}",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                        }
                    ],
                }
                delta = history[len(history) - (len(prompt) if turn == 1 else 1) :]
                lines.append(
                    {
                        "v": 2,
                        "ts": 1.0 + turn,
                        "event": "turn",
                        "rollout_id": rid,
                        "turn": turn,
                        "delta_from": 0 if turn == 1 else len(history) - 1,
                        "messages": delta,
                        "reply": reply,
                        "finish_reason": "tool_calls",
                        "usage": {"prompt_tokens": 50 * turn, "completion_tokens": 20},
                        "latency_ms": rng.uniform(1, 50),
                    }
                )
                result = "x" * pad
                lines.append(
                    {
                        "v": 2,
                        "ts": 1.5 + turn,
                        "event": "tool_call",
                        "rollout_id": rid,
                        "turn": turn,
                        "tool": "add",
                        "tool_call_id": f"c{turn}",
                        "arguments": '{"a": 1, "b": 2}',
                        "result": result,
                        "latency_ms": rng.uniform(0.1, 5),
                    }
                )
                history += [reply, {"role": "tool", "tool_call_id": f"c{turn}", "content": "3"}]
            lines.append(
                {
                    "v": 2,
                    "ts": 9.0,
                    "event": "rollout_end",
                    "rollout_id": rid,
                    "status": "COMPLETED",
                    "reward": rng.random(),
                    "metrics": {"num_llm_calls": turns, "num_tool_calls": turns},
                    "final_from": len(history),
                    "final_messages": [],
                }
            )
            text = "".join(json.dumps(line) + "\n" for line in lines)
            total += len(text)
            (traces / f"{rid}.jsonl").write_text(text)
            row = {
                "type": "row",
                "row": i,
                "rollout_id": rid,
                "status": "COMPLETED",
                "reward": rng.random(),
                "turns": turns,
                "findings": [],
                "ground_truth": str(2 * i),
                "metadata": {"ground_truth": str(2 * i)},
                "trace": f"traces/{rid}.jsonl",
                "final_messages": history,
            }
            results.write(json.dumps(row) + "\n")
    return folder / "results.jsonl", traces, total


def _timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"wall_s": round(median(walls), 4), "cpu_s": round(median(cpus), 4)}


def _open(paths: list[Path]) -> int:
    index = build_index(paths)
    body = json.dumps({"rollouts": [r.public() for r in index.rollouts]})
    return len(body)


def _load_everything(results: Path, traces: Path) -> int:
    count = 0
    with results.open("rb") as fh:
        for line in fh:
            json.loads(line)
            count += 1
    for path in traces.iterdir():
        read_trace(path)
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--trace-mb", type=float, default=500.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="osmosis-view-bench-"))
    try:
        per_trace = int(args.trace_mb * 1_000_000 / args.rollouts)
        generated = time.perf_counter()
        results, traces, total = _generate(folder, args.rollouts, per_trace)
        generated = time.perf_counter() - generated
        size_mb = round(total / 1e6, 1)
        results_mb = round(results.stat().st_size / 1e6, 1)
        index = build_index([results, traces])
        assert len(index.rollouts) == args.rollouts
        middle = index.rollouts[len(index.rollouts) // 2]
        figures = {
            "index": _timed(lambda: _open([results, traces]), args.repeat),
            "traces_only": _timed(lambda: _open([traces]), args.repeat),
            "one_rollout": _timed(lambda: index.load(middle), args.repeat),
            "baseline_load_everything": _timed(
                lambda: _load_everything(results, traces), max(1, args.repeat // 3)
            ),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    base = figures["baseline_load_everything"]["wall_s"]
    rows = [
        [name, f["wall_s"], f["cpu_s"], ratio(f["wall_s"], base)] for name, f in figures.items()
    ]
    print_table(
        f"osmosis view over {args.rollouts:,} rollouts, traces {size_mb} MB, "
        f"results {results_mb} MB (generated in {generated:.1f} s)",
        ["step", "wall s", "cpu s", "x baseline"],
        rows,
    )
    met = figures["index"]["wall_s"] < GOAL_S and figures["traces_only"]["wall_s"] < GOAL_S
    console.print(f"goal: index under {GOAL_S:g} s: {verdict(met)}")
    write_results(
        "view_index",
        {
            "rollouts": args.rollouts,
            "traces_mb": size_mb,
            "results_mb": results_mb,
            "figures": figures,
            "goal_s": GOAL_S,
            "met": met,
        },
    )


if __name__ == "__main__":
    main()
