"""What a sync tool call costs for its worker thread: ``Toolbox`` with a sync vs an async tool.

``Toolbox`` runs a sync tool on a worker thread of its own pool (``tools/threads.py``:
``ToolThreads``), so that a tool that blocks never blocks the event loop of a served agent; an
async tool runs in the loop. This script runs batches of four calls (what the calculator example's
model asks for per turn) of the same one-line function both ways, and prints the CPU time a call
against the async one (the baseline). Two reference lines show what a bare thread hop costs
without ``Toolbox``: ``anyio.to_thread.run_sync`` and ``loop.run_in_executor``, against calling
the function inline, each in a task of its own as ``Toolbox`` does.

    python benchmarks/bench_tool_calls.py [--calls 4000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
from _bench import print_table, ratio, write_results

from osmosis_rollout.agent import RolloutContext
from osmosis_rollout.protocol import RolloutRequest
from osmosis_rollout.tools import Toolbox


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


async def add_async(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def _context() -> RolloutContext:
    request = RolloutRequest(
        rollout_id="bench",
        server_url="http://traingate.test",
        messages=[{"role": "user", "content": "add"}],
        completion_params={},
    )
    return RolloutContext(request, [], object())  # type: ignore[arg-type]  # no LLM turn


def _calls(name: str) -> list[dict[str, Any]]:
    function = {"name": name, "arguments": '{"a": 1, "b": 2}'}
    return [{"id": f"c{i}", "type": "function", "function": function} for i in range(4)]


async def _toolbox_batch(toolbox: Toolbox, name: str) -> Callable[[], Awaitable[None]]:
    ctx, calls = _context(), _calls(name)

    async def batch() -> None:
        await toolbox.execute(ctx, calls)

    return batch


async def _bare_batch(one: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[None]]:
    async def batch() -> None:
        async with anyio.create_task_group() as tasks:
            for _ in range(4):
                tasks.start_soon(one)

    return batch


async def _measure(args: argparse.Namespace) -> dict[str, list[float]]:
    limiter = anyio.CapacityLimiter(32)
    loop = asyncio.get_running_loop()
    executor = concurrent.futures.ThreadPoolExecutor(32)

    async def hop_anyio() -> float:
        return await anyio.to_thread.run_sync(add, 1, 2, abandon_on_cancel=True, limiter=limiter)

    async def hop_executor() -> float:
        return await loop.run_in_executor(executor, add, 1, 2)

    async def inline() -> float:
        return add(1, 2)

    ways = {
        "Toolbox, async tool (baseline)": await _toolbox_batch(Toolbox([add_async]), "add_async"),
        "Toolbox, sync tool (worker thread)": await _toolbox_batch(Toolbox([add]), "add"),
        "bare: inline call in a task": await _bare_batch(inline),
        "bare: anyio.to_thread.run_sync": await _bare_batch(hop_anyio),
        "bare: loop.run_in_executor": await _bare_batch(hop_executor),
    }
    cpu_us: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):  # rounds alternate the ways
        for name, batch in ways.items():
            started = time.process_time()
            for _ in range(args.calls // 4):
                await batch()
            cpu_us[name].append((time.process_time() - started) * 1e6 / args.calls)
    executor.shutdown()
    return cpu_us


def main() -> None:
    """Run the rounds, print the medians, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=4000, help="tool calls per way and round")
    parser.add_argument("--repeats", type=int, default=7, help="rounds")
    args = parser.parse_args()
    cpu_us = anyio.run(_measure, args)
    medians = {name: statistics.median(values) for name, values in cpu_us.items()}
    base = medians["Toolbox, async tool (baseline)"]
    inline = medians["bare: inline call in a task"]
    table = []
    for name, value in medians.items():
        against = base if name.startswith("Toolbox") else inline
        table.append([name, round(value, 1), round(value - against, 1), ratio(value, against)])
    print_table(
        f"{args.calls} calls in batches of 4, median of {args.repeats} rounds",
        ["", "CPU µs a call", "+ µs vs its baseline", "ratio"],
        table,
    )
    write_results("tool_calls", {"parameters": vars(args), "results": {"cpu_us": cpu_us}})


if __name__ == "__main__":
    main()
