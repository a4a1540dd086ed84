"""``GET /metrics``: Prometheus counters that match what the server did, exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from osmosis_rollout.cli import app

from .gates import CHAT, COMPLETED
from .serving import SERVER_KEY, Served, init_body, serving
from .support import load_asset

pytestmark = pytest.mark.anyio

mixed = load_asset("trajectory_agents")


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, keyed by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def get_metrics(s: Served, key: str | None = SERVER_KEY) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return await s.http.get("/metrics", headers=headers)


async def test_metrics_match_a_mixed_run_exactly(tmp_path: Path) -> None:
    """Completed and failed rollouts, refusals of four kinds, a duplicate, retried calls and a
    callback lost to the outbox: every counter says exactly that."""
    async with serving(mixed.MixedAgent(), tmp_path) as s:
        for i in (1, 2, 3):
            body = init_body(f"ok-{i}", metadata={"reward": 0.5}, idempotency_key=f"k-{i}")
            assert (await s.init(body)).status_code == 202
            await s.settle()
        assert (await s.init(init_body("bad", metadata={"kind": "error"}))).status_code == 202
        await s.settle()
        # a chat turn retried once, a callback retried once then delivered
        s.raw.fail_next(CHAT, 503)
        s.raw.fail_next(COMPLETED, 500)
        assert (await s.init(init_body("retried"))).status_code == 202
        await s.settle()
        # a callback that fails every attempt (1 + 3 retries) ends in the outbox
        for _ in range(4):
            s.raw.fail_next(COMPLETED, 503)
        assert (await s.init(init_body("lost"))).status_code == 202
        await s.settle()
        # a duplicate is answered again, not started again; refusals are counted by cause
        again = init_body("ok-1", metadata={"reward": 0.5}, idempotency_key="k-1")
        assert (await s.init(again)).status_code == 202
        assert (await s.init(init_body("other", idempotency_key="k-1"))).status_code == 409
        assert (await s.init(init_body("nokey"), key="wrong")).status_code == 401
        assert (await s.init(init_body("nokey"), key=None)).status_code == 401
        assert (await s.init(b'{"rollout_id": 1}')).status_code == 422
        response = await get_metrics(s)

        results = [s.completions(r)[0] for r in ("ok-1", "ok-2", "ok-3", "bad", "retried")]

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    m = scrape(response.text)
    assert value(m, "osmosis_rollouts_started_total") == 6
    assert value(m, "osmosis_rollouts_completed_total", finish_reason="stop") == 5
    assert value(m, "osmosis_rollouts_errored_total", finish_reason="error") == 1
    assert value(m, "osmosis_rollouts_rejected_total", cause="conflict") == 1
    assert value(m, "osmosis_rollouts_rejected_total", cause="unauthorized") == 2
    assert value(m, "osmosis_rollouts_rejected_total", cause="invalid") == 1
    assert value(m, "osmosis_callbacks_total", outcome="delivered") == 5
    assert value(m, "osmosis_callbacks_total", outcome="outbox") == 1
    assert value(m, "osmosis_traingate_retries_total", call="callback") == 1 + 3
    assert value(m, "osmosis_traingate_retries_total", call="chat") == 1
    assert value(m, "osmosis_outbox_size") == len(list((tmp_path / "outbox").glob("*.json"))) == 1
    assert value(m, "osmosis_rollouts_in_flight") == 0
    assert value(m, "osmosis_rollouts_queued") == 0
    # per-turn and per-tool observations add up to what the callbacks reported
    metrics = [r.metrics for r in results]
    turns = 2 * 5 + 1  # five two-turn rollouts (one lost to the outbox) and one that failed
    assert value(m, "osmosis_llm_turn_seconds_count") == turns
    assert sum(x.num_llm_calls for x in metrics) + 2 == turns  # + the lost rollout's two turns
    assert value(m, "osmosis_tool_call_seconds_count") == 5
    prompt = value(m, "osmosis_tokens_total", kind="prompt")
    completion = value(m, "osmosis_tokens_total", kind="completion")
    lost = s.gate.records["lost"].replies
    assert prompt == sum(x.prompt_tokens for x in metrics) + sum(
        r.usage.prompt_tokens for r in lost
    )
    assert completion == sum(x.response_tokens for x in metrics) + sum(
        r.usage.completion_tokens for r in lost
    )
    assert value(m, "osmosis_llm_turn_seconds_sum") > 0


async def test_inits_refused_by_the_screening_are_counted_by_cause(tmp_path: Path) -> None:
    """A page's ``Origin``, a foreign ``Host``, a body not sent as JSON and a forbidden
    destination each count under their own cause; other routes' refusals do not count."""
    async with serving(mixed.MixedAgent(), tmp_path) as s:
        body = init_body("r-s")
        assert (await s.init(body, Origin="https://evil.example")).status_code == 403
        assert (await s.init(body, Host="evil.example")).status_code == 400
        assert (await s.init(body, **{"Content-Type": "text/plain"})).status_code == 415
        aimed = init_body("r-m", server_url="http://169.254.169.254")
        assert (await s.init(aimed)).status_code == 422
        health = await s.http.get("/health", headers={"Origin": "https://evil.example"})
        response = await get_metrics(s)

    assert health.status_code == 403
    m = scrape(response.text)
    assert value(m, "osmosis_rollouts_rejected_total", cause="web_page") == 1
    assert value(m, "osmosis_rollouts_rejected_total", cause="foreign_host") == 1
    assert value(m, "osmosis_rollouts_rejected_total", cause="not_json") == 1
    assert value(m, "osmosis_rollouts_rejected_total", cause="invalid") == 1


async def test_metrics_need_the_server_key(tmp_path: Path) -> None:
    """With a server key, /metrics answers 401 without it, like an init would."""
    async with serving(mixed.MixedAgent(), tmp_path) as s:
        missing = await get_metrics(s, key=None)
        wrong = await get_metrics(s, key="nope")
        right = await get_metrics(s)
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert missing.json() == {"detail": "Invalid or missing API key"}


async def test_metrics_are_open_without_a_key_and_gone_when_turned_off(tmp_path: Path) -> None:
    async with serving(mixed.MixedAgent(), tmp_path, api_key=None) as s:
        assert (await get_metrics(s, key=None)).status_code == 200
    async with serving(mixed.MixedAgent(), tmp_path, metrics=False) as s:
        assert (await get_metrics(s)).status_code == 404
        assert (await s.init(init_body())).status_code == 202  # the rest still works
        await s.settle()


def test_serve_has_a_no_metrics_flag() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"])
    assert "--no-metrics" in result.stdout
