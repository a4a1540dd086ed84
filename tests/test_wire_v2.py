"""Protocol v2 on ``osmosis serve``'s app, with real sockets on 127.0.0.1 on both sides.

The server (``create_app`` under uvicorn, in a thread) is driven the way spec section 11's
controller drives it, by ``tests/v2_gate.py``'s ``V2Gate``: every callback body, status and cancel
disposition is checked for success, agent error, timeout, cancel while queued and while
running, 429 under a full server, duplicate inits, and a grader callback that fails and is
replayed from the outbox without resending the completion.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from osmosis_rollout import RolloutContext, RolloutResult
from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.server import create_app
from osmosis_rollout.server.delivery import replay_outbox
from osmosis_rollout.server.state import LeasedRollout, open_state
from osmosis_rollout.server.wire import target_factory

from .gates import ADD_CALL, ANSWER
from .support import load_asset, serve_in_thread, wait_until
from .v2_gate import CONTROLLER_KEY, LLM_KEY, V2Gate, v2_init

pytestmark = pytest.mark.anyio

agents = load_asset("srv_agents")
SERVER_KEY = "server-key-v2-0001"
AUTH = {"Authorization": f"Bearer {SERVER_KEY}"}


class GradedAgent(agents.ToolAgent):  # type: ignore[name-defined,misc]
    """The tool agent with a grader: 1.0 when the answer holds the label (v2's ``label``)."""

    name = "v2-graded"

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> float:
        meta = ctx.request.metadata
        if meta.get("grade_sleep_s"):
            await anyio.sleep(float(meta["grade_sleep_s"]))
        if meta.get("grade_raises"):
            raise ValueError("the grader broke")
        answer = str(result.final_messages[-1].get("content") or "")
        return 1.0 if str(meta.get("ground_truth")) in answer else 0.0


@dataclass
class Setup:
    """A served app, its gate, and an HTTP client for both."""

    url: str
    gate: V2Gate
    http: httpx2.AsyncClient
    outbox: Path

    async def start(self, body: dict[str, Any], **headers: str) -> httpx2.Response:
        return await self.http.post(f"{self.url}/rollout", json=body, headers={**AUTH, **headers})

    async def status(self, rid: str) -> dict[str, Any]:
        response = await self.http.get(f"{self.url}/rollout/{rid}/status", headers=AUTH)
        assert response.status_code == 200
        return dict(response.json())

    async def cancel(self, selector: dict[str, Any]) -> httpx2.Response:
        return await self.http.post(f"{self.url}/rollout/cancel", json=selector, headers=AUTH)


@contextlib.contextmanager
def _gate(gate: V2Gate) -> Iterator[V2Gate]:
    with serve_in_thread(gate.app()) as url:
        gate.url = url
        yield gate


@contextlib.asynccontextmanager
async def v2_served(
    tmp_path: Path,
    agent: Any = None,
    *,
    replies: list[dict[str, Any]] | None = None,
    stream: bool = False,
    **options: Any,
) -> AsyncIterator[Setup]:
    """Serve ``agent`` (the graded tool agent) and a ``V2Gate`` on 127.0.0.1."""
    gate = V2Gate(replies=list(replies or [ADD_CALL, ANSWER]), stream=stream)
    options.setdefault("api_key", SERVER_KEY)
    options.setdefault("outbox_dir", tmp_path / "outbox")
    options.setdefault("shutdown_grace_s", 0.0)
    app = create_app(agent or GradedAgent(), **options)
    with _gate(gate), serve_in_thread(app, lifespan="on") as url:
        async with httpx2.AsyncClient(timeout=10) as http:
            yield Setup(url, gate, http, tmp_path / "outbox")


async def test_success_sends_tools_and_keys_right_and_ends_in_both_callbacks(
    tmp_path: Path,
) -> None:
    """A graded two-turn rollout: the chat calls carry the LLM key, the full history and the
    tools on every call (no rollout_id); the completion then the grader callback carry the
    controller key and spec 5's bodies; the status is the grade."""
    async with v2_served(tmp_path) as s:
        response = await s.start(v2_init(s.gate.url, "ok-1"))
        await wait_until(lambda: s.gate.ended("ok-1"), 10)
        status = await s.status("ok-1")

    assert response.status_code == 202
    assert response.json() == {"rollout_id": "ok-1"}
    chats = s.gate.chats["ok-1"]
    assert len(chats) == 2
    for call in chats:
        assert call.authorization == f"Bearer {LLM_KEY}"
        assert [t["function"]["name"] for t in call.body["tools"]] == ["add", "note"]
        assert "rollout_id" not in call.body
        assert call.body["model"] == "osmosis-rollout"
    assert len(chats[1].body["messages"]) == 3  # the full history: user, tool call, tool result
    [completion] = s.gate.completions["ok-1"]
    [grader] = s.gate.graders["ok-1"]
    assert completion.authorization == grader.authorization == f"Bearer {CONTROLLER_KEY}"
    assert completion.body == {
        "rollout_id": "ok-1",
        "extra_fields": None,
        "status": "success",
        "err_message": None,
        "err_category": None,
    }
    assert grader.body["status"] == "success"
    assert grader.body["err_message"] is None
    assert grader.body["err_category"] is None
    sample = grader.body["sample"]
    assert (sample["reward"], sample["label"], sample["remove_sample"]) == (1.0, "7", False)
    assert sample["messages"][-1] == {"role": "assistant", "content": "3 + 4 = 7"}
    assert sample["metrics"]["num_llm_calls"] == 2
    assert sample["extra_fields"]["finish_reason"] == "stop"
    assert status == {"rollout_id": "ok-1", "status": "success", "reward": 1.0, "err_message": None}


async def test_an_sse_reply_without_usage_is_read(tmp_path: Path) -> None:
    """A streaming-only chat endpoint (U2): the event stream is folded into one completion."""
    async with v2_served(tmp_path, stream=True) as s:
        await s.start(v2_init(s.gate.url, "sse-1"))
        await wait_until(lambda: s.gate.ended("sse-1"), 10)

    [grader] = s.gate.graders["sse-1"]
    assert grader.body["status"] == "success"
    assert grader.body["sample"]["messages"][1]["tool_calls"][0]["function"]["name"] == "add"


async def test_agent_error_is_a_failure_of_both_callbacks(tmp_path: Path) -> None:
    """The agent raised: completion failure (agent_error), grader failure with the partial
    conversation and no reward; the status is a failure with the message."""
    async with v2_served(tmp_path) as s:
        body = v2_init(s.gate.url, "err-1", metadata={"raise_after_tools": True})
        await s.start(body)
        await wait_until(lambda: s.gate.ended("err-1"), 10)
        status = await s.status("err-1")

    [completion] = s.gate.completions["err-1"]
    [grader] = s.gate.graders["err-1"]
    assert completion.body["status"] == "failure"
    assert completion.body["err_category"] == "agent_error"
    assert "the calculator broke" in completion.body["err_message"]
    assert grader.body["status"] == "failure"
    assert grader.body["err_category"] == "agent_error"
    assert grader.body["sample"]["reward"] is None
    assert status["status"] == "failure"
    assert status["reward"] is None
    assert "the calculator broke" in status["err_message"]


async def test_a_failed_chat_call_is_an_http_error(tmp_path: Path) -> None:
    """A chat call the controller refuses ends the rollout with err_category http_error."""
    async with v2_served(tmp_path) as s:
        s.gate.fail_next("chat", 400)
        await s.start(v2_init(s.gate.url, "http-1"))
        await wait_until(lambda: s.gate.ended("http-1"), 10)

    assert s.gate.completions["http-1"][0].body["err_category"] == "http_error"
    assert s.gate.graders["http-1"][0].body["err_category"] == "http_error"


async def test_agent_timeout_and_grade_failures(tmp_path: Path) -> None:
    """agent_timeout_sec ends the agent phase (timeout); a grader that raises is a grader
    failure after a completion success (validation_error); one past grader_timeout_sec a
    timeout."""
    async with v2_served(tmp_path) as s:
        await s.start(v2_init(s.gate.url, "slow", agent_timeout_sec=0.3, metadata={"sleep_s": 5}))
        await s.start(v2_init(s.gate.url, "raises", metadata={"grade_raises": True}))
        await s.start(
            v2_init(s.gate.url, "slowgrade", grader_timeout_sec=0.2, metadata={"grade_sleep_s": 5})
        )
        for rid in ("slow", "raises", "slowgrade"):
            await wait_until(lambda rid=rid: s.gate.ended(rid), 10)

    slow = s.gate.completions["slow"][0].body
    assert (slow["status"], slow["err_category"]) == ("failure", "timeout")
    assert "agent_timeout_sec of 0.3 s" in slow["err_message"]
    assert s.gate.graders["slow"][0].body["err_category"] == "timeout"
    assert s.gate.completions["raises"][0].body["status"] == "success"
    raised = s.gate.graders["raises"][0].body
    assert (raised["status"], raised["err_category"]) == ("failure", "validation_error")
    assert raised["sample"]["reward"] is None
    assert "the grader broke" in raised["err_message"]
    timed = s.gate.graders["slowgrade"][0].body
    assert (timed["status"], timed["err_category"]) == ("failure", "timeout")


async def test_cancel_while_queued_and_while_running(tmp_path: Path) -> None:
    """One slot: the running rollout and the queued one are cancelled by id; each still ends in
    one completion (cancelled) and one grader callback (failure); a second cancel is not_found."""
    async with v2_served(tmp_path, max_concurrent=1) as s:
        await s.start(v2_init(s.gate.url, "run-1", metadata={"sleep_s": 30}))
        await s.start(v2_init(s.gate.url, "queued-1"))
        await anyio.sleep(0.2)
        before = [await s.status("run-1"), await s.status("queued-1")]
        first = await s.cancel({"ids": ["run-1", "queued-1", "nobody"]})
        for rid in ("run-1", "queued-1"):
            await wait_until(lambda rid=rid: s.gate.ended(rid), 10)
        again = await s.cancel({"ids": ["run-1"]})
        after = await s.status("queued-1")

    assert [b["status"] for b in before] == ["running", "queued"]
    assert first.json() == {
        "dispositions": {
            "run-1": "cancelled_running",
            "queued-1": "cancelled_queued",
            "nobody": "not_found",
        }
    }
    assert again.json() == {"dispositions": {"run-1": "not_found"}}
    for rid in ("run-1", "queued-1"):
        [completion] = s.gate.completions[rid]
        [grader] = s.gate.graders[rid]
        assert completion.body["status"] == "cancelled"
        assert grader.body["status"] == "failure"
        assert grader.body["sample"]["reward"] is None
    assert "queued-1" not in s.gate.chats  # it never ran
    assert after["status"] == "cancelled"


async def test_cancel_selectors(tmp_path: Path) -> None:
    """Exactly one selector, else a 422; prefix and all list only in-flight matches."""
    async with v2_served(tmp_path, max_concurrent=4) as s:
        for rid in ("p-a", "p-b", "q-a"):
            await s.start(v2_init(s.gate.url, rid, metadata={"sleep_s": 30}))
        none = await s.cancel({"all": False})
        two = await s.cancel({"ids": [], "all": True})
        by_prefix = await s.cancel({"prefix": "p-"})
        rest = await s.cancel({"all": True})
        empty = await s.cancel({"ids": []})
        for rid in ("p-a", "p-b", "q-a"):
            await wait_until(lambda rid=rid: s.gate.ended(rid), 10)

    assert none.status_code == two.status_code == 422
    assert none.json() == {"detail": "pass exactly one selector: ids, prefix, or all"}
    assert by_prefix.json() == {
        "dispositions": {"p-a": "cancelled_running", "p-b": "cancelled_running"}
    }
    assert rest.json() == {"dispositions": {"q-a": "cancelled_running"}}
    assert empty.json() == {"dispositions": {}}


async def test_a_full_server_answers_429_with_retry_after(tmp_path: Path) -> None:
    """No free slot and no queue room: 429 with Retry-After, and nothing started."""
    async with v2_served(tmp_path, max_concurrent=1, max_queued=0) as s:
        await s.start(v2_init(s.gate.url, "busy-1", metadata={"sleep_s": 30}))
        refused = await s.start(v2_init(s.gate.url, "busy-2"))
        status = await s.status("busy-2")
        await s.cancel({"all": True})
        await wait_until(lambda: s.gate.ended("busy-1"), 10)

    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "5"
    assert status["status"] == "unknown"
    assert "busy-2" not in s.gate.chats


async def test_a_repeated_id_starts_nothing_and_another_body_is_409(tmp_path: Path) -> None:
    """The same body again: 202 again, one run; another body under the same id: 409, and the
    answer names neither key."""
    async with v2_served(tmp_path) as s:
        body = v2_init(s.gate.url, "dup-1")
        first = await s.start(body)
        again = await s.start(body)
        changed = await s.start({**body, "label": "8"})
        await wait_until(lambda: s.gate.ended("dup-1"), 10)
        after = await s.start(body)  # finished: still the same 202, still no second run

    assert [first.status_code, again.status_code, after.status_code] == [202, 202, 202]
    assert first.content == again.content == after.content
    assert changed.status_code == 409
    assert "rollout_id" in changed.json()["detail"]
    assert LLM_KEY not in changed.text
    assert CONTROLLER_KEY not in changed.text
    assert len(s.gate.completions["dup-1"]) == len(s.gate.graders["dup-1"]) == 1
    assert len(s.gate.chats["dup-1"]) == 2


async def test_a_missing_rollout_id_is_invented_returned_and_kept_off_callback_bodies(
    tmp_path: Path,
) -> None:
    """D5: the 202 names the invented id (status answers it); the callbacks carry
    ``rollout_id: null`` so they match a URL that cannot name it."""
    async with v2_served(tmp_path) as s:
        response = await s.start(v2_init(s.gate.url, None))
        rid = response.json()["rollout_id"]
        await wait_until(lambda: s.gate.ended("unnamed"), 10)
        status = await s.status(rid)

    assert response.status_code == 202
    assert len(rid) == 32
    assert s.gate.completions["unnamed"][0].body["rollout_id"] is None
    assert s.gate.graders["unnamed"][0].body["rollout_id"] is None
    assert status["status"] == "success"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"agent_timeout_sec": math.nan}, "agent_timeout_sec"),
        ({"grader_timeout_sec": math.inf}, "grader_timeout_sec"),
        ({"completion_callback_url": "ftp://x/y"}, "completion_callback_url"),
        ({"chat_completions_url": "not a url"}, "chat_completions_url"),
        ({"llm_api_key": ""}, "llm_api_key"),
        ({"rollout_id": "a/b"}, "rollout_id"),
        ({"initial_messages": None}, "initial_messages"),
    ],
)
async def test_bad_bodies_are_bounded_422s_that_echo_nothing(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    """D2, D3, D4: each bad field a 422 naming it, with no secret or input value in it."""
    async with v2_served(tmp_path) as s:
        body = {**v2_init(s.gate.url, "bad-1"), **change}
        response = await s.http.post(
            f"{s.url}/rollout",
            content=json.dumps(body, allow_nan=True),
            headers={**AUTH, "Content-Type": "application/json"},
        )

    assert response.status_code == 422
    assert field in json.dumps(response.json()["detail"])
    assert LLM_KEY not in response.text
    assert CONTROLLER_KEY not in response.text
    assert len(response.content) < 4096


async def test_the_v2_routes_need_the_server_key(tmp_path: Path) -> None:
    """D1: start, status and cancel are behind the server key, as v1's init is."""
    async with v2_served(tmp_path) as s:
        start = await s.http.post(f"{s.url}/rollout", json=v2_init(s.gate.url, "k-1"))
        status = await s.http.get(f"{s.url}/rollout/k-1/status")
        cancel = await s.http.post(f"{s.url}/rollout/cancel", json={"all": True})
        health = await s.http.get(f"{s.url}/health")

    assert [start.status_code, status.status_code, cancel.status_code] == [401, 401, 401]
    assert health.status_code == 200
    assert health.json()["concurrency"] == {"max_concurrent": 100, "queued": 0, "running": 0}
    assert health.json()["instance_id"]


async def test_a_failed_grader_callback_is_replayed_alone(tmp_path: Path) -> None:
    """The completion is taken, the grader callback refused: the outbox entry holds only the
    grader part, and ``replay_outbox`` delivers it without resending the completion."""
    async with v2_served(tmp_path) as s:
        s.gate.fail_next("grader", 400)
        await s.start(v2_init(s.gate.url, "gr-1"))
        await wait_until(lambda: bool(list(s.outbox.glob("*.json"))), 10)
        state = open_state("memory", outbox_dir=s.outbox)
        [entry] = await state.outbox_list()
        async with TrainGateClient(retry=RetryPolicy(retries=0)) as client:
            outcomes = await replay_outbox(
                state, client, target_of=target_factory(), api_key=CONTROLLER_KEY
            )

    assert (entry.protocol, entry.route and entry.route["pending"]) == ("v2", ["grader"])
    assert CONTROLLER_KEY not in json.dumps(entry.route) + json.dumps(entry.response)
    assert [o.delivered for o in outcomes] == [True]
    assert len(s.gate.completions["gr-1"]) == 1
    [grader] = s.gate.graders["gr-1"]
    assert grader.body["status"] == "success"
    assert grader.body["sample"]["reward"] == 1.0
    assert grader.authorization == f"Bearer {CONTROLLER_KEY}"
    assert list(s.outbox.glob("*.json")) == []


async def test_shutdown_ends_running_rollouts_in_both_callbacks_or_the_outbox(
    tmp_path: Path,
) -> None:
    """At shutdown a running v2 rollout is cancelled and still sends its completion
    (cancelled) and grader (failure) callbacks; one whose completion the controller refuses
    leaves an outbox entry holding both parts, with their bodies and no key."""
    async with v2_served(tmp_path) as s:
        s.gate.fail_next("completion", 400)
        await s.start(v2_init(s.gate.url, "down-1", metadata={"sleep_s": 30}))
        await s.start(v2_init(s.gate.url, "down-2", metadata={"sleep_s": 30}))
        await anyio.sleep(0.3)
    state = open_state("memory", outbox_dir=s.outbox)
    [entry] = await state.outbox_list()

    ended = {rid for rid in ("down-1", "down-2") if s.gate.completions.get(rid)}
    [kept] = {"down-1", "down-2"} - ended
    [done] = ended
    assert s.gate.completions[done][0].body["status"] == "cancelled"
    assert s.gate.graders[done][0].body["status"] == "failure"
    assert kept not in s.gate.graders  # the grader callback waits behind the completion
    assert entry.rollout_id == kept
    assert entry.protocol == "v2"
    assert entry.route is not None
    assert entry.route["pending"] == ["completion", "grader"]
    assert entry.route["bodies"]["completion"]["status"] == "cancelled"
    assert CONTROLLER_KEY not in await anyio.Path(entry.location).read_text()


async def test_the_agent_never_holds_the_controller_key(tmp_path: Path) -> None:
    """D15: nothing the agent is handed (its request, in any dump, its private attributes, its
    chat channel) holds the callback credential."""
    seen: list[str] = []

    class Snooper(agents.ToolAgent):  # type: ignore[name-defined,misc]
        name = "v2-snooper"

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            request = ctx.request
            seen.append(
                repr(request)
                + repr(vars(request))
                + repr(request.__pydantic_private__)
                + request.model_dump_json()
                + repr(vars(ctx.llm))
            )
            return ctx.complete([*request.messages, {"role": "assistant", "content": "7"}])

    async with v2_served(tmp_path, Snooper()) as s:
        await s.start(v2_init(s.gate.url, "snoop"))
        await wait_until(lambda: s.gate.ended("snoop"), 10)

    [text] = seen
    assert CONTROLLER_KEY not in text
    assert s.gate.graders["snoop"][0].authorization == f"Bearer {CONTROLLER_KEY}"


async def test_with_a_shared_state_the_lease_follows_the_delivery(
    tmp_path: Path, redis_url: str
) -> None:
    """With Redis, the lease holds the settled callbacks before any is sent, and only the
    grader callback once the completion was taken: what a peer would send if this replica died
    (tests/test_replicas.py has that side)."""
    async with v2_served(tmp_path, state=redis_url) as s:
        s.gate.fail_next("grader", 503, times=2)  # retried: the lease is read meanwhile
        await s.start(v2_init(s.gate.url, "lease-1"))
        await wait_until(lambda: bool(s.gate.completions.get("lease-1")), 10)
        await anyio.sleep(0.2)
        state = open_state(redis_url, outbox_dir=tmp_path / "unused")
        try:
            raw = await state._redis.get("osmosis:lease:lease-1")  # type: ignore[attr-defined]
        finally:
            await state.close()
        await wait_until(lambda: s.gate.ended("lease-1"), 20)

    lease = LeasedRollout.from_json(raw)
    assert lease.protocol == "v2"
    assert lease.route is not None
    assert lease.route["pending"] == ["grader"]
    assert lease.route["bodies"]["grader"] == s.gate.graders["lease-1"][0].body
    assert len(s.gate.completions["lease-1"]) == 1


async def test_traces_of_v2_rollouts_do_not_repeat_the_tools_each_turn(tmp_path: Path) -> None:
    """The tools go with every v2 chat call, but a debug trace records them once (its start
    event), not in each turn's parameters."""
    async with v2_served(tmp_path, debug_dir=tmp_path / "traces") as s:
        await s.start(v2_init(s.gate.url, "tr-1"))
        await wait_until(lambda: s.gate.ended("tr-1"), 10)

    [trace] = list((tmp_path / "traces").glob("*.jsonl"))
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    turns = [e for e in events if e["event"] == "turn"]
    assert len(turns) == 2
    assert all("tools" not in turn["params"] for turn in turns)
    assert "tools" in s.gate.chats["tr-1"][0].body


@pytest.mark.parametrize(
    "field", ["chat_completions_url", "completion_callback_url", "grader_callback_url"]
)
async def test_every_url_a_v2_init_names_passes_the_destination_policy(
    tmp_path: Path, field: str
) -> None:
    """Issue 27's SSRF defence on the v2 wire: a cloud-metadata address in any of the three URLs
    is a 422 naming the field, and nothing is called (v1 checks its one server_url alike)."""
    async with v2_served(tmp_path) as s:
        body = {**v2_init(s.gate.url, "ssrf-1"), field: "http://169.254.169.254/latest"}
        response = await s.start(body)
        status = await s.status("ssrf-1")

    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", field]
    assert status["status"] == "unknown"


async def test_v2_sends_content_null_beside_tool_calls_as_the_official_sdk_does() -> None:
    """On v2 too the agent's messages go out as it kept them, ``"content": null`` beside tool
    calls included: the official SDK's agents post their history through their own OpenAI
    client (dicts as given), and its ``RolloutSample.messages`` are plain mappings dumped with
    ``model_dump(mode="json")``, nulls kept (osmosis-ai 0.3.8, ``rollout/types/sample.py``)."""
    from osmosis_rollout.testing import Harness, MockTrainGate, ScriptedBackend

    from .support import recording_bodies

    args = '{"a": 3, "b": 4}'
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": args}}
    gate = MockTrainGate(ScriptedBackend([{"tool_calls": [call]}, {"content": "7"}]))
    bodies: list[tuple[str, bytes]] = []
    gate.app = recording_bodies(gate.app, bodies)
    agent = load_asset("tool_agent").ToolAgent()
    async with Harness(agent, gate=gate, protocol="v2") as harness:
        outcome = await harness.run([{"role": "user", "content": "3 + 4?"}], rollout_id="null-2")
    assert outcome.findings == []
    turn = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert b'"content":null,"tool_calls"' in bodies[1][1]
    chats = [json.loads(raw) for path, raw in bodies if path.endswith("/chat/completions")]
    assert chats[1]["messages"][1] == turn
    [grader] = [json.loads(raw) for path, raw in bodies if path.endswith("/grader")]
    assert grader["sample"]["messages"][1] == turn
