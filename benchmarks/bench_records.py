"""Memory per finished-rollout record: the compact ``FinishedRecord`` vs the slim entry it replaced.

The registry keeps one record per finished rollout for the record TTL (1 h by default) so a
duplicate init gets the first 202. At thousands of rollouts a minute those records are most of a
long-running server's memory. This script builds N finished records both ways in one process and
measures what they keep alive with ``tracemalloc`` (Python allocations, after ``gc.collect()``):

- baseline: the pre-issue-13 record, a ``RolloutEntry`` whose request was copied without its
  messages, metadata and params, holding its own 202 body (ids, events, control, the tools);
- compact: ``RolloutRegistry.finish`` as it is now (id, fingerprint, outcome, time; the tools
  JSON shared by every record with the same tools).

    python benchmarks/bench_records.py [--records 20000]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from _bench import print_table, ratio, verdict, write_results
from pydantic import TypeAdapter

from osmosis_rollout.protocol import InitResponse, OpenAIFunctionToolSchema, RolloutRequest
from osmosis_rollout.server.registry import DEFAULT_MAX_RECORDS, RolloutEntry, RolloutRegistry
from osmosis_rollout.server.state import fingerprint

TOOLS = [
    OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} two numbers",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                    "required": ["a", "b"],
                },
            },
        }
    )
    for name in ("add", "multiply")
]
TOOLS_JSON = TypeAdapter(list[OpenAIFunctionToolSchema]).dump_json(TOOLS, exclude_none=True)
GOAL_BYTES = 512


def request(i: int) -> tuple[RolloutRequest, bytes]:
    """A realistic init (a few messages, some metadata) and its raw body."""
    body = {
        "rollout_id": f"run-2026-12-01/batch-{i // 1000:04d}/rollout-{i:08d}",
        "server_url": "http://traingate.internal:8080",
        "messages": [
            {"role": "system", "content": "You are a careful assistant. " * 8},
            {"role": "user", "content": f"What is {i} + 30? Show your work."},
        ],
        "completion_params": {"temperature": 0.7, "max_tokens": 512},
        "metadata": {"dataset": "arith-v3", "row": i},
        "api_key": "tg-key-0123456789abcdef",
    }
    raw = json.dumps(body).encode()
    return RolloutRequest.model_validate_json(raw), raw


def baseline(n: int) -> list[Any]:
    """Records as they were: slimmed entries holding their own 202 bodies."""
    kept: list[Any] = []
    for i in range(n):
        req, _ = request(i)
        entry = RolloutEntry(request=req, key=req.dedup_key)
        entry.init_status = 202
        entry.init_body = (
            InitResponse(rollout_id=req.rollout_id, tools=TOOLS)
            .model_dump_json(exclude_none=True)
            .encode()
        )
        entry.request = req.model_copy(
            update={"messages": [], "metadata": {}, "completion_params": {}}
        )
        kept.append(entry)
    return kept


def compact(n: int) -> RolloutRegistry:
    """Records as they are: the registry's own reserve/accept/finish."""
    registry = RolloutRegistry(
        max_concurrent=100, max_queued=10_000, record_ttl_s=3600, max_records=DEFAULT_MAX_RECORDS
    )
    for i in range(n):
        req, _ = request(i)
        entry = registry.reserve(req, fingerprint(req))
        registry.accept(entry, TOOLS_JSON)
        registry.start(entry)
        registry.delivering(entry)
        entry.outcome = "COMPLETED"
        registry.finish(entry)
    return registry


def measure(build: Callable[[int], Any], n: int) -> tuple[float, float]:
    """Bytes per record kept alive by ``build(n)``'s result, and CPU µs per record to build."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cpu = time.process_time()
    kept = build(n)
    cpu = time.process_time() - cpu
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return (after - before) / n, cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="records built each way")
    args = parser.parse_args()
    n = args.records

    base_bytes, base_cpu = measure(baseline, n)
    new_bytes, new_cpu = measure(compact, n)
    cap_mb = new_bytes * DEFAULT_MAX_RECORDS / 1e6
    print_table(
        f"Memory per finished-rollout record ({n:,} records each way, tracemalloc)",
        ["record", "bytes / record", "CPU µs / record", "vs baseline"],
        [
            ["baseline: slim RolloutEntry", round(base_bytes), base_cpu, 1.0],
            ["compact: FinishedRecord", round(new_bytes), new_cpu, ratio(new_bytes, base_bytes)],
        ],
    )
    print_table(
        "What the cap bounds",
        ["", "value", "goal"],
        [
            [
                "bytes per compact record",
                round(new_bytes),
                f"< {GOAL_BYTES} {verdict(new_bytes < GOAL_BYTES)}",
            ],
            ["default cap (records)", DEFAULT_MAX_RECORDS, ""],
            ["records at the cap (MB)", round(cap_mb), ""],
            [
                "same count, baseline records (MB)",
                round(base_bytes * DEFAULT_MAX_RECORDS / 1e6),
                "",
            ],
        ],
    )
    write_results(
        "records",
        {
            "records": n,
            "baseline_bytes_per_record": round(base_bytes, 1),
            "compact_bytes_per_record": round(new_bytes, 1),
            "ratio_compact_to_baseline": ratio(new_bytes, base_bytes),
            "baseline_cpu_us_per_record": round(base_cpu, 2),
            "compact_cpu_us_per_record": round(new_cpu, 2),
            "default_max_records": DEFAULT_MAX_RECORDS,
            "compact_mb_at_cap": round(cap_mb, 1),
        },
    )


if __name__ == "__main__":
    main()
