"""server/registry.py through the in-process server: what a finished rollout leaves behind (an id,
a fingerprint, an outcome and the first 202, never its conversation), capped oldest first."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_rollout.server.registry import FinishedRecord

from .gates import COMPLETED
from .serving import init_body, serving
from .support import load_asset

pytestmark = pytest.mark.anyio

agents = load_asset("srv_agents")


async def test_finished_records_do_not_keep_the_conversation(tmp_path: Path) -> None:
    """A finished rollout's record keeps ids and the 202 body, not its messages or context."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        first = await s.init(init_body(metadata={"blob": "x" * 10_000}))
        await s.settle()
        entry = s.server.registry.by_key["r-1"]
        replay = await s.init(init_body(metadata={"blob": "x" * 10_000}))

    assert isinstance(entry, FinishedRecord)  # no request, no context: only what dedup needs
    assert not hasattr(entry, "request")
    assert not hasattr(entry, "control")
    assert replay.status_code == 202
    assert replay.content == first.content
    assert len(s.completions("r-1")) == 1


async def test_finished_records_are_compact_share_their_tools_and_replay_the_same_202(
    tmp_path: Path,
) -> None:
    """A finished rollout leaves an id, a fingerprint and an outcome (the tools JSON shared by
    every record with the same tools); a duplicate still gets the first 202, byte for byte."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        first = await s.init(init_body("a", metadata={"no_chat": True}))
        await s.init(init_body("b", metadata={"no_chat": True}))
        await s.settle()
        records = [s.server.registry.by_key[k] for k in ("a", "b")]
        replay = await s.init(init_body("a", metadata={"no_chat": True}))

    a, b = records
    assert isinstance(a, FinishedRecord)
    assert isinstance(b, FinishedRecord)
    assert (a.rollout_id, a.outcome) == ("a", "COMPLETED")
    assert a.fingerprint != b.fingerprint  # the bodies differ by their rollout_id
    assert a.tools is b.tools  # one copy of the tools for every record
    assert replay.status_code == 202
    assert replay.content == first.content
    assert len(s.completions("a")) == 1


async def test_finished_records_are_capped_oldest_first(tmp_path: Path) -> None:
    """Past ``max_records`` the oldest records go, so a long run's memory stays bounded."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        s.server.registry.max_records = 3
        for i in range(5):
            await s.init(init_body(f"r{i}", metadata={"no_chat": True}))
            await s.settle()
        kept = sorted(s.server.registry.by_key)
        count = s.server.registry.records

    assert kept == ["r2", "r3", "r4"]
    assert count == 3


async def test_an_undelivered_rollout_leaves_an_outbox_record(tmp_path: Path) -> None:
    """The record's outcome says where the result went: the callback's status, or the outbox."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        for _ in range(4):
            s.raw.fail_next(COMPLETED, 500)
        await s.init(init_body("lost", metadata={"no_chat": True}))
        await s.settle()
        record = s.server.registry.by_key["lost"]

    assert isinstance(record, FinishedRecord)
    assert record.outcome == "outbox"


async def test_a_finished_record_keeps_its_end_for_status_found_by_rollout_id(
    tmp_path: Path,
) -> None:
    """A record keeps how the rollout ended (status, reward), found by rollout id whether its
    idempotency key is its id or another; rollouts that ended alike share one ending."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        await s.init(init_body("a", metadata={"no_chat": True}))
        await s.init(init_body("b", metadata={"no_chat": True}, idempotency_key="key-b"))
        await s.settle()
        registry = s.server.registry
        a, b = registry.finished("a"), registry.finished("b")

    assert a is not None
    assert b is not None
    assert (a.rollout_id, b.rollout_id) == ("a", "b")
    assert a.terminal == ("success", 0.5, None)
    assert a.terminal is b.terminal  # one shared ending, not a tuple per record
    assert list(registry.finished_ids) == ["b"]  # a second index only where the key differs
    assert registry.finished("nobody") is None
