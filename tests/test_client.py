"""TrainGateClient: retries, backoff, Retry-After, auth, request ids and secret hygiene.

Faults are injected with ``httpx2.MockTransport``; the client's ``sleep`` records each delay
instead of waiting, so exact backoff values are checked in microseconds.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from osmosis_rollout.agent import RolloutContext
from osmosis_rollout.client import (
    RetryPolicy,
    TrainGateClient,
    default_http_client,
)
from osmosis_rollout.errors import (
    ProtocolError,
    TrainGateError,
    TrainGateHTTPError,
    TrainGateTimeout,
    TrainGateUnavailable,
)
from osmosis_rollout.protocol import (
    CompletionsRequest,
    CompletionsResponse,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
)
from osmosis_rollout.transport import Http1Transport, Httpx2Transport, parse_retry_after
from tests.torture import HostileGate, gzip_bomb

pytestmark = pytest.mark.anyio

BASE = "http://traingate.test"
SECRET = "tg-secret-0123456789"
COMPLETION: dict[str, Any] = {
    "id": "c1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}

#: One scripted answer: a status code, a response factory, or an exception to raise.
Step = int | Callable[[httpx2.Request], httpx2.Response] | Exception


class Script:
    """A MockTransport handler that answers from a list of steps and records every request.

    An ``int`` step answers that status (``COMPLETION`` for 2xx, an error body otherwise); the
    last step repeats once the list runs out.
    """

    def __init__(self, *steps: Step) -> None:
        self.steps = steps
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        step = self.steps[min(len(self.requests), len(self.steps)) - 1]
        if isinstance(step, Exception):
            raise step
        if isinstance(step, int):
            if 200 <= step < 300:
                return httpx2.Response(step, json=COMPLETION)
            return httpx2.Response(step, json={"detail": f"scripted {step}"})
        return step(request)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies sent, in order."""
        return [json.loads(r.content) for r in self.requests]

    def header(self, name: str) -> list[str | None]:
        """One header's value on every request (None where absent)."""
        return [r.headers.get(name) for r in self.requests]


class Harness:
    """Builds clients on scripted transports and records the delays they would sleep."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._http: list[httpx2.AsyncClient] = []

    async def _sleep(self, seconds: float) -> None:
        self.delays.append(seconds)

    def client(
        self,
        script: Script,
        *,
        retry: RetryPolicy | None = None,
        rand: Callable[[], float] = lambda: 0.5,
    ) -> TrainGateClient:
        """A client with the protocol's default policy unless ``retry`` is given."""
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(script))
        self._http.append(http)
        return TrainGateClient(http, retry=retry, sleep=self._sleep, rand=rand)

    async def aclose(self) -> None:
        for http in self._http:
            await http.aclose()


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    """A Harness whose HTTP clients are closed after the test."""
    h = Harness()
    try:
        yield h
    finally:
        await h.aclose()


def chat_body(**fields: Any) -> CompletionsRequest:
    """A one-message chat request for rollout r-1."""
    return CompletionsRequest(
        rollout_id="r-1", messages=[{"role": "user", "content": "hi"}], **fields
    )


async def chat(
    client: TrainGateClient, *, api_key: str | None = SECRET, request_id: str = "r-1:1"
) -> CompletionsResponse:
    """One chat turn through ``client``."""
    return await client.chat_completions(BASE, chat_body(), api_key=api_key, request_id=request_id)


def result_body() -> RolloutResponse:
    """A minimal completion callback body."""
    return RolloutResponse(rollout_id="r-1", status=RolloutStatus.COMPLETED, reward=1.0)


# -- what is retried, and how often -------------------------------------------------------------


async def test_server_error_then_success_is_retried(harness: Harness) -> None:
    """A 500 followed by a 200 returns the 200's completion after one backoff."""
    script = Script(500, 200)
    reply = await chat(harness.client(script))
    assert reply.message.content == "hi"
    assert len(script.requests) == 2
    assert harness.delays == [0.75]  # ceiling 1 s, rand 0.5 -> 0.5 + 0.25


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_gateway_errors_are_retried(harness: Harness, status: int) -> None:
    """502, 503 and 504 are transient: the next attempt's success is returned."""
    script = Script(status, 200)
    await chat(harness.client(script))
    assert len(script.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
async def test_client_errors_fail_at_once(harness: Harness, status: int) -> None:
    """Other 4xx are not retried: one attempt, then TrainGateHTTPError with the status."""
    script = Script(status, 200)
    client = harness.client(script)
    with pytest.raises(TrainGateHTTPError) as exc:
        await chat(client)
    assert exc.value.status_code == status
    assert exc.value.url == f"{BASE}/v1/chat/completions"
    assert f"HTTP {status}" in str(exc.value)
    assert f"scripted {status}" in exc.value.body
    assert len(script.requests) == 1
    assert harness.delays == []
    assert client.stats.failures == 1


async def test_three_retries_then_the_error(harness: Harness) -> None:
    """A server that keeps failing gets 4 attempts (1 + 3 retries), then TrainGateHTTPError."""
    script = Script(500)
    client = harness.client(script)
    with pytest.raises(TrainGateHTTPError) as exc:
        await chat(client)
    assert exc.value.status_code == 500
    assert "after 4 attempts" in str(exc.value)
    assert len(script.requests) == 4
    assert len(harness.delays) == 3
    assert (client.stats.requests, client.stats.retries, client.stats.failures) == (4, 3, 1)
    assert client.stats.by_status == {500: 4}


async def test_retry_count_follows_the_policy(harness: Harness) -> None:
    """``RetryPolicy(retries=0)`` makes exactly one attempt."""
    script = Script(503)
    with pytest.raises(TrainGateHTTPError):
        await chat(harness.client(script, retry=RetryPolicy(retries=0)))
    assert len(script.requests) == 1
    assert harness.delays == []


@pytest.mark.parametrize(
    "fault",
    [
        httpx2.ConnectError("connection refused"),
        httpx2.ReadTimeout("timed out"),
        httpx2.ConnectTimeout("connect timed out"),
        httpx2.RemoteProtocolError("server disconnected"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_transport_errors_and_timeouts_are_retried(
    harness: Harness, fault: Exception
) -> None:
    """Transport errors and timeouts are retried; a later success is returned."""
    script = Script(fault, fault, 200)
    reply = await chat(harness.client(script))
    assert reply.usage.total_tokens == 4
    assert len(script.requests) == 3
    assert len(harness.delays) == 2


@pytest.mark.parametrize(
    "fault",
    [httpx2.ConnectError("connection refused"), httpx2.ReadTimeout("timed out")],
    ids=lambda e: type(e).__name__,
)
async def test_transport_errors_on_every_attempt_raise_unavailable(
    harness: Harness, fault: Exception
) -> None:
    """After 4 failed attempts the caller gets TrainGateUnavailable naming the error."""
    script = Script(fault)
    with pytest.raises(TrainGateUnavailable) as exc:
        await chat(harness.client(script))
    assert len(script.requests) == 4
    assert "after 4 attempt(s)" in str(exc.value)
    assert type(fault).__name__ in str(exc.value)
    assert exc.value.__cause__ is None


# -- backoff and Retry-After ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("rand", "expected"),
    [(0.0, [0.5, 1.0, 2.0]), (0.5, [0.75, 1.5, 3.0]), (1.0, [1.0, 2.0, 4.0])],
)
async def test_backoff_grows_exponentially_with_equal_jitter(
    harness: Harness, rand: float, expected: list[float]
) -> None:
    """Delays double each retry and sit in [ceiling/2, ceiling] (1 s base)."""
    with pytest.raises(TrainGateHTTPError):
        await chat(harness.client(Script(500), rand=lambda: rand))
    assert harness.delays == expected


async def test_backoff_is_capped_at_thirty_seconds(harness: Harness) -> None:
    """With many retries the ceiling stops at 30 s (and the floor at 15 s)."""
    policy = RetryPolicy(retries=8)
    with pytest.raises(TrainGateHTTPError):
        await chat(harness.client(Script(500), retry=policy, rand=lambda: 1.0))
    assert harness.delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    harness.delays.clear()
    with pytest.raises(TrainGateHTTPError):
        await chat(harness.client(Script(500), retry=policy, rand=lambda: 0.0))
    assert harness.delays == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]


@given(retry=st.integers(min_value=0, max_value=64), rand=st.floats(min_value=0, max_value=1))
def test_backoff_stays_within_half_and_full_ceiling(retry: int, rand: float) -> None:
    """For any retry number and jitter, the delay is within [ceiling/2, ceiling], ceiling <= 30."""
    policy = RetryPolicy()
    ceiling = min(30.0, 2.0**retry)
    delay = policy.backoff(retry, rand)
    assert ceiling / 2 <= delay <= ceiling <= 30.0


def retry_after(value: str, status: int = 429) -> Callable[[httpx2.Request], httpx2.Response]:
    """A step answering ``status`` with a Retry-After header."""
    return lambda request: httpx2.Response(status, headers={"Retry-After": value})


async def test_429_with_retry_after_waits_exactly_that_long(harness: Harness) -> None:
    """``Retry-After: 2`` replaces the computed backoff with exactly 2 s."""
    script = Script(retry_after("2"), 200)
    await chat(harness.client(script))
    assert harness.delays == [2.0]
    assert len(script.requests) == 2


async def test_retry_after_on_503_is_honoured(harness: Harness) -> None:
    """Retry-After is honoured on a retryable 5xx too."""
    await chat(harness.client(Script(retry_after("7", 503), 200)))
    assert harness.delays == [7.0]


async def test_retry_after_http_date_is_honoured(harness: Harness) -> None:
    """An HTTP-date Retry-After waits until that moment (second resolution)."""
    when = email.utils.formatdate(time.time() + 20, usegmt=True)
    await chat(harness.client(Script(retry_after(when), 200)))
    assert len(harness.delays) == 1
    assert 18.0 < harness.delays[0] <= 20.0


@pytest.mark.parametrize(
    ("value", "cap", "expected"),
    [("100000", 300.0, 300.0), ("45", 10.0, 10.0), ("inf", 300.0, 300.0)],
)
async def test_retry_after_is_capped(
    harness: Harness, value: str, cap: float, expected: float
) -> None:
    """A huge Retry-After waits at most ``retry_after_cap_s`` so it cannot park a rollout."""
    policy = RetryPolicy(retry_after_cap_s=cap)
    await chat(harness.client(Script(retry_after(value), 200), retry=policy))
    assert harness.delays == [expected]


async def test_unparseable_retry_after_falls_back_to_backoff(harness: Harness) -> None:
    """A garbage Retry-After is ignored and the normal backoff is used."""
    await chat(harness.client(Script(retry_after("soon"), 200), rand=lambda: 0.0))
    assert harness.delays == [0.5]


def test_parse_retry_after_forms() -> None:
    """Delta-seconds, HTTP-dates (future and past) and garbage parse as documented."""
    now = 1_445_412_480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:05 GMT", now=now) == 5.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now=now) == 0.0
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("tomorrow-ish") is None


# -- headers and bodies -----------------------------------------------------------------------


async def test_bearer_header_is_sent_when_there_is_an_api_key(harness: Harness) -> None:
    """Every attempt carries ``Authorization: Bearer <api_key>``."""
    script = Script(500, 200)
    await chat(harness.client(script), api_key=SECRET)
    assert script.header("authorization") == [f"Bearer {SECRET}"] * 2


@pytest.mark.parametrize("api_key", [None, ""])
async def test_no_authorization_header_without_an_api_key(
    harness: Harness, api_key: str | None
) -> None:
    """Without an api_key no Authorization header is sent at all."""
    script = Script(200)
    await chat(harness.client(script), api_key=api_key)
    assert script.header("authorization") == [None]


async def test_request_id_is_identical_across_attempts(harness: Harness) -> None:
    """All attempts of one turn carry the same ``X-Request-Id`` so TrainGate can dedupe."""
    script = Script(503, httpx2.ConnectError("refused"), 429, 200)
    await chat(harness.client(script), request_id="r-1:3")
    assert script.header("x-request-id") == ["r-1:3"] * 4
    assert len({r.content for r in script.requests}) == 1


async def test_context_numbers_turns_in_request_ids(harness: Harness) -> None:
    """Through a RolloutContext, turn n of rollout r is ``r:n``, retries included."""
    script = Script(200, 500, 200)
    client = harness.client(script)
    request = RolloutRequest(rollout_id="abc", server_url=BASE, messages=[], completion_params={})
    ctx = RolloutContext(request, [], client.channel(request))
    first = await ctx.chat([{"role": "user", "content": "q"}])
    await ctx.chat([{"role": "user", "content": "q"}, first.message])
    assert script.header("x-request-id") == ["abc:1", "abc:2", "abc:2"]


async def test_chat_body_drops_nulls_and_never_carries_tools(harness: Harness) -> None:
    """The wire body has no nulls and no ``tools``; ``stop`` is a list and logprobs is true."""
    script = Script(200)
    client = harness.client(script)
    request = RolloutRequest(
        rollout_id="r-1",
        server_url=BASE,
        messages=[],
        completion_params={
            "temperature": 0.2,
            "top_p": None,
            "max_tokens": None,
            "stop": "</s>",
            "seed": None,
            "tools": [{"type": "function", "function": {"name": "add"}}],
            "tool_choice": "auto",
        },
        api_key=SECRET,
    )
    ctx = RolloutContext(request, [], client.channel(request))
    await ctx.chat([{"role": "user", "content": "hi"}])
    (body,) = script.bodies
    assert body == {
        "model": "default",
        "rollout_id": "r-1",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "stop": ["</s>"],
        "logprobs": True,
    }
    assert script.requests[0].headers["content-type"] == "application/json"
    assert script.requests[0].url == f"{BASE}/v1/chat/completions"


async def test_message_nulls_inside_the_history_are_kept(harness: Harness) -> None:
    """Only top-level nulls are dropped: an assistant ``content: null`` is sent as is."""
    script = Script(200)
    history: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": []}]
    await harness.client(script).chat_completions(
        BASE,
        CompletionsRequest(rollout_id="r-1", messages=history),
        api_key=None,
        request_id="r-1:1",
    )
    assert script.bodies[0]["messages"] == history


# -- the completion callback --------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 202, 204])
async def test_completion_callback_accepts_any_2xx(harness: Harness, status: int) -> None:
    """Any 2xx acknowledges the callback, even with an empty body; nothing is retried."""
    script = Script(lambda request: httpx2.Response(status))
    client = harness.client(script)
    await client.complete_rollout(BASE, result_body(), api_key=SECRET)
    assert len(script.requests) == 1
    request = script.requests[0]
    assert request.url == f"{BASE}/v1/rollout/completed"
    assert request.headers["x-request-id"] == "r-1:completed"
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert script.bodies[0] == {
        "rollout_id": "r-1",
        "status": "COMPLETED",
        "final_messages": [],
        "reward": 1.0,
        "extra_fields": {},
    }


async def test_completion_callback_is_retried_on_5xx(harness: Harness) -> None:
    """The callback follows the same retry rules as a chat turn."""
    script = Script(502, 429, 204)
    await harness.client(script).complete_rollout(BASE, result_body(), api_key=None)
    assert len(script.requests) == 3


async def test_completion_callback_4xx_is_not_retried(harness: Harness) -> None:
    """A 409 on the callback stops at once with TrainGateHTTPError."""
    script = Script(409)
    with pytest.raises(TrainGateHTTPError) as exc:
        await harness.client(script).complete_rollout(BASE, result_body(), api_key=None)
    assert exc.value.status_code == 409
    assert len(script.requests) == 1


# -- malformed replies -----------------------------------------------------------------------


def raw(content: bytes | str, status: int = 200) -> Callable[[httpx2.Request], httpx2.Response]:
    """A step answering ``content`` verbatim."""
    return lambda request: httpx2.Response(status, content=content)


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"",
        b"[]",
        b'{"choices": []',
        json.dumps({"usage": COMPLETION["usage"]}),
        json.dumps({**COMPLETION, "choices": []}),
        json.dumps({**COMPLETION, "choices": [{"index": 0}]}),
        json.dumps({**COMPLETION, "usage": None}),
    ],
    ids=[
        "not-json",
        "empty",
        "array",
        "truncated",
        "no-choices",
        "empty-choices",
        "no-message",
        "null-usage",
    ],
)
async def test_malformed_reply_is_a_protocol_error(harness: Harness, content: bytes) -> None:
    """A 200 that is not a valid completion raises ProtocolError (no retry, no KeyError)."""
    script = Script(raw(content))
    with pytest.raises(ProtocolError) as exc:
        await chat(harness.client(script))
    assert "choices[0].message" in str(exc.value)
    assert f"{BASE}/v1/chat/completions" in str(exc.value)
    assert len(script.requests) == 1


async def test_protocol_error_is_a_traingate_error(harness: Harness) -> None:
    """Callers can catch every TrainGate failure through TrainGateError."""
    with pytest.raises(TrainGateError):
        await chat(harness.client(Script(raw(b"{}"))))


# -- secrets ---------------------------------------------------------------------------------


def echo_auth(status: int) -> Callable[[httpx2.Request], httpx2.Response]:
    """A step that leaks the caller's Authorization header back in its error body."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        auth = request.headers.get("authorization", "")
        return httpx2.Response(
            status,
            json={"detail": f"bad token {auth}", "key": auth.removeprefix("Bearer ")},
        )

    return answer


def exception_texts(exc: BaseException) -> list[str]:
    """Everything an exception could print: str, repr, args and extra attributes."""
    texts = [str(exc), repr(exc), *(str(a) for a in exc.args)]
    texts.extend(str(v) for v in vars(exc).values())
    return texts


@pytest.mark.parametrize("status", [401, 403, 500])
async def test_api_key_never_appears_in_http_errors(
    harness: Harness, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Even when TrainGate echoes the key in its error body, no exception text or log holds it."""
    caplog.set_level(logging.DEBUG)
    with pytest.raises(TrainGateHTTPError) as exc:
        await chat(harness.client(Script(echo_auth(status))))
    assert "bad token" in exc.value.body
    for text in exception_texts(exc.value):
        assert SECRET not in text
    assert SECRET not in caplog.text


async def test_api_key_never_appears_in_a_long_error_body(harness: Harness) -> None:
    """A secret near the 500-character excerpt limit is scrubbed before truncation."""
    body = "x" * 490 + SECRET + "y" * 100
    script = Script(raw(body, status=400))
    with pytest.raises(TrainGateHTTPError) as exc:
        await chat(harness.client(script))
    for text in exception_texts(exc.value):
        assert SECRET not in text
        assert SECRET[:10] not in text
    assert exc.value.body.endswith("...")


async def test_api_key_never_appears_in_transport_errors(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A transport error whose text contains the key is scrubbed in the final exception."""
    caplog.set_level(logging.DEBUG)
    script = Script(httpx2.ConnectError(f"proxy refused Bearer {SECRET}"))
    with pytest.raises(TrainGateUnavailable) as exc:
        await chat(harness.client(script))
    for text in exception_texts(exc.value):
        assert SECRET not in text
    assert SECRET not in caplog.text


async def test_channel_repr_hides_the_api_key(harness: Harness) -> None:
    """A rollout's channel shows its URL but not its secret."""
    request = RolloutRequest(
        rollout_id="r-1", server_url=BASE, messages=[], completion_params={}, api_key=SECRET
    )
    channel = harness.client(Script(200)).channel(request)
    assert BASE in repr(channel)
    assert SECRET not in repr(channel)
    assert SECRET not in str(vars(channel).get("server_url"))


async def test_api_key_never_appears_in_protocol_errors(harness: Harness) -> None:
    """A malformed 200 that echoes the key is described without it."""
    script = Script(lambda request: httpx2.Response(200, json={"choices": SECRET, "usage": SECRET}))
    with pytest.raises(ProtocolError) as exc:
        await chat(harness.client(script))
    for text in exception_texts(exc.value):
        assert SECRET not in text


# --------------------------------------------------------------------------------------------
# Hostile replies: bounded memory and one deadline, on both carriers (real sockets)
# --------------------------------------------------------------------------------------------

CAP = 2**20  # 1 MiB: replies beyond it are refused


@contextlib.asynccontextmanager
async def _hostile_client(
    carrier: str, *, deadline_s: float = 10.0
) -> AsyncIterator[TrainGateClient]:
    """The lean carrier (chosen by default on asyncio) or httpx2 (the one used behind a
    proxy), both from the same policy: retries off, a 1 MiB cap, one deadline."""
    retry = RetryPolicy(retries=0, attempt_timeout_s=deadline_s, max_reply_bytes=CAP)
    if carrier == "http1":
        client = TrainGateClient(retry=retry)
        assert isinstance(client.transport, Http1Transport)
    else:
        client = TrainGateClient(retry=retry, transport=_httpx2_default(retry))
    try:
        yield client
    finally:
        await client.transport.aclose()  # ours either way (a transport handed in included)


def _httpx2_default(retry: RetryPolicy) -> Httpx2Transport:
    return Httpx2Transport(
        default_http_client(retry, 10),
        owned=True,
        max_reply_bytes=retry.max_reply_bytes,
        deadline_s=retry.attempt_timeout_s,
    )


async def _peak_during(call: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """Run ``call()``; its error (if any) and the peak Python memory it allocated."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    error: BaseException | None = None
    try:
        await call()
    except Exception as exc:
        error = exc
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return error, peak


@pytest.mark.parametrize("carrier", ["http1", "httpx2"])
@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ("bomb", "the decompressed response is larger than 1 MiB"),
        ("endless", "the response body is larger than 1 MiB"),
        ("long-length", "the response body is larger than 1 MiB"),
    ],
)
async def test_a_hostile_reply_is_refused_with_bounded_memory(
    carrier: str, shape: str, message: str
) -> None:
    """A 64 MiB gzip bomb, an endless chunked body and a 1 TB Content-Length each end in a
    clear ProtocolError, and the call never holds more than a few times the 1 MiB cap (the
    review saw 63 MiB per call for the bomb, 2 GiB on httpx2 for a bigger one)."""
    gzip_bomb(64)  # made before memory is measured: it is the server's, not the call's
    async with HostileGate(shape).running() as gate, _hostile_client(carrier) as client:
        error, peak = await _peak_during(lambda: chat_to(client, gate.url))
    assert isinstance(error, ProtocolError), error
    assert f"could not be decoded ({message})" in str(error)
    assert peak < 6 * CAP, f"{peak / 2**20:.1f} MiB at peak"


@pytest.mark.parametrize("carrier", ["http1", "httpx2"])
async def test_a_dripping_reply_ends_at_the_call_deadline(carrier: str) -> None:
    """A reply sent one byte every 50 ms ends at the one deadline of the call (1 s here),
    not at a per-read timeout that each byte restarts."""
    async with HostileGate("drip").running() as gate:
        started = time.monotonic()
        async with _hostile_client(carrier, deadline_s=1.0) as client:
            with pytest.raises(
                TrainGateTimeout, match=r"ReadTimeout \(no complete response within"
            ):
                await chat_to(client, gate.url)
    assert time.monotonic() - started < 3


async def test_a_second_response_in_the_same_write_is_not_taken_for_the_next() -> None:
    """A reply followed, in the same write, by a response nobody asked for: the lean carrier
    returns the first, with its own headers, and the next call does not read the stray one
    (it goes on a new connection). (httpx2 reads it as the next call's reply: one more reason
    the lean carrier is the default; docs/security.md.)"""
    async with HostileGate("pipelined").running() as gate, _hostile_client("http1") as client:
        for _ in range(2):
            reply = await client.transport.post(f"{gate.url}/v1/chat/completions", b"{}", {})
            assert reply.status_code == 200
            assert "x-smuggled" not in reply.headers
            assert reply.json()["id"] == "c1"
    assert gate.connections == 2


async def chat_to(client: TrainGateClient, base: str) -> CompletionsResponse:
    """One chat turn to ``base`` (a real server)."""
    return await client.chat_completions(base, chat_body(), api_key=None, request_id="r-1:1")


@pytest.mark.parametrize(
    "step", [500, httpx2.ConnectError("refused"), lambda r: httpx2.Response(200, text="nope")]
)
async def test_a_password_in_the_url_never_appears_in_logs_or_errors(
    harness: Harness, caplog: pytest.LogCaptureFixture, step: Step
) -> None:
    """``user:password@`` in server_url: every retry log line and the final error name the URL
    with the password as ***."""
    caplog.set_level(logging.DEBUG)
    client = harness.client(Script(step))
    base = "http://trainer:pw-hunter2@traingate.test"
    with pytest.raises(TrainGateError) as exc:
        await client.chat_completions(base, chat_body(), api_key=None, request_id="r-1:1")
    for text in exception_texts(exc.value):
        assert "pw-hunter2" not in text
    assert "trainer:***@traingate.test" in str(exc.value)
    assert "pw-hunter2" not in caplog.text
