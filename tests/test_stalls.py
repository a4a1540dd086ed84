"""``evaluation.stalls``: what counts as the agent blocking the event loop.

The monitor's end-to-end tests (a ``time.sleep`` in ``run``, CPU-bound code) are in
tests/test_tool_errors.py; here, the waits that are not the agent's blocking code.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
import time
from pathlib import Path
from types import FrameType

import pytest

from osmosis_rollout.evaluation import TestOptions, run_test, stalls
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


def test_reading_the_ca_certificates_for_a_new_http_client_is_once_only() -> None:
    """The OpenAI Agents SDK's first ``Runner.run`` builds its trace exporter's HTTP client,
    whose TLS context read the CA certificates for 0.27 s on a loaded machine: the template's
    first row failed with a false ``event_loop_stall`` (CI, Python 3.13). Other functions of
    ssl.py, and a user's function of the same name, are still judged."""
    ssl_py = os.path.join(os.sep, "usr", "lib", "python3.13", "ssl.py")
    assert _handing_over(_frame_of("create_default_context", ssl_py))
    assert _handing_over(_frame_of("load_default_certs", ssl_py))
    assert not _handing_over(_frame_of("recv", ssl_py))
    agent_py = os.path.join(os.sep, "work", "agent.py")
    assert not _handing_over(_frame_of("create_default_context", agent_py))


TLS_AGENT = """
import ssl
from osmosis_rollout import RolloutAgentLoop


class Tls(RolloutAgentLoop):
    name = "tls"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        ssl.create_default_context()  # an HTTP client made on the loop, as the Agents SDK does
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete([*ctx.request.messages, result.message], reward=1.0)
"""


def test_a_slow_certificate_load_under_run_is_no_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the certificates take 0.3 s to read (a loaded machine) inside the agent's
    ``run``; the row passes with no finding (a ``time.sleep`` of that length in ``run`` is one:
    tests/test_tool_errors.py)."""

    def slow_certificates(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        time.sleep(0.3)

    monkeypatch.setattr(ssl.SSLContext, "load_default_certs", slow_certificates)
    agent = tmp_path / "tls_agent.py"
    agent.write_text(TLS_AGENT)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"user_prompt": "q"}) + "\n")
    report = asyncio.run(run_test(TestOptions(target=f"{agent}:Tls", dataset=rows)))
    assert report.rows[0].findings == []
    assert report.summary["passed"] == 1


def _turn(
    monitor: stalls.StallMonitor, *looks: tuple[str, str, bool] | None, tick: float = 0.05
) -> None:
    """One late turn of the loop: a look every ``tick`` seconds after the heartbeat was due."""
    monitor._beat_at = time.perf_counter() - monitor.tick_s - tick * len(looks)
    for i, found in enumerate(looks, 1):
        monitor._look(monitor._beat_at, found, monitor._beat_at + monitor.tick_s + i * tick)


def _stalled(monitor: stalls.StallMonitor, *rollouts: str) -> dict[str, float]:
    return {
        rid: f.details["stall_s"]
        for rid in rollouts
        for f in monitor.take(rid)
        if f.details is not None
    }


def test_a_blocking_call_followed_by_a_little_library_work_is_still_the_rollouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI, load 2+ on 2 cores: a 0.4 s ``time.sleep`` in ``run`` got no finding, because the
    watchdog's last look fell on the rollout's ``complete`` (this library's code) before the
    loop's next turn. The time each look saw a rollout's code is that rollout's; a turn whose
    looks were spread over many rollouts each doing a little (a loaded loop) is no one's."""
    monkeypatch.setattr(stalls.StallMonitor, "_queued", lambda self, seconds: False)
    where = ("row-0", "agent.py:15 in run", False)
    monitor = stalls.StallMonitor(threshold_s=0.2, tick_s=0.02)
    _turn(monitor, where, where, where, where, where, None)  # the sleep, then complete()
    assert _stalled(monitor, "row-0") == {"row-0": pytest.approx(0.25, abs=0.01)}
    _turn(monitor, where, None, None, None, None, None)  # mostly this library's work
    assert not _stalled(monitor, "row-0")
    many = [(f"row-{i}", "agent.py:9 in run", False) for i in range(8)]
    _turn(monitor, *many)  # 8 rollouts' steps in one turn: 0.05 s each
    assert not _stalled(monitor, *(rid for rid, _, _ in many))
    _turn(monitor, None, None, None, None, None)  # never inside a rollout
    assert not _stalled(monitor, "row-0")


def test_each_rollout_that_blocked_in_one_late_turn_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cold trial: six rollouts each ran ``time.sleep(0.3)`` before their first
    ``ctx.chat``, all in the loop's first turn (1.8 s); the monitor took the turn for several
    rollouts' steps and reported none in three runs of four. Each is its own stall."""
    monkeypatch.setattr(stalls.StallMonitor, "_queued", lambda self, seconds: False)
    monitor = stalls.StallMonitor(threshold_s=0.2, tick_s=0.02)
    looks = [(f"row-{i}", "agent.py:14 in run", False) for i in range(6) for _ in range(6)]
    _turn(monitor, *looks)
    found = _stalled(monitor, *(f"row-{i}" for i in range(6)))
    assert found == {f"row-{i}": pytest.approx(0.3, abs=0.01) for i in range(6)}


def test_a_librarys_first_stall_at_a_line_is_its_setup_and_the_second_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A library's first call builds what it needs once (the Agents SDK's first ``Runner.run``:
    its models' schemas, its HTTP clients), which on a loaded machine held the loop past the
    threshold and failed a template's row (CI). The first stall of a user's line inside a
    library is excused; a blocking call there (a sync HTTP client in ``run``) stalls again and
    is reported. A stall in the user's own code (a ``time.sleep``) is reported the first time."""
    monkeypatch.setattr(stalls.StallMonitor, "_queued", lambda self, seconds: False)
    monitor = stalls.StallMonitor(threshold_s=0.2, tick_s=0.02)

    def stall(rollout: str, where: str, in_library: bool) -> bool:
        _turn(monitor, *[(rollout, where, in_library)] * 6)
        return bool(_stalled(monitor, rollout))

    assert not stall("row-0", "agent.py:20 in run", True)
    assert stall("row-1", "agent.py:20 in run", True)
    assert not stall("row-2", "agent.py:30 in run", True)  # another line's first call
    assert stall("row-3", "agent.py:15 in run", False)
