"""The garbage collector around the bulk work of ``osmosis test``: a batch of rows, a cassette.

Both allocate heavily while many long-lived objects are alive (the agent, the modules, a
replayed cassette's rows), and each full collection walks all of them: measured on a 1,000-row
replay, collections cost ~1 ms of CPU a row, a fifth of the run, and half of reading the cassette.
These context managers make that cheaper without changing what is freed.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["command_gc", "lighter_gc", "paused_gc"]

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
    enabled before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def command_gc() -> Iterator[Callable[[], None]]:
    """A command's collector: none while it sets up, back on when it is ready to run.

    ``with command_gc() as ready: <set up>; ready(); <run>``. Setting up (imports done, the
    agent loaded, a cassette of thousands of rows read) builds long-lived objects only, which
    collections would only walk; the batch then freezes them (:func:`lighter_gc`). Not frozen
    here: freezing and unfreezing what the agent built changed the order in which the last
    collection at exit finalizes it, and an agent in a reference cycle with a buffered file
    lost the file's unflushed data (tests/test_cli_test.py). On exit the collector is enabled
    or not as it was.
    """
    enabled = gc.isenabled()

    def ready() -> None:
        if enabled:
            gc.enable()

    gc.disable()
    try:
        yield ready
    finally:
        if enabled:
            gc.enable()
