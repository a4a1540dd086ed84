"""The mock TrainGate as a polling controller (testing/wire/polling.py), driving ``osmosis
serve``'s app on 127.0.0.1 (``--server``) and in process. A sound server gives clean rows;
each polling finding is provoked on purpose by bending one rule of the real server's answers
with a small ASGI wrapper (:class:`Bend`), and never fires without it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from pydantic import SecretStr

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.protocol import PollingInit, PollingResult, Sample
from osmosis_rollout.server import create_app
from osmosis_rollout.testing import Harness, MockLLMBackend, MockTrainGate
from osmosis_rollout.testing.wire import POLLING, wire_named
from osmosis_rollout.testing.wire.polling import (
    PollingController,
    name_urls,
    polling_result,
    polling_route,
    start_body,
)

from .support import serve_in_thread

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]
SERVER_KEY = "server-key-pollmock-01"


class Sleepy(RolloutAgentLoop):
    """One chat turn after ``metadata.sleep`` seconds; reward 1.0."""

    name = "pollmock-sleepy"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        await anyio.sleep(float(ctx.request.metadata.get("sleep", 0)))
        messages = list(ctx.request.messages)
        reply = await ctx.chat(messages)
        messages.append(reply.message)
        return ctx.complete(messages, reward=1.0)


@dataclass
class Bend:
    """An ASGI wrapper bending one rule of the wrapped server's polling answers."""

    app: Any
    rule: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    answers: dict[str, int] = field(default_factory=dict)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = dict(scope["headers"])
        rid = path.removeprefix("/rollout/").removesuffix("/result")
        lease = headers.get(b"x-osmosis-rollout-lease", b"").decode()
        if self.rule == "wrong_lease" and path.endswith("/result") and rid in self.tokens:
            scope = dict(scope)  # any lease is taken for the right one
            scope["headers"] = [
                (k, v) for k, v in scope["headers"] if k != b"x-osmosis-rollout-lease"
            ] + [(b"x-osmosis-rollout-lease", self.tokens[rid].encode())]
        if self.rule in ("never_finishes", "cancel_forgets") and path == "/rollout":
            receive = await self.untimed(receive)
        status: dict[str, int] = {}
        chunks: list[bytes] = []

        async def capture(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, capture)
        code, body = status["code"], b"".join(chunks)
        code, body = self.bend(path, rid, lease, code, body)
        await send(
            {
                "type": "http.response.start",
                "status": code,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def untimed(receive: Any) -> Any:
        """A start body without its timeouts: the agent runs on past the mock's deadline."""
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        data = json.loads(raw)
        data.pop("agent_timeout_sec", None)
        data.pop("grader_timeout_sec", None)
        sent = False

        async def again() -> Any:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": json.dumps(data).encode()}

        return again

    def bend(self, path: str, rid: str, lease: str, code: int, body: bytes) -> tuple[int, bytes]:
        if path == "/rollout" and code == 202:
            data = json.loads(body)
            self.tokens[data["rollout_id"]] = data["polling_lease_token"]
            if self.rule == "short_lease":  # the server says 0.5 s and keeps its own 120 s
                data["polling_lease_timeout_sec"] = 0.5
            return code, json.dumps(data).encode()
        if path == "/rollout/cancel" and self.rule == "cancel_forgets":
            return 200, b'{"dispositions": {}}'
        if not path.endswith("/result") or code != 200:
            return code, body
        data = json.loads(body)
        seen = self.answers[rid] = self.answers.get(rid, 0) + 1
        in_flight = {**data, "status": "running", "sample": None, "err_message": None}
        if self.rule in ("never_finishes", "cancel_forgets"):
            return 200, json.dumps(in_flight).encode()
        if self.rule == "regress" and seen <= 2:
            return 200, json.dumps(
                {**in_flight, "status": ("grading", "queued")[seen - 1]}
            ).encode()
        finished = data["status"] in ("success", "failure", "cancelled")
        if finished and lease == self.tokens.get(rid):
            done = self.answers[rid + " done"] = self.answers.get(rid + " done", 0) + 1
            if done == 2 and self.rule == "reread_changes":
                data["sample"]["reward"] = 0.5
            if done == 2 and self.rule == "reread_lost":
                return 404, b'{"detail": "unknown rollout_id"}'
            if self.rule == "reward_on_failure":
                data.update(status="failure", err_message="x", err_category="agent_error")
        return 200, json.dumps(data).encode()


@contextlib.contextmanager
def server(rule: str = "", **settings: Any) -> Iterator[str]:
    values: dict[str, Any] = {"api_key": SecretStr(SERVER_KEY), "shutdown_grace_s": 0.0}
    values.update(settings)
    app = create_app(Sleepy(), settings=ServerSettings(**values))
    with serve_in_thread(Bend(app, rule) if rule else app, lifespan="on") as url:
        yield url


@contextlib.asynccontextmanager
async def harness(url: str, **options: Any) -> AsyncIterator[Harness]:
    async with Harness(
        server_url=url,
        server_key=SERVER_KEY,
        backend=MockLLMBackend(seed=1),
        protocol="polling",
        v2_slack_s=options.pop("slack_s", 5.0),
        **options,
    ) as h:
        yield h


async def run_one(url: str, *, sleep: float = 0.0, timeout_s: float = 10.0, **options: Any) -> Any:
    abandon = options.pop("abandon", False)
    async with harness(url, **options) as h:
        controller = h.gate.controller(POLLING)
        assert isinstance(controller, PollingController)
        controller.abandon = abandon
        return await h.run(
            MESSAGES,
            rollout_id="r-1.x",
            metadata={"ground_truth": "7", "sleep": sleep},
            timeout_s=timeout_s,
        )


def codes(outcome: Any) -> set[str]:
    return {f.code for f in outcome.findings}


async def test_a_sound_polling_server_gives_a_clean_row() -> None:
    """The start, the long polls, the second read and the wrong lease's 403: no finding, and
    the row reads as on the other wires (COMPLETED, the reward, the messages)."""
    with server(poll_wait_s=0.2) as url:
        outcome = await run_one(url, sleep=0.5)
    assert outcome.init_status == 202
    assert outcome.findings == []
    record = outcome.record
    result = record.result
    assert result is not None
    assert (result.status.value, result.reward) == ("COMPLETED", 1.0)
    assert result.final_messages[-1]["role"] == "assistant"
    exchange = record.exchange
    assert exchange.statuses[-1] == "success"
    assert "running" in exchange.statuses  # a poll answered while the agent slept
    assert exchange.result["status"] == "success"


@pytest.mark.parametrize(
    ("rule", "finding"),
    [
        ("wrong_lease", "wrong_lease_accepted"),
        ("reread_changes", "result_changed_after_finish"),
        ("reread_lost", "result_lost_after_finish"),
        ("regress", "status_regressed"),
        ("reward_on_failure", "reward_on_failure"),
    ],
)
async def test_each_broken_polling_rule_is_its_finding(rule: str, finding: str) -> None:
    with server(rule) as url:
        outcome = await run_one(url)
    assert finding in codes(outcome), outcome.findings
    assert codes(outcome) <= {finding}


async def test_past_the_deadline_the_rollout_is_cancelled() -> None:
    """A result that never comes: no_completion at the deadline, then a cancel; a sound
    cancel answer is no finding, one that forgets the rollout is cancel_wrong."""
    with server("never_finishes") as url:
        outcome = await run_one(url, sleep=5.0, timeout_s=0.2, slack_s=0.3)
    assert codes(outcome) == {"no_completion"}
    assert outcome.record.exchange.cancel[0] == 200
    assert outcome.record.exchange.cancel[1]["dispositions"]["r-1.x"] == "cancelled_running"
    with server("cancel_forgets") as url:
        outcome = await run_one(url, sleep=5.0, timeout_s=0.2, slack_s=0.3)
    assert codes(outcome) == {"no_completion", "cancel_wrong"}


async def test_a_lease_that_runs_out_must_end_the_rollout() -> None:
    """The controller stops polling for longer than its lease: a sound server ended the
    rollout (failure, lease_expired); one that only says a short lease is lease_ignored."""
    with server(poll_wait_s=0.3, poll_lease_s=0.6) as url:
        outcome = await run_one(url, sleep=3.0, abandon=True)
    assert outcome.findings == []
    assert outcome.record.exchange.result["err_category"] == "lease_expired"
    with server("short_lease", poll_wait_s=0.3) as url:
        outcome = await run_one(url, sleep=3.0, abandon=True)
    assert codes(outcome) == {"lease_ignored"}


async def test_a_dropped_poll_is_sent_again() -> None:
    """A poll that outlives the server's wait plus the grace is abandoned and sent again."""
    import osmosis_rollout.testing.wire.polling as polling

    with server(poll_wait_s=0.2) as url:
        saved = polling.POLL_GRACE_S
        polling.POLL_GRACE_S = -0.15  # each poll is given up 50 ms in
        try:
            outcome = await run_one(url, sleep=0.6)
        finally:
            polling.POLL_GRACE_S = saved
    assert outcome.findings == []
    assert outcome.record.exchange.reconnects >= 3
    assert outcome.record.result.reward == 1.0


async def test_in_process_the_calculator_runs_clean_on_polling() -> None:
    from osmosis_rollout.loader import load_agent

    agent = load_agent("examples/calculator/agent.py:CalculatorAgent")
    async with Harness(agent, backend=MockLLMBackend(seed=1), protocol="polling") as h:
        outcome = await h.run(MESSAGES, metadata={"ground_truth": "7"})
    assert outcome.findings == []
    assert outcome.record.result is not None
    assert outcome.record.result.status.value == "COMPLETED"
    assert len(outcome.record.chats) >= 2


async def test_a_server_without_the_polling_wire_is_one_clear_error() -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def health(request: Any) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = Starlette(routes=[Route("/health", health)])
    with (
        serve_in_thread(app) as url,
        pytest.raises(ConfigError, match="does not speak the polling wire"),
    ):
        async with Harness(server_url=url, protocol="polling"):
            pass


def test_the_start_body_is_polling_inits_and_the_result_reads_as_ours() -> None:
    request = RolloutRequest(
        rollout_id="a b",
        server_url="http://gate.test",
        messages=MESSAGES,
        completion_params={},
        metadata={"ground_truth": 7},
    )
    body = start_body(
        request, base_url="http://gate.test", llm_key="k", agent_timeout_s=5, grader_timeout_s=5
    )
    init = PollingInit.model_validate(body)  # strict: every field declared
    assert init.chat_completions_url == "http://gate.test/polling/a%20b"
    assert (init.label, init.grade, "controller_api_key" in body) == ("7", True, False)
    assert polling_route("/polling/a%20b/chat/completions") == "a b"
    assert polling_route("/polling/a/b/chat/completions") is None
    cancelled = polling_result("a", PollingResult(rollout_id="a", status="cancelled"))
    assert (cancelled.status.value, cancelled.finish_reason) == ("ERROR", "cancelled")
    failed = PollingResult(
        rollout_id="a", status="failure", err_message="boom", err_category="agent_error"
    )
    assert polling_result("a", failed).error_message == "agent_error: boom"
    ok = PollingResult(rollout_id="a", status="success", sample=Sample(reward=0.25))
    assert polling_result("a", ok).reward == 0.25
    gate = MockTrainGate()
    assert name_urls(f"{gate.base_url}/polling/x/chat/completions", gate.base_url) == (
        "the mock TrainGate's chat endpoint"
    )
    assert wire_named("POLLING") is POLLING
