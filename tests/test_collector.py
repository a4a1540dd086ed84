"""The garbage collector around a batch and a cassette read: lighter while they run, and left
exactly as it was found (thresholds, frozen objects, enabled or not), errors included."""

from __future__ import annotations

import gc
from collections.abc import Iterator

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
    from tests.test_inprocess_transports import calculator_agent

    gc.set_threshold(700, 10, 10)
    async with Harness(calculator_agent(), backend=MockLLMBackend()) as harness:
        rows = [RowInput(index=1, messages=[{"role": "user", "content": "What is 2 + 3?"}])]
        report = await run_batch(harness, rows, RunOptions())
    assert report.rows[0].status == "COMPLETED"
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_a_command_sets_up_without_collections_then_runs_with_them() -> None:
    """``command_gc``: off while the command sets up; ``ready()`` turns collections back on,
    freezing nothing; the end (or an error) leaves the collector as it was."""
    from osmosis_rollout.evaluation.collector import command_gc

    seen: dict[str, object] = {}

    def command() -> None:
        with command_gc() as ready:
            seen["off while setting up"] = not gc.isenabled()
            ready()
            seen["on after ready"] = gc.isenabled()
            seen["nothing frozen"] = gc.get_freeze_count() == 0
            raise RuntimeError("the run failed")

    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        command()
    assert seen == {"off while setting up": True, "on after ready": True, "nothing frozen": True}
    assert gc.isenabled()


def test_a_command_leaves_the_collector_off_when_it_was_off() -> None:
    from osmosis_rollout.evaluation.collector import command_gc

    gc.disable()
    with command_gc() as ready:
        ready()
        assert not gc.isenabled()  # it was off before the command: it stays off
    assert not gc.isenabled()
