"""Where a turn's time goes against a real model (opt-in: ``OSMOSIS_REAL_MODEL=1``).

The calculator example runs through ``run_test`` (what ``osmosis test --llm-url`` does) against
the cached llama.cpp server and Qwen2.5-Coder-0.5B (``tests/llama_server.py``), served with the
template that renders calls as the model writes them, greedy, one rollout at a time (no
queueing). Each turn is split by the server's own ``timings``:

- ``model``: ``prompt_ms + predicted_ms``, the engine's compute;
- ``server_and_http``: the request's wall time less the model's (templating, HTTP, parsing);
- ``toolkit``: what the agent waited in ``ctx.chat`` beyond the request (the mock TrainGate,
  the rollout server, the protocol): the part this project owns.

The baseline, in the same script against the same server: a bare ``httpx2`` POST of the first
turn's body, its wall time less its own ``timings``. Runs with and without ``--token-check``.

    OSMOSIS_REAL_MODEL=1 python benchmarks/bench_real_model.py [--rows 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import httpx2
from _bench import ROOT, median, print_table, write_results

sys.path.insert(0, str(ROOT))

from tests.llama_server import TAGLESS_TEMPLATE, missing, serve_llama

from osmosis_rollout.evaluation import TestOptions, run_test

CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
DATASET = ROOT / "examples/calculator/dataset.jsonl"


def bare_posts(url: str, count: int) -> dict[str, Any]:
    """The first calculator turn POSTed ``count`` times with a bare client: wall less timings."""
    first = json.loads(DATASET.read_text().splitlines()[0])
    from osmosis_rollout.loader import load_agent
    from osmosis_rollout.protocol import wire

    agent = load_agent(CALCULATOR)
    body = {
        "model": "qwen",
        "messages": [
            {"role": "system", "content": first["system_prompt"]},
            {"role": "user", "content": first["user_prompt"]},
        ],
        "temperature": 0.0,
        "max_tokens": 1024,
        "tools": [wire(tool) for tool in agent.get_tools(None)],  # type: ignore[arg-type]
    }
    overhead, model = [], []
    with httpx2.Client(timeout=600) as client:
        for _ in range(count):
            started = time.perf_counter()
            data = client.post(f"{url}/chat/completions", json=body).json()
            wall = (time.perf_counter() - started) * 1000
            timings = data["timings"]
            spent = timings["prompt_ms"] + timings["predicted_ms"]
            model.append(spent)
            overhead.append(wall - spent)
    return {
        "turns": count,
        "model": round(median(model), 1),
        "server_and_http": round(median(overhead), 1),
    }


def through_osmosis(url: str, rows: int, *, token_check: bool) -> dict[str, Any]:
    options = TestOptions(
        target=CALCULATOR,
        dataset=DATASET,
        limit=rows,
        llm_url=url,
        model="qwen",
        temperature=0.0,
        max_turns=4,
        concurrency=1,
        token_check=token_check,
    )
    report = asyncio.run(run_test(options))
    split = dict(report.summary["time_per_turn_ms"])
    split["findings"] = len(report.findings)
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    reason = missing()
    if reason is not None:
        sys.exit(f"bench_real_model: {reason}")
    with serve_llama(
        "--jinja", "--chat-template-file", str(TAGLESS_TEMPLATE), threads=args.threads, parallel=1
    ) as url:
        bare_posts(url, 1)  # warm the server's prompt cache like the runs below do
        baseline = bare_posts(url, 3)
        plain = through_osmosis(url, args.rows, token_check=False)
        checked = through_osmosis(url, args.rows, token_check=True)
    rows = [
        [
            "bare httpx2 POST",
            baseline["turns"],
            baseline["model"],
            baseline["server_and_http"],
            "-",
            "-",
        ],
    ]
    for name, split in (("osmosis test", plain), ("osmosis test --token-check", checked)):
        rows.append(
            [
                name,
                split["turns_timed"],
                split["model"],
                split["server_and_http"],
                split["toolkit"],
                round(100 * split["toolkit"] / (split["model"] + split["server_and_http"]), 3),
            ]
        )
    print_table(
        "time per turn, ms (medians)",
        ["run", "turns", "model", "server + HTTP", "toolkit", "toolkit, % of request"],
        rows,
    )
    write_results(
        "real_model",
        {
            "rows": args.rows,
            "threads": args.threads,
            "baseline": baseline,
            "osmosis_test": plain,
            "token_check": checked,
        },
    )


if __name__ == "__main__":
    main()
