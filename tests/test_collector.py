"""The garbage collector around a batch and a cassette read: lighter while they run, and left
exactly as it was found (thresholds, frozen objects, enabled or not), errors included."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis_rollout.evaluation.collector import lighter_gc, paused_gc


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    """Whatever a failing test leaves, the next test gets the collector back as it was."""
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_a_batch_collects_less_and_leaves_the_collector_as_it_was() -> None:
    gc.set_threshold(700, 10, 10)
    with lighter_gc():
        assert gc.get_threshold()[0] > 700
        assert gc.get_freeze_count() > 0  # what was alive before is left out of collections
        with lighter_gc():  # a nested (or concurrent) batch changes nothing more
            assert gc.get_threshold()[0] > 700
        assert gc.get_freeze_count() > 0  # the inner batch did not restore early
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_the_collector_is_restored_when_the_batch_fails() -> None:
    gc.set_threshold(500, 7, 9)
    with pytest.raises(RuntimeError), lighter_gc():
        raise RuntimeError("row failed")
    assert gc.get_threshold() == (500, 7, 9)
    assert gc.get_freeze_count() == 0


def test_objects_a_program_froze_itself_stay_frozen() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    with lighter_gc():
        pass
    assert gc.get_freeze_count() > frozen // 2  # not handed back (a few may have died since)


def test_paused_gc_leaves_the_collector_enabled_or_disabled_as_it_was() -> None:
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()


@pytest.mark.anyio
async def test_run_batch_leaves_the_collector_as_it_was() -> None:
    from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch
    from osmosis_rollout.testing import Harness, MockLLMBackend
    from tests.support import calculator_agent

    gc.set_threshold(700, 10, 10)
    async with Harness(calculator_agent(), backend=MockLLMBackend()) as harness:
        rows = [RowInput(index=1, messages=[{"role": "user", "content": "What is 2 + 3?"}])]
        report = await run_batch(harness, rows, RunOptions())
    assert report.rows[0].status == "COMPLETED"
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def _run_command(dataset: Path) -> int:
    """``osmosis test`` over ``dataset`` in this process (the calculator example)."""
    from typer.testing import CliRunner

    from osmosis_rollout.cli import app

    root = Path(__file__).resolve().parent.parent
    target = f"{root}/examples/calculator/agent.py:CalculatorAgent"
    return CliRunner().invoke(app, ["test", target, "-d", str(dataset), "--limit", "2"]).exit_code


def test_a_command_leaves_the_collector_as_it_was_run_or_failed(tmp_path: Path) -> None:
    """``osmosis test`` (the setup pause of the collector, ``command_gc``, is gone: it moved no
    figure by 10%): a run, and a run that fails while it sets up, leave the collector on,
    with its threshold and nothing frozen."""
    root = Path(__file__).resolve().parent.parent
    gc.set_threshold(700, 10, 10)
    assert gc.isenabled()
    assert _run_command(root / "examples/calculator/dataset.jsonl") == 0
    assert gc.isenabled()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert _run_command(bad) == 2
    assert gc.isenabled()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_a_command_leaves_the_collector_off_when_it_was_off() -> None:
    """A program that turned the collector off keeps it off through ``osmosis test``."""
    root = Path(__file__).resolve().parent.parent
    gc.disable()
    try:
        assert _run_command(root / "examples/calculator/dataset.jsonl") == 0
        assert not gc.isenabled()  # it was off before the command: it stays off
    finally:
        gc.enable()
