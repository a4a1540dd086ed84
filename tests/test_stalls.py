"""``evaluation.stalls``: what counts as the agent blocking the event loop.

The monitor's end-to-end tests (a ``time.sleep`` in ``run``, CPU-bound code) are in
tests/test_tool_errors.py; here, the waits that are not the agent's blocking code.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

import pytest

from osmosis_rollout.evaluation import stalls
from osmosis_rollout.evaluation.stalls import _handing_over


def _frame_of(function: str, filename: str) -> FrameType:
    """A real frame of a function named ``function`` defined in ``filename``."""
    namespace: dict[str, object] = {"sys": sys}
    code = f"def {function}():\n    return sys._getframe()\n"
    exec(compile(code, filename, "exec"), namespace)  # a fixed test source
    frame = namespace[function]()  # type: ignore[operator]
    assert isinstance(frame, FrameType)
    return frame


def test_starting_a_thread_or_importing_is_not_the_agent_blocking_the_loop() -> None:
    """The openai client's first call starts a worker thread (``asyncio.to_thread``); on a busy
    machine ``Thread.start`` waited 0.65 s for the thread to run, and its row failed with a
    false ``event_loop_stall``. A module's first import is the same kind of once-only wait."""
    threading_py = os.path.join(os.sep, "usr", "lib", "python3.11", "threading.py")
    assert _handing_over(_frame_of("start", threading_py))
    assert _handing_over(_frame_of("_load", "<frozen importlib._bootstrap>"))


def test_the_agents_own_code_and_other_thread_calls_are_judged() -> None:
    """A user's function, even one named ``start``, and other functions of threading.py (a
    ``Lock.acquire`` the agent holds up) are not excused."""
    assert not _handing_over(_frame_of("start", os.path.join(os.sep, "work", "agent.py")))
    threading_py = os.path.join(os.sep, "usr", "lib", "python3.11", "threading.py")
    assert not _handing_over(_frame_of("wait", threading_py))


def test_a_stall_mostly_spent_waiting_for_a_cpu_is_the_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At load 8 on 2 cores the openai client's first call held the loop 0.35 s of CPU while
    the loop thread waited 0.9 s for a CPU: not reported. A sleep of the same length on the
    loop, with no wait for a CPU, is."""
    monitor = stalls.StallMonitor(threshold_s=0.2)
    monitor._beat_at = 10.0
    monitor._waits.append((9.99, (0, 0), 0))
    monkeypatch.setattr(stalls, "_sched_times", lambda native_id: (350_000_000, 900_000_000))
    monkeypatch.setattr(stalls, "_process_wait", lambda: 900_000_000)
    assert monitor._queued(1.25)
    monkeypatch.setattr(stalls, "_sched_times", lambda native_id: (10_000_000, 5_000_000))
    monkeypatch.setattr(stalls, "_process_wait", lambda: 5_000_000)
    assert not monitor._queued(0.5)  # 0.485 s slept on the loop: the agent's time.sleep
