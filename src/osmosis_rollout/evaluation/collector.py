"""The garbage collector around the bulk work of ``osmosis test``: a batch of rows, a cassette.

Both allocate heavily while many long-lived objects are alive (the agent, the modules, a
replayed cassette's rows), and each full collection walks all of them. These context managers
make that cheaper without changing what is freed. Each is kept because it moves a figure users
see by more than 10% (``benchmarks/bench_replay.py``, 1,000 rows, runs with and without it
alternating on one machine); the command-wide pause of the collector while it set up moved
``osmosis test``'s wall time by under 5% and was removed.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

__all__ = ["lighter_gc", "paused_gc"]

#: The youngest generation's threshold during a batch (CPython's default is 700).
_BATCH_GC_THRESHOLD = 7000
_gc_state: dict[str, Any] = {"depth": 0, "threshold": None, "froze": False}


@contextlib.contextmanager
def lighter_gc() -> Iterator[None]:
    """Fewer, cheaper garbage collections while a batch runs; the collector as it was after.

    A batch allocates heavily, and each full collection walks every object alive: the agent,
    the modules, a replayed cassette's thousands of rows. Measured on a 1,000-row replay, that
    was ~1 ms of CPU a row (a fifth of it). So the objects alive when the batch starts are frozen
    (``gc.freeze``: left out of collections until the batch ends, then handed back) and the
    youngest generation's threshold is raised tenfold. Nothing is freed that would not be;
    garbage cycles are only found a little later. Nested or concurrent batches share one
    setting: the last one out restores it. A program that froze objects itself keeps them
    frozen (nothing more is frozen then).

    Measured (bench_replay.py): replay in process 818-889 rows/s with it, 317-322 without;
    1.0-1.3 ms of CPU a row with it, 1.6-1.8 without.
    """
    if _gc_state["depth"] == 0:
        threshold = gc.get_threshold()
        _gc_state["threshold"] = threshold
        _gc_state["froze"] = gc.get_freeze_count() == 0
        if _gc_state["froze"]:
            gc.freeze()
        gc.set_threshold(max(threshold[0], _BATCH_GC_THRESHOLD), *threshold[1:])
    _gc_state["depth"] += 1
    try:
        yield
    finally:
        _gc_state["depth"] -= 1
        if _gc_state["depth"] == 0:
            gc.set_threshold(*_gc_state["threshold"])
            if _gc_state["froze"]:
                gc.unfreeze()


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No collection while a burst of objects that form no garbage cycles is built (a cassette
    being parsed: every object it makes is kept); the collector is re-enabled after, if it was
    enabled before.

    Measured (bench_replay.py): reading the 1,000-row cassette (6.7 MB) took 0.22-0.24 s with
    it, 1.29-1.36 s without; replay in process 818-889 rows/s with it, 366-414 without.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
