"""What the OpenTelemetry hooks cost per rollout: not installed, API without an SDK, SDK on.

Times the hooks one rollout with one LLM turn and one tool call goes through (the rollout span,
the turn span, the ``traceparent`` injection on the chat call, the tool span), ``--rollouts``
times each way, in one process, alternating the modes and the same loop without any hook
``--repeat`` times (the median is reported). "Not installed" is the module's state when
``opentelemetry`` cannot be imported.

    python benchmarks/bench_telemetry.py [--rollouts 20000] [--repeat 5]

Goal: nothing measurable without the package (the hooks are no-ops); with it, small next to the
SDK's per-turn overhead of about 0.3 ms (docs/benchmarks.md, 1.).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _bench import median, print_table, ratio, write_results
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from osmosis_rollout import telemetry


def _one_rollout() -> None:
    with telemetry.rollout_span("row-1-bench", "bench"):
        with telemetry.llm_turn_span("row-1-bench", 1):
            headers: dict[str, str] = {}
            telemetry.inject_context(headers)
        with telemetry.tool_span("row-1-bench", "add", 1):
            pass


def _bare_rollout() -> None:
    """The same loop without any hook: the true zero."""
    headers: dict[str, str] = {}
    del headers


def _cpu_us(rollouts: int, body: Any = _one_rollout) -> float:
    started = time.process_time()
    for _ in range(rollouts):
        body()
    return (time.process_time() - started) / rollouts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    exporter = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    installed: Any = telemetry._load()
    modes = {
        "not installed (baseline)": (None, None),
        "API, no SDK configured": (installed, None),
        "SDK, in-memory exporter": (installed, sdk),
    }
    timings: dict[str, list[float]] = {"no hooks at all": [], **{name: [] for name in modes}}
    for _ in range(args.repeat):
        timings["no hooks at all"].append(_cpu_us(args.rollouts, _bare_rollout))
        for name, (api, provider) in modes.items():
            telemetry._api, telemetry.tracer_provider = api, provider
            timings[name].append(_cpu_us(args.rollouts))
            exporter.clear()
    telemetry._api, telemetry.tracer_provider = False, None
    base = median(timings["not installed (baseline)"])
    rows = [[name, median(t), ratio(median(t), base)] for name, t in timings.items()]
    print_table(
        f"OpenTelemetry hooks per rollout (1 turn, 1 tool call), {args.rollouts:,} rollouts",
        ["mode", "CPU us / rollout", "x baseline"],
        rows,
    )
    write_results(
        "telemetry",
        {
            "rollouts": args.rollouts,
            "repeat": args.repeat,
            "cpu_us_per_rollout": {name: round(median(t), 2) for name, t in timings.items()},
        },
    )


if __name__ == "__main__":
    main()
