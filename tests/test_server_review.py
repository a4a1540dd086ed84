"""Regressions from the code review: one bad rollout must never take the server down."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import anyio
import pytest

from osmosis_rollout.protocol import RolloutRequest
from osmosis_rollout.server.registry import FinishedRecord

from .gates import CHAT, COMPLETED
from .serving import TG_KEY, init_body, serving
from .support import load_asset
from .test_server import agents

pytestmark = pytest.mark.anyio

rev = load_asset("rev_agents")


async def test_non_ascii_rollout_id_runs_with_an_encoded_request_id(tmp_path: Path) -> None:
    """A non-ASCII rollout_id (allowed) completes; X-Request-Id is percent-encoded ASCII."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body("résumé-1"))
        await s.settle()
        health = (await s.health()).json()

    assert response.status_code == 202
    [result] = s.completions("résumé-1")
    assert result.status == "COMPLETED"
    ids = [c.headers["x-request-id"] for c in s.raw.calls_to(CHAT)]
    assert ids == ["r%C3%A9sum%C3%A9-1:1", "r%C3%A9sum%C3%A9-1:2"]
    assert unquote(ids[0]) == "résumé-1:1"
    assert health["status"] == "healthy"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("api_key", "clé-secrète", "api_key must be printable ASCII"),
        ("server_url", "http://traingate.test:99999", "invalid port"),
        ("server_url", "http://traingate.test:abc", "invalid port"),
        ("completion_params", {"temperature": "hot"}, "temperature"),
        ("completion_params", {"max_tokens": "many"}, "max_tokens"),
    ],
)
async def test_values_that_would_break_every_call_are_refused_at_init(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    """What would make each later call fail is a 422 at init, and the server stays healthy."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body(**{field: value}))
        after = await s.init(init_body("r-2"))
        await s.settle()

    assert response.status_code == 422
    assert message in response.text
    assert after.status_code == 202
    assert len(s.completions("r-2")) == 1


async def test_non_json_message_ends_in_one_error_callback(tmp_path: Path) -> None:
    """An agent that puts a non-JSON object in a message gets ERROR, not a dead server."""
    async with serving(rev.OpaqueMessageAgent(), tmp_path) as s:
        await s.init(init_body())
        await s.init(init_body("r-2"))
        await s.settle()
        health = (await s.health()).json()

    for rid in ("r-1", "r-2"):
        [result] = s.completions(rid)
        assert result.status == "ERROR"
        assert "Opaque" in (result.error_message or "")
    assert health["status"] == "healthy"
    assert health["completed_rollouts"] == 2


async def test_non_json_final_messages_are_sent_as_text(tmp_path: Path) -> None:
    """A result with a non-JSON object becomes ERROR with that value kept as text."""
    async with serving(rev.OpaqueResultAgent(), tmp_path, replies=[{"content": "hi"}]) as s:
        await s.init(init_body())
        await s.settle()

    [result] = s.completions("r-1")
    assert result.status == "ERROR"
    assert "cannot be sent" in (result.error_message or "")
    assert result.final_messages[-1]["content"] == "<Opaque>"


async def test_get_tools_that_hangs_is_refused_and_frees_the_key(tmp_path: Path) -> None:
    """get_tools past its timeout: 500 with a reason; the same key may be retried at once."""
    async with serving(rev.SlowToolsAgent(), tmp_path, settings=None) as s:
        s.server.settings = s.server.settings.model_copy(update={"get_tools_timeout_s": 0.2})
        first = await s.init(init_body())
        second = await s.init(init_body())

    assert first.status_code == 500
    assert "did not return within 0.2 s" in first.text
    assert second.status_code == 500  # retried, not stuck behind a pending entry
    assert s.completions("r-1") == []


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


async def test_drain_is_bounded_when_traingate_never_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the grace period, a callback stuck on a dead TrainGate goes to the outbox."""
    from osmosis_rollout.server import app as server_app

    monkeypatch.setattr(server_app, "_DELIVERY_GRACE_S", 0.2)
    stuck = anyio.Event()

    async with serving(agents.ToolAgent(), tmp_path, replies=[{"content": "done"}]) as s:
        client = s.server.client
        assert client is not None

        async def hang(*args: object, **kwargs: object) -> None:
            stuck.set()
            await anyio.sleep(60)

        client.complete_rollout = hang  # type: ignore[method-assign]
        await s.init(init_body())
        with anyio.fail_after(5):
            await stuck.wait()
        with anyio.fail_after(5):
            await s.server.drain()
    files = list((tmp_path / "outbox").iterdir())
    assert len(files) == 1
    assert TG_KEY not in files[0].read_text()
    assert s.raw.calls_to(COMPLETED) == []


def test_rollout_request_still_accepts_plain_values() -> None:
    """The new checks leave ordinary requests alone (unknown sampling keys pass through)."""
    request = RolloutRequest.model_validate(
        init_body(completion_params={"temperature": 1, "stop": "x", "seed": 3, "top_k": 5})
    )
    assert request.completion_params["top_k"] == 5
