"""How many worker processes ``osmosis test --jobs auto`` starts: as many as can help.

Apart from the pool (``parallel.py``) because it is a rule, not machinery: a pure function of the
CPUs this process may use, the machine's load and the run's size, tested as such.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["AutoJobs", "auto_jobs", "cpu_count", "machine_load"]


def cpu_count() -> int:
    """The CPUs this process may run on (``--jobs auto``): its affinity mask where known."""
    counter = getattr(os, "process_cpu_count", None)  # 3.13+
    if counter is not None:
        return int(counter() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


#: ``--jobs auto`` runs one process when fewer CPUs than this are free: a second worker sharing a
#: busy core pays its start-up and the hand-offs and wins nothing (issue 30: slower than one).
AUTO_MIN_FREE_CPUS = 1.5
#: Rows each worker ``auto`` starts must have: starting one (spawn, import) costs about what
#: 200 mock or replayed rows cost, so a smaller run is done sooner by one process.
AUTO_ROWS_PER_WORKER = 200


@dataclass(frozen=True)
class AutoJobs:
    """What ``--jobs auto`` chose: ``count`` worker processes (1: none), and why."""

    count: int
    reason: str


def auto_jobs(
    cpus: int, load: float | None, rows: int | None, *, machine_cpus: int | None = None
) -> AutoJobs:
    """``--jobs auto``: as many workers as can help, a pure rule (see the README's ``--jobs``).

    ``cpus`` are the CPUs this process may use, ``load`` the machine's 1-minute load average
    (None: unknown, taken as idle) over its ``machine_cpus`` (default ``cpus``), of which the
    share on our CPUs is busy. Fewer than :data:`AUTO_MIN_FREE_CPUS` free: 1. Otherwise one
    worker per free CPU (rounded), and no more than one per :data:`AUTO_ROWS_PER_WORKER` rows
    when the run's ``rows`` are known.
    """
    cpus = max(1, cpus)
    busy = 0.0
    if load is not None and load > 0:
        busy = min(float(cpus), load * cpus / max(cpus, machine_cpus or cpus))
    free = cpus - busy
    if cpus == 1:
        return AutoJobs(1, "1 CPU")
    if free < AUTO_MIN_FREE_CPUS:
        return AutoJobs(1, f"{free:.1f} of {cpus} CPUs free at load {load:.1f}")
    count = min(cpus, int(free + 0.5))
    if rows is not None and rows // AUTO_ROWS_PER_WORKER < count:
        count = max(1, rows // AUTO_ROWS_PER_WORKER)
        if count == 1:
            return AutoJobs(1, f"{rows} rows: workers pay off from {2 * AUTO_ROWS_PER_WORKER}")
        return AutoJobs(count, f"{rows} rows, {AUTO_ROWS_PER_WORKER} or more per worker")
    return AutoJobs(count, f"{free:.1f} of {cpus} CPUs free")


def machine_load() -> float | None:
    """The machine's 1-minute load average, None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
