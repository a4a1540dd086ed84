"""The rollout server in-process: ``create_app`` through ``httpx2.ASGITransport``.

TrainGate is a ``MockTrainGate`` behind a ``RecordingGate`` (``serving`` in tests/serving.py) that
keeps every raw request and can answer chosen calls with a fault first. Every test checks the
one-callback rule at the gate.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import pytest

from osmosis_rollout import RolloutAgentLoop

from .gates import CHAT, COMPLETED
from .serving import SERVER_KEY, TG_KEY, init_body, serving
from .support import free_port, load_asset

pytestmark = pytest.mark.anyio

EMPTY_PARAMETERS = {"type": "object", "properties": {}}
#: The roles of a finished two-turn tool rollout's final messages.
TOOL_TURN_ROLES = ["user", "assistant", "tool", "assistant"]

agents = load_asset("srv_agents")


# --------------------------------------------------------------------------------------------
# The happy path, in-process
# --------------------------------------------------------------------------------------------


async def test_tool_rollout_returns_tools_and_sends_one_complete_callback(tmp_path: Path) -> None:
    """A two-turn tool rollout gets 202 with the full tool schemas and one COMPLETED callback."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body())
        await s.settle()

    assert response.status_code == 202
    body = response.json()
    assert body["rollout_id"] == "r-1"
    assert body["tools"] == [
        agents.ADD_TOOL,  # the full JSON Schema, nested keywords and `"default": null` kept
        {"type": "function", "function": {"name": "note", "parameters": EMPTY_PARAMETERS}},
    ]
    [result] = s.completions("r-1")
    assert result.status == "COMPLETED"
    assert result.reward == 1.0
    assert [m["role"] for m in result.final_messages] == TOOL_TURN_ROLES
    assert s.gate.findings == []
    assert not (tmp_path / "outbox").exists()


# --------------------------------------------------------------------------------------------
# Faults: each ends in exactly one callback and loses nothing
# --------------------------------------------------------------------------------------------


async def test_callback_500_then_200_is_retried_and_delivered_once(tmp_path: Path) -> None:
    """A 500 on the callback is retried with the same body; the gate accepts exactly one."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        s.raw.fail_next(COMPLETED, 500)
        await s.init(init_body())
        await s.settle()

    first, second = s.raw.calls_to(COMPLETED)
    assert first.body == second.body
    assert first.headers["x-request-id"] == second.headers["x-request-id"] == "r-1:completed"
    assert len(s.completions("r-1")) == 1
    assert s.completions("r-1")[0].status == "COMPLETED"
    assert len(s.sleeps.delays) == 1
    assert not (tmp_path / "outbox").exists()


async def test_chat_429_honours_retry_after_and_keeps_the_request_id(tmp_path: Path) -> None:
    """A 429 with Retry-After on a chat turn waits that long, retries the same turn, completes."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        s.raw.fail_next(CHAT, 429, {"Retry-After": "2"})
        await s.init(init_body())
        await s.settle()

    chats = s.raw.calls_to(CHAT)
    assert [c.headers["x-request-id"] for c in chats] == ["r-1:1", "r-1:1", "r-1:2"]
    assert chats[0].body == chats[1].body
    assert s.sleeps.delays == [2.0]
    [result] = s.completions("r-1")
    assert result.status == "COMPLETED"
    assert result.metrics is not None
    assert result.metrics.num_llm_calls == 2


async def test_refused_callback_lands_in_the_outbox_without_the_api_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Connection refused on every callback attempt: the full response goes to the outbox."""
    url = f"http://127.0.0.1:{free_port()}"
    async with serving(agents.ToolAgent(), tmp_path, refuse_callbacks=True) as s:
        s.gate.expect("r-1", api_key=TG_KEY)
        response = await s.init(init_body(server_url=url))
        await s.settle()
        health = (await s.health()).json()

    assert response.status_code == 202
    assert len(s.sleeps.delays) == 3  # the protocol's three retries, then give up
    assert s.completions("r-1") == []
    files = list((tmp_path / "outbox").iterdir())
    assert len(files) == 1
    assert re.fullmatch(r"r-1\.\d{8}T\d{6}\.[0-9a-f]{6}\.json", files[0].name)
    text = files[0].read_text(encoding="utf-8")
    assert TG_KEY not in text
    record = json.loads(text)
    assert record["server_url"] == url
    assert "could not reach" in record["error"]
    saved = record["response"]
    assert saved["rollout_id"] == "r-1"
    assert saved["status"] == "COMPLETED"
    assert saved["reward"] == 1.0
    assert [m["role"] for m in saved["final_messages"]] == TOOL_TURN_ROLES
    assert saved["metrics"]["num_llm_calls"] == 2
    assert saved["metrics"]["num_tool_calls"] == 1
    assert health["completed_rollouts"] == 1
    assert files[0].name in caplog.text
    assert TG_KEY not in caplog.text


async def test_raising_agent_sends_error_with_the_partial_conversation(tmp_path: Path) -> None:
    """An agent that raises mid-rollout ends in one ERROR callback holding the turns so far."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        await s.init(init_body(metadata={"raise_after_tools": True}))
        await s.settle()

    [result] = s.completions("r-1")
    assert result.status == "ERROR"
    assert result.finish_reason == "error"
    assert result.error_message == "agent raised RuntimeError: the calculator broke"
    assert [m["role"] for m in result.final_messages] == ["user", "assistant"]
    assert result.final_messages[1]["tool_calls"][0]["function"]["name"] == "add"


async def test_hanging_agent_times_out_at_its_deadline(tmp_path: Path) -> None:
    """An agent that hangs gets one ERROR/timeout callback once ``rollout_timeout_s`` passes."""
    async with serving(agents.ToolAgent(), tmp_path, rollout_timeout_s=0.3) as s:
        started = anyio.current_time()
        await s.init(init_body(metadata={"hang_after_tools": True}))
        await s.settle()
        elapsed = anyio.current_time() - started

    [result] = s.completions("r-1")
    assert result.status == "ERROR"
    assert result.finish_reason == "timeout"
    assert result.error_message == "rollout exceeded its deadline of 0.3 s"
    assert [m["role"] for m in result.final_messages] == ["user", "assistant"]
    assert 0.3 <= elapsed < 3


async def test_drain_lets_rollouts_finish_within_the_grace_period(tmp_path: Path) -> None:
    """While draining, /health says 503 draining and inits get 503; finished work completes."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, shutdown_grace_s=30) as s:
        await s.init(init_body("a"))
        await s.init(init_body("b"))
        await agent.started.wait()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(s.server.drain)
            while not s.server.registry.draining:
                await anyio.lowlevel.checkpoint()
            health = await s.health()
            refused = await s.init(init_body("c"))
            agent.release.set()
        assert s.server.registry.unfinished() == []

    assert health.status_code == 503
    assert health.json()["status"] == "draining"
    assert health.json()["active_rollouts"] == 2
    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert [s.completions(r)[0].status for r in ("a", "b")] == ["COMPLETED", "COMPLETED"]
    assert [len(s.completions(r)) for r in ("a", "b")] == [1, 1]
    assert len(s.raw.calls_to(COMPLETED)) == 2
    assert "c" not in agent.runs


async def test_drain_cancels_what_outlives_the_grace_period(tmp_path: Path) -> None:
    """Rollouts still running after the grace period end with one ERROR/cancelled each."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, max_concurrent=1, shutdown_grace_s=0.2) as s:
        await s.init(init_body("running"))
        await s.init(init_body("queued"))
        await agent.started.wait()
        started = anyio.current_time()
        with anyio.fail_after(5):
            await s.server.drain()
        elapsed = anyio.current_time() - started

    assert elapsed >= 0.2
    for rid in ("running", "queued"):
        [result] = s.completions(rid)
        assert result.status == "ERROR"
        assert result.finish_reason == "cancelled"
        assert result.final_messages == [{"role": "user", "content": "What is 3 + 4?"}]
    assert agent.runs == ["running"]  # the queued one never reached the agent


class _Stubborn(RolloutAgentLoop):
    """Finishes its work whatever happens (a shielded wait): it outlives the whole drain."""

    name = "stubborn"

    def __init__(self) -> None:
        self.started = anyio.Event()

    def get_tools(self, request: Any) -> list[Any]:
        return []

    async def run(self, ctx: Any) -> Any:
        self.started.set()
        with anyio.CancelScope(shield=True):  # past the drain's last 1 s wait for deliveries
            await anyio.sleep(1.3)
        return ctx.complete([{"role": "assistant", "content": "done anyway"}])


async def test_rollouts_left_after_the_drain_are_stopped_and_kept(tmp_path: Path) -> None:
    """At shutdown, the rollout still queued behind one that outlived the drain is stopped and
    its result kept in the outbox; the one that outlived it still ends in exactly one callback
    or outbox entry."""
    agent = _Stubborn()
    async with serving(agent, tmp_path, max_concurrent=1) as s:
        s.server.delivery_grace_s = 0.05
        await s.init(init_body("running"))
        await s.init(init_body("queued"))
        await agent.started.wait()

    saved = [json.loads(f.read_text()) for f in (tmp_path / "outbox").iterdir()]
    kept = {record["response"]["rollout_id"]: record for record in saved}
    assert len(kept) == len(saved)  # one entry per rollout at most
    assert s.completions("queued") == []
    assert kept["queued"]["response"]["finish_reason"] == "cancelled"
    assert kept["queued"]["error"] == "server stopped before the rollout ran"
    ran = [r.status for r in s.completions("running")]
    if "running" in kept:
        ran.append(kept["running"]["response"]["status"])
    assert ran == ["COMPLETED"]
    assert s.server.registry.unfinished() == []


# --------------------------------------------------------------------------------------------
# Bad input: 4xx with a clear message, the server stays healthy, no callback is sent
# --------------------------------------------------------------------------------------------

BIG_METADATA = {"blob": "x" * (2 * 1024 * 1024)}

BAD_BODIES = [
    pytest.param(b'{"rollout_id": "r-1",', "json_invalid", id="malformed-json"),
    pytest.param(
        init_body(rollout_id=5, messages="hello", max_turns="many"), "string_type", id="wrong-types"
    ),
    pytest.param(init_body(metadata=BIG_METADATA), "the limit is 1048576", id="2mib-metadata"),
    pytest.param(init_body(rollout_id="   "), "only whitespace", id="blank-rollout-id"),
    pytest.param(init_body(rollout_id="r" * 300), "at most 256", id="300-char-rollout-id"),
    pytest.param(init_body(server_url="ftp://gate.test"), "http:// or https://", id="non-http"),
    pytest.param(init_body(completion_params=None), "dict_type", id="null-params"),
    pytest.param(b"[1, 2]", "model_type", id="not-an-object"),
]


@pytest.mark.parametrize(("body", "expected"), BAD_BODIES)
async def test_invalid_init_gets_422_without_echo(
    tmp_path: Path, body: dict[str, Any] | bytes, expected: str
) -> None:
    """An invalid body gets a 422 detail list that never echoes input (not even the api_key)."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        content = json.dumps(body).encode() if isinstance(body, dict) else body
        response = await s.init(content)
        health = await s.health()

    assert response.status_code == 422
    assert expected in response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list)
    assert detail
    assert all(set(d) == {"loc", "msg", "type"} for d in detail)
    assert all(d["loc"][0] == "body" for d in detail)
    assert TG_KEY not in response.text
    assert "xxxxxxxx" not in response.text
    assert len(response.content) < 2000
    assert health.status_code == 200
    assert health.json()["active_rollouts"] == 0
    assert s.raw.calls == []
    assert s.server.registry.by_key == {}


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="missing"),
        pytest.param({"Authorization": "Bearer wrong-key"}, id="wrong"),
        pytest.param({"Authorization": f"Basic {SERVER_KEY}"}, id="other-scheme"),
        pytest.param({"Authorization": "Bearer "}, id="empty-bearer"),
    ],
)
async def test_init_without_the_server_key_gets_401(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    """A missing or wrong server key is a 401 with a fixed message, and nothing starts."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body(), key=None, **headers)
        health = await s.health()

    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or missing API key"}
    assert health.json()["status"] == "healthy"
    assert s.raw.calls == []


async def test_non_ascii_authorization_header_is_401_not_500(tmp_path: Path) -> None:
    """A UTF-8 Authorization header is refused with 401, and the server stays healthy."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.http.post(
            "/v1/rollout/init",
            content=json.dumps(init_body()).encode(),
            headers={"Authorization": "Bearer ключ-🔑".encode()},
        )
        health = await s.health()

    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or missing API key"}
    assert health.status_code == 200
    assert s.raw.calls == []


async def test_auth_is_checked_before_parsing(tmp_path: Path) -> None:
    """A wrong key with a malformed body gets 401, not 422: strangers learn nothing."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(b"{not json", key="wrong")

    assert response.status_code == 401


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {SERVER_KEY}", f"bearer {SERVER_KEY}", f"BEARER  {SERVER_KEY} ", SERVER_KEY],
    ids=["Bearer", "bearer", "BEARER-spaces", "bare"],
)
async def test_server_key_forms_are_accepted(tmp_path: Path, authorization: str) -> None:
    """``Bearer <k>`` in any case, and a bare ``<k>``, authenticate an init."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body(), key=None, Authorization=authorization)
        await s.settle()

    assert response.status_code == 202
    assert len(s.completions("r-1")) == 1


async def test_platform_health_needs_the_server_key(tmp_path: Path) -> None:
    """/platform/health: 404 on a keyless server; 401 on a bad key; the /health body with it."""
    async with serving(agents.ToolAgent(), tmp_path, api_key=None) as keyless:
        unkeyed = await keyless.http.get("/platform/health")
    async with serving(agents.ToolAgent(), tmp_path) as s:
        missing = await s.http.get("/platform/health")
        bad = await s.http.get("/platform/health", headers={"Authorization": "Bearer nope"})
        good = await s.http.get("/platform/health", headers={"Authorization": SERVER_KEY})

    assert unkeyed.status_code == 404
    assert missing.status_code == 401
    assert bad.status_code == 401
    assert good.status_code == 200
    assert good.json() == {
        "status": "healthy",
        "agent_loop": "srv-tools",
        "active_rollouts": 0,
        "completed_rollouts": 0,
        "queued_rollouts": 0,
        "state": "memory",
        "state_reachable": True,
    }


async def test_keyless_server_accepts_inits_without_a_header(tmp_path: Path) -> None:
    """Without a server key, an init needs no Authorization header."""
    async with serving(agents.ToolAgent(), tmp_path, api_key=None) as s:
        response = await s.init(init_body(), key=None)
        await s.settle()

    assert response.status_code == 202
    assert len(s.completions("r-1")) == 1


# --------------------------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------------------------


async def test_concurrent_duplicate_inits_start_one_rollout(tmp_path: Path) -> None:
    """50 concurrent identical inits: one run, one callback, and the same 202 body for all."""
    agent = agents.Gated()
    async with serving(agent, tmp_path) as s:
        body = init_body()
        s.gate.expect("r-1", api_key=TG_KEY)
        responses: list[httpx2.Response] = []

        async def send() -> None:
            responses.append(await s.init(body))

        async with anyio.create_task_group() as tasks:
            for _ in range(50):
                tasks.start_soon(send)
        agent.release.set()
        await s.settle()

    assert [r.status_code for r in responses] == [202] * 50
    assert len({r.content for r in responses}) == 1
    assert agent.runs == ["r-1"]
    assert len(s.completions("r-1")) == 1


async def test_duplicate_after_completion_replays_the_answer_and_starts_nothing(
    tmp_path: Path,
) -> None:
    """A duplicate within the record TTL gets the first 202 body again; nothing reruns."""
    agent = agents.Gated()
    agent.release.set()
    async with serving(agent, tmp_path) as s:
        first = await s.init(init_body(idempotency_key="k-1"))
        await s.settle()
        again = await s.init(init_body(idempotency_key="k-1"))
        await s.settle()
        health = (await s.health()).json()

    assert (first.status_code, again.status_code) == (202, 202)
    assert again.content == first.content
    assert agent.runs == ["r-1"]
    assert len(s.completions("r-1")) == 1
    assert health["completed_rollouts"] == 1


async def test_conflicting_duplicates_get_409(tmp_path: Path) -> None:
    """Same idempotency_key for another rollout_id, or a running rollout_id under a new key: 409."""
    agent = agents.Gated()
    async with serving(agent, tmp_path) as s:
        first = await s.init(init_body("r-1", idempotency_key="k-1"))
        await agent.started.wait()
        other_id = await s.init(init_body("r-2", idempotency_key="k-1"))
        other_key = await s.init(init_body("r-1", idempotency_key="k-2"))
        agent.release.set()
        await s.settle()

    assert first.status_code == 202
    assert other_id.status_code == 409
    assert "idempotency_key" in other_id.json()["detail"]
    assert other_key.status_code == 409
    assert "already running" in other_key.json()["detail"]
    assert agent.runs == ["r-1"]
    assert "r-2" not in {c.json()["rollout_id"] for c in s.raw.calls_to(COMPLETED)}
    assert len(s.raw.calls_to(COMPLETED)) == 1


async def test_record_ttl_expiry_forgets_finished_rollouts(tmp_path: Path) -> None:
    """After ``record_ttl_s`` the periodic cleanup drops the record; the id may run again."""
    agent = agents.Gated()
    agent.release.set()
    async with serving(agent, tmp_path, record_ttl_s=0.1) as s:
        await s.init(init_body())
        await s.settle()
        assert "r-1" in s.server.registry.by_key
        with anyio.fail_after(3):
            while s.server.registry.by_key:  # noqa: ASYNC110 - the cleanup is periodic
                await anyio.sleep(0.02)
        s.gate.records.pop("r-1")
        again = await s.init(init_body())
        await s.settle()
        health = (await s.health()).json()

    assert again.status_code == 202
    assert agent.runs == ["r-1", "r-1"]
    assert health["completed_rollouts"] == 2


# --------------------------------------------------------------------------------------------
# get_tools failures and admission
# --------------------------------------------------------------------------------------------


async def test_get_tools_failure_is_500_and_starts_nothing(tmp_path: Path) -> None:
    """get_tools raising gives 500 with the reason; nothing runs; a retry after the fix works."""
    agent = agents.Gated()
    agent.broken = True
    agent.release.set()
    async with serving(agent, tmp_path) as s:
        failed = await s.init(init_body())
        health = (await s.health()).json()
        calls_after_failure = list(s.raw.calls)
        agent.broken = False
        retried = await s.init(init_body())
        await s.settle()

    assert failed.status_code == 500
    assert failed.json() == {
        "detail": "get_tools failed: ValueError: tool registry is not loaded",
    }
    assert health["active_rollouts"] == 0
    assert health["queued_rollouts"] == 0
    assert calls_after_failure == []
    assert retried.status_code == 202
    assert agent.runs == ["r-1"]
    assert len(s.completions("r-1")) == 1


class _OneListAgent(RolloutAgentLoop):
    """Rewrites one tools list in place for each rollout, from the init's metadata; each
    rollout reports the tools its context saw."""

    name = "one-list"

    def __init__(self) -> None:
        self.tools: list[dict[str, Any]] = []

    def get_tools(self, request: Any) -> list[dict[str, Any]]:
        self.tools[:] = [
            {"type": "function", "function": {"name": name}} for name in request.metadata["tools"]
        ]
        return self.tools

    async def run(self, ctx: Any) -> Any:
        seen = ",".join(tool.name for tool in ctx.tools)
        return ctx.complete([{"role": "assistant", "content": seen}])


async def test_each_init_lists_the_tools_get_tools_returned_for_it(tmp_path: Path) -> None:
    """Checked tool lists are cached, but never served stale: an agent that rewrites one list
    per rollout gets each rollout's own tools in its 202 and in its context."""
    plan = {"a": ["add"], "b": ["add", "mul"], "c": ["add"], "d": []}
    async with serving(_OneListAgent(), tmp_path) as s:
        answers = {
            rid: await s.init(init_body(rid, metadata={"tools": names}))
            for rid, names in plan.items()
        }
        await s.settle()

    for rid, names in plan.items():
        assert answers[rid].status_code == 202
        assert [t["function"]["name"] for t in answers[rid].json()["tools"]] == names
        [result] = s.completions(rid)
        assert result.final_messages[-1]["content"] == ",".join(names)


async def test_invalid_tools_are_500_and_start_nothing(tmp_path: Path) -> None:
    """get_tools returning an invalid tool name gives 500 naming the tool; no callback."""
    async with serving(agents.Broken(), tmp_path) as s:
        response = await s.init(init_body())

    assert response.status_code == 500
    assert "tools[0].function.name 'has spaces'" in response.json()["detail"]
    assert s.raw.calls == []


async def test_admission_control_refuses_beyond_the_queue(tmp_path: Path) -> None:
    """max_concurrent=1, max_queued=1: the third init gets 503 with Retry-After; health counts."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, max_concurrent=1, max_queued=1) as s:
        first = await s.init(init_body("a"))
        await agent.started.wait()
        second = await s.init(init_body("b"))
        third = await s.init(init_body("c"))
        busy = (await s.health()).json()
        agent.release.set()
        await s.settle()
        done = (await s.health()).json()

    assert [first.status_code, second.status_code, third.status_code] == [202, 202, 503]
    assert third.headers["retry-after"]
    assert "retry later" in third.json()["detail"]
    assert (busy["active_rollouts"], busy["queued_rollouts"], busy["completed_rollouts"]) == (
        1,
        1,
        0,
    )
    assert (done["active_rollouts"], done["queued_rollouts"], done["completed_rollouts"]) == (
        0,
        0,
        2,
    )
    assert agent.runs == ["a", "b"]
    assert "c" not in s.gate.records or s.completions("c") == []


async def test_admission_control_holds_under_a_burst(tmp_path: Path) -> None:
    """A burst of inits sent together is bounded by max_concurrent + max_queued."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, max_concurrent=2, max_queued=3) as s:
        statuses: list[int] = []

        async def send(i: int) -> None:
            statuses.append((await s.init(init_body(f"r-{i}"))).status_code)

        async with anyio.create_task_group() as tasks:
            for i in range(20):
                tasks.start_soon(send, i)
        agent.release.set()
        await s.settle()

    assert sorted(statuses) == [202] * 5 + [503] * 15
    assert len(agent.runs) == 5


# --------------------------------------------------------------------------------------------
# Debug traces
# --------------------------------------------------------------------------------------------


async def test_debug_dir_gets_one_jsonl_trace_per_rollout_without_secrets(tmp_path: Path) -> None:
    """With debug_dir, ``ctx.log_event`` lines land in ``<rollout_id>.jsonl``; no api_key."""
    debug = tmp_path / "traces"
    async with serving(agents.ToolAgent(), tmp_path, debug_dir=debug) as s:
        await s.init(init_body())
        await s.settle()

    assert [p.name for p in debug.iterdir()] == ["r-1.jsonl"]
    text = (debug / "r-1.jsonl").read_text(encoding="utf-8")
    events = [json.loads(line) for line in text.splitlines()]
    assert [e["event"] for e in events] == [
        "rollout_start",
        "turn",
        "tool_result",
        "turn",
        "rollout_end",
    ]
    assert all(e["rollout_id"] == "r-1" for e in events)
    assert events[2]["result"] == 7
    assert events[4]["status"] == "COMPLETED"
    assert TG_KEY not in text
    assert SERVER_KEY not in text


async def test_server_log_never_holds_the_api_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Failures that quote TrainGate's reply still keep the per-rollout api_key out of the log."""
    caplog.set_level(logging.DEBUG)
    async with serving(agents.ToolAgent(), tmp_path) as s:
        for _ in range(4):
            s.raw.fail_next(CHAT, 503)
        await s.init(init_body())
        await s.settle()

    [result] = s.completions("r-1")
    assert result.status == "ERROR"
    assert "HTTP 503" in (result.error_message or "")
    assert caplog.records
    assert TG_KEY not in caplog.text
