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
    """A command's collector: none while it sets up, then what it set up frozen.

    ``with command_gc() as ready: <set up>; ready(); <run>``. Setting up (imports done, the
    agent loaded, a cassette of thousands of rows read) builds long-lived objects only; with the
    collector on, each is walked two or three times before it settles in the oldest generation
    (~0.1 s for a 1,000-row cassette). Disabled meanwhile, and frozen by ``ready()``
    (``gc.freeze``), they are never walked; the first collection after would otherwise walk
    them all at once. On exit the collector is as it was (unfrozen if this froze).
    """
    enabled = gc.isenabled()
    froze = False

    def ready() -> None:
        nonlocal froze
        if not froze and gc.get_freeze_count() == 0:
            gc.freeze()
            froze = True
        if enabled:
            gc.enable()

    gc.disable()
    try:
        yield ready
    finally:
        if froze:
            gc.unfreeze()
        if enabled:
            gc.enable()
