"""The driver half of the mock TrainGate's v2 controller (spec §11): start a rollout with
``POST /rollout`` (an init answered 429 is resent after its ``Retry-After``), wait for the
grader callback, then check ``GET /rollout/{id}/status``; past the deadline (agent + grader
timeouts + 60 s), report what is missing and ``POST /rollout/cancel``.

Apart from :mod:`.traingate_v2` (the three routes a v2 server calls) so that each reads as
one side of the exchange; ``MockTrainGate.v2`` is a :class:`V2Controller`, both at once.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

import anyio
from pydantic import ValidationError

from ..findings import BODY_ID_MISMATCH, MISSING_GRADER_CALLBACK, NO_COMPLETION
from ..protocol import OpenAIFunctionToolSchema, RolloutRequest
from ..transport import PostTransport, Reply, TransportFailure, parse_retry_after
from .protocol_checks_v2 import check_cancel, check_status
from .records import RolloutRecord
from .traingate_v2 import TOOLS, V2Endpoints
from .v2_bodies import TERMINAL_STATUSES, start_body, v2_result

if TYPE_CHECKING:
    import httpx2

__all__ = ["HttpxCalls", "ServerCalls", "V2Controller", "retry_after"]

#: How long the status answer may lag behind the grader callback's ack (the server records
#: the outcome as the delivery returns): a few polls, then a finding.
STATUS_GRACE_S = 1.0


class V2Controller(V2Endpoints):
    """The v2 routes (:class:`~.traingate_v2.V2Endpoints`) plus driving a v2 server."""

    async def start(
        self,
        post: PostTransport,
        server_url: str,
        request: RolloutRequest,
        *,
        llm_key: str,
        callback_key: str,
        agent_timeout_s: float,
        grader_timeout_s: float,
        server_key: str | None = None,
        declared: list[OpenAIFunctionToolSchema] | None = None,
        give_up_at: float | None = None,
    ) -> tuple[RolloutRecord, Reply]:
        """Register the rollout and ``POST /rollout`` until it is not 429 (waiting what each
        ``Retry-After`` says, clamped to 0.05-60 s, until ``give_up_at``, a monotonic time)."""
        record = self.expect(
            request.rollout_id,
            api_key=llm_key,
            callback_key=callback_key,
            tools=declared,
            request=request,
        )
        exchange = record.v2
        assert exchange is not None
        content = json.dumps(
            start_body(
                request,
                base_url=self.gate.base_url,
                llm_key=llm_key,
                callback_key=callback_key,
                agent_timeout_s=agent_timeout_s,
                grader_timeout_s=grader_timeout_s,
            ),
            separators=(",", ":"),
        ).encode()
        headers = _headers(server_key)
        while True:
            reply = await post.post(f"{server_url}/rollout", content, headers)
            if reply.status_code != 429:
                break
            wait = retry_after(reply.headers.get("retry-after"))
            if give_up_at is not None and time.monotonic() + wait > give_up_at:
                break
            exchange.throttled += 1
            await anyio.sleep(wait)
        if reply.status_code == 202:
            self._accepted(record, reply)
        else:
            exchange.closed = True
        return record, reply

    def _accepted(self, record: RolloutRecord, reply: Reply) -> None:
        try:
            data = reply.json()
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        named = data.get("rollout_id")
        if named is not None and named != record.rollout_id:
            record.add(
                BODY_ID_MISMATCH,
                f"the 202 names rollout_id {str(named)[:80]!r}, not the id this rollout was "
                "started with",
            )
        tools = data.get("tools")  # our server's extension: the tools get_tools returned
        exchange = record.v2
        if isinstance(tools, list) and exchange is not None and exchange.declared is None:
            with contextlib.suppress(ValidationError):  # a bad list: simply not known
                exchange.declared = TOOLS.validate_python(tools)

    async def finish(
        self,
        record: RolloutRecord,
        calls: ServerCalls,
        server_url: str,
        *,
        wait_s: float,
        server_key: str | None,
    ) -> None:
        """Wait for the grader callback up to ``wait_s``; then read the status, or (at the
        deadline) report what is missing and cancel the rollout. ``calls`` reaches the server
        at ``server_url`` (an in-process app's ``AsgiTransport``, or :class:`HttpxCalls`)."""
        exchange = record.v2
        assert exchange is not None
        with anyio.move_on_after(wait_s):
            await exchange.terminal.wait()
        headers = _headers(server_key)
        if exchange.terminal.is_set():
            rid = quote(record.rollout_id, safe="")
            exchange.status = await _status(calls, f"{server_url}/rollout/{rid}/status", headers)
            check_status(record, exchange, *exchange.status)
            return
        if not exchange.completions:
            record.add(NO_COMPLETION, f"no completion callback within {wait_s:g} s")
        record.add(
            MISSING_GRADER_CALLBACK,
            f"no grader callback within {wait_s:g} s (agent + grader timeouts + 60 s); "
            "the rollout was cancelled",
        )
        body = json.dumps({"ids": [record.rollout_id]}).encode()
        exchange.cancel = await _answer(calls, f"{server_url}/rollout/cancel", headers, body)
        check_cancel(record, exchange, *exchange.cancel)
        if exchange.completions:
            first = exchange.completions[0]
            record.completions.append(v2_result(record.rollout_id, first, None))
        exchange.closed = True


class ServerCalls(Protocol):
    """What the controller needs to reach a server beyond the init: a GET and a POST."""

    async def get(self, url: str, headers: Mapping[str, str]) -> Reply: ...

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply: ...


class HttpxCalls:
    """:class:`ServerCalls` over an ``httpx2`` client (a server on 127.0.0.1)."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http

    async def get(self, url: str, headers: Mapping[str, str]) -> Reply:
        """One GET, read whole."""
        response = await self.http.get(url, headers=dict(headers), timeout=10.0)
        return Reply(response.status_code, dict(response.headers), response.content)

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """One POST, read whole."""
        response = await self.http.post(url, content=content, headers=dict(headers), timeout=10.0)
        return Reply(response.status_code, dict(response.headers), response.content)


async def _status(calls: ServerCalls, url: str, headers: dict[str, str]) -> tuple[int, Any]:
    """The status answer, polled for up to ``STATUS_GRACE_S`` while it is not terminal."""
    give_up = time.monotonic() + STATUS_GRACE_S
    while True:
        answer = await _answer(calls, url, headers, None)
        status = answer[1].get("status") if isinstance(answer[1], dict) else None
        if status in TERMINAL_STATUSES or answer[0] != 200 or time.monotonic() > give_up:
            return answer
        await anyio.sleep(0.02)


async def _answer(
    calls: ServerCalls, url: str, headers: dict[str, str], body: bytes | None
) -> tuple[int, Any]:
    """One status (``body`` None: a GET) or cancel call: (HTTP status, JSON body or None); a
    transport failure is status 0."""
    import httpx2

    try:
        if body is None:
            reply = await calls.get(url, headers)
        else:
            reply = await calls.post(url, body, headers)
    except (TransportFailure, httpx2.TransportError):
        return 0, None
    try:
        return reply.status_code, reply.json()
    except ValueError:
        return reply.status_code, None


def _headers(server_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if server_key:
        headers["Authorization"] = f"Bearer {server_key}"
    return headers


def retry_after(value: str | None) -> float:
    """A 429's ``Retry-After`` in seconds (``transport.parse_retry_after``), clamped to 0.05-60
    (1 when missing or unreadable), as the original controller clamps it."""
    seconds = parse_retry_after(value)
    if seconds is None or not math.isfinite(seconds):
        return 1.0
    return min(60.0, max(0.05, seconds))
