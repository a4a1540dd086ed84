"""The mock TrainGate as a polling controller (``docs/protocol-polling.md``): the controller of
osmosis-ai 0.3.3+, which reads each result itself instead of being called back.

It drives a polling server: ``POST /rollout`` (no callback URL, no controller key; a 429 is
resent after its ``Retry-After``), then long polls ``GET /rollout/{id}/result`` with the 202's
lease in ``X-Osmosis-Rollout-Lease`` until the status is an end; past the deadline (agent +
grader timeouts + the slack) it reports the missing result and sends ``POST /rollout/cancel``.
A poll that fails in transit is sent again (a controller reconnecting). Once the result is in,
it reads it a second time (the same body, still there) and once with a wrong lease (a 403). It
serves one URL per rollout, the agent's chat endpoint ``/polling/{id}/chat/completions``,
answered as v2's (the same checks: :meth:`.v2.V2Controller.handle_chat`).

Every body is read with the one model the server builds it with (``protocol.PollingAccepted``,
``PollingResult``: unknown fields refused) and the start body is a ``protocol.PollingInit``'s
fields; the rules only this wire has are :mod:`..protocol_checks_polling`. The finished result
becomes the neutral ``RolloutResponse`` (:func:`polling_result`) in ``record.completions``, so
rows, results files and cassettes read as on the other wires.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import anyio
from pydantic import ValidationError

from ...errors import ConfigError
from ...findings import MALFORMED_REQUEST, NO_COMPLETION
from ...protocol import (
    TERMINAL_STATUSES,
    CancelBody,
    CompletionCallback,
    PollingAccepted,
    PollingInit,
    PollingResult,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
    describe_validation_error,
)
from ...transport import Reply, TransportFailure
from ..protocol_checks import check_completion
from ..protocol_checks_polling import (
    check_lease_expiry,
    check_progress,
    check_reread,
    check_result,
    check_wrong_lease,
)
from ..protocol_checks_v2 import check_cancel
from ..records import RolloutRecord, V2Exchange
from . import MOCK_API_KEY, GateState, Handler, ServerCalls, ServerLink, as_response, server_headers
from .v2 import V2Controller, declared_tools, raw_path, retry_after, start_label, v2_metrics

if TYPE_CHECKING:
    import httpx2
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

__all__ = [
    "LEASE_HEADER",
    "Controller",
    "PollingController",
    "PollingExchange",
    "name_urls",
    "polling_result",
    "start_body",
]

#: The header a result poll names its lease in.
LEASE_HEADER = "X-Osmosis-Rollout-Lease"
_PREFIX = "/polling/"
_CHAT = "/chat/completions"
#: How long a poll that is neither answered nor refused may wait past the server's own wait.
POLL_GRACE_S = 5.0
#: How long a read with a wrong lease may take before it counts as accepted (parked).
WRONG_LEASE_WAIT_S = 2.0
#: The pause before a poll is sent again after one failed in transit.
RECONNECT_S = 0.1


@dataclass
class PollingExchange(V2Exchange):
    """A polling rollout as its controller sees it: v2's exchange (its chat checks read
    ``declared`` and ``completions``) plus the lease and every status the polls answered."""

    lease: str | None = None
    wait_s: float = 30.0
    lease_s: float = 120.0
    #: Each poll's status, in order (a dropped poll adds nothing).
    statuses: list[str] | None = None
    #: The finished result's body, as first read.
    result: dict[str, Any] | None = None
    #: Polls sent again after failing in transit.
    reconnects: int = 0
    #: When the lease runs out if nobody polls (monotonic); chat calls after it are ``late``.
    lease_ends_at: float = math.inf
    late: int = 0


def polling_route(path: str) -> str | None:
    """The rollout id of a path of the chat route, None for any other path."""
    if not (path.startswith(_PREFIX) and path.endswith(_CHAT)):
        return None
    segment = path[len(_PREFIX) : -len(_CHAT)]
    return unquote(segment) if segment and "/" not in segment else None


class PollingController:
    """The polling wire's side of one mock TrainGate (see the module docstring)."""

    def __init__(self, gate: GateState) -> None:
        self.gate = gate
        #: Answers the chat calls (v2's handler: the same checks, this wire's records).
        self.chat = V2Controller(gate)
        #: A probe for ``lease_ignored``: when set, the controller stops polling after the 202
        #: for longer than the lease, then reads what became of the rollout.
        self.abandon: bool = False

    # -- the wire seam (``testing.wire.Controller``) -------------------------------------------

    def routes(self) -> list[BaseRoute]:
        """The chat URL of every rollout (the path names the rollout)."""
        from starlette.routing import Route

        return [Route(f"{_PREFIX}{{rest:path}}", self._serve, methods=["POST"])]

    async def _serve(self, request: Request) -> Response:
        rollout_id = polling_route(raw_path(request))
        if rollout_id is None:
            from starlette.responses import Response

            return Response(b"Not Found", status_code=404, media_type="text/plain")
        return as_response(
            await self.handle_chat(rollout_id, request.headers, await request.body())
        )

    def handler(self, path: str) -> Handler | None:
        """The handler of a POST to one rollout's chat URL, if ``path`` is one."""
        rollout_id = polling_route(path)
        if rollout_id is None:
            return None

        async def handle(headers: Mapping[str, str], content: bytes) -> Reply:
            return await self.handle_chat(rollout_id, headers, content)

        return handle

    async def handle_chat(
        self, rollout_id: str, headers: Mapping[str, str], content: bytes
    ) -> Reply:
        """One chat turn, as v2's; a turn after the lease ran out is counted (``late``)."""
        record = self.gate.records.get(rollout_id)
        exchange = record.exchange if record is not None else None
        if isinstance(exchange, PollingExchange) and time.monotonic() > exchange.lease_ends_at:
            exchange.late += 1
        return await self.chat.handle_chat(rollout_id, headers, content)

    async def probe(self, http: httpx2.AsyncClient, server_url: str, key: str | None) -> None:
        """Fail fast when the server has no result route: a poll for an id nobody started is
        a 404 (or 403/422) from a polling server, and 405 (or a 404 without JSON) from one
        without the route."""
        import httpx2

        try:
            response = await http.get(
                "/rollout/osmosis-test-probe/result",
                headers={**server_headers(key), LEASE_HEADER: "probe"},
                timeout=10.0,
            )
        except httpx2.TransportError:
            return  # /health answered a moment ago: let the run report what happens
        polling = response.status_code in (401, 403, 422) or (
            response.status_code == 404 and "json" in response.headers.get("content-type", "")
        )
        if not polling:
            raise ConfigError(
                f"the rollout server at {server_url} does not speak the polling wire (GET "
                f"/rollout/{{id}}/result answered HTTP {response.status_code}); choose another "
                "--protocol, or serve the agent with osmosis serve or osmosis-ai 0.3.3+"
            )

    async def run(
        self,
        link: ServerLink,
        request: RolloutRequest,
        *,
        timeout_s: float,
        grader_timeout_s: float,
    ) -> tuple[RolloutRecord, Reply]:
        """One polling rollout: ``POST /rollout`` (429s waited out), then result polls until
        an end, the two re-reads, or the deadline and a cancel."""
        wait_s = max(0.0, timeout_s) + max(0.0, grader_timeout_s) + link.slack_s
        give_up_at = time.monotonic() + wait_s
        record = self.expect(
            request.rollout_id,
            api_key=MOCK_API_KEY,
            declared=await declared_tools(link, request),
            request=request,
        )
        exchange = record.exchange
        assert isinstance(exchange, PollingExchange)
        content = json.dumps(
            start_body(
                request,
                base_url=self.gate.base_url,
                llm_key=MOCK_API_KEY,
                agent_timeout_s=timeout_s,
                grader_timeout_s=grader_timeout_s,
            ),
            separators=(",", ":"),
        ).encode()
        headers = server_headers(link.key)
        while True:
            reply = await link.post.post(f"{link.base_url}/rollout", content, headers)
            if reply.status_code != 429:
                break
            pause = retry_after(reply.headers.get("retry-after"))
            if time.monotonic() + pause > give_up_at:
                break
            exchange.throttled += 1
            await anyio.sleep(pause)
        if reply.status_code != 202 or not self._accepted(record, exchange, reply):
            exchange.closed = True
            return record, reply
        await self.finish(record, link, give_up_at=give_up_at, wait_s=wait_s)
        return record, reply

    # -- registering ----------------------------------------------------------------------

    def expect(
        self,
        rollout_id: str,
        *,
        api_key: str | None = None,
        declared: list[Any] | None = None,
        request: RolloutRequest | None = None,
    ) -> RolloutRecord:
        """Register a polling rollout before its ``POST /rollout`` is sent."""
        record = RolloutRecord(rollout_id=rollout_id, api_key=api_key, request=request)
        record.exchange = PollingExchange(callback_key=None, declared=declared, statuses=[])
        if declared is not None:
            record.tools, record.tools_known = list(declared), True
        record.tools_ready.set()  # the tools come with each chat call: nothing to wait for
        self.gate.records[rollout_id] = record
        return record

    def _accepted(self, record: RolloutRecord, exchange: PollingExchange, reply: Reply) -> bool:
        """Read the 202 (strictly): the lease and its timings. False when it is unusable."""
        try:
            answer = PollingAccepted.model_validate_json(reply.content)
        except ValidationError as exc:
            record.add(
                MALFORMED_REQUEST,
                f"malformed 202 of POST /rollout: {describe_validation_error(exc)}",
            )
            return False
        if answer.rollout_id != record.rollout_id:
            record.add(
                MALFORMED_REQUEST,
                f"the 202 names rollout_id {answer.rollout_id[:80]!r}, not the id this rollout "
                "was started with",
            )
        exchange.lease = answer.polling_lease_token
        exchange.wait_s = answer.result_wait_timeout_sec
        exchange.lease_s = answer.polling_lease_timeout_sec
        return True

    # -- polling --------------------------------------------------------------------------

    async def finish(
        self, record: RolloutRecord, link: ServerLink, *, give_up_at: float, wait_s: float
    ) -> None:
        """Poll until the result is an end (then read it twice more), or until ``give_up_at``
        (then report it missing and cancel the rollout)."""
        exchange = record.exchange
        assert isinstance(exchange, PollingExchange)
        assert exchange.lease is not None
        url = f"{link.base_url}/rollout/{quote(record.rollout_id, safe='')}/result"
        headers = {**server_headers(link.key), LEASE_HEADER: exchange.lease}
        if self.abandon:
            await self._abandon(record, exchange, link.calls, url, headers)
            return
        statuses = exchange.statuses
        assert statuses is not None
        while (left := give_up_at - time.monotonic()) > 0:
            with anyio.move_on_after(min(left, exchange.wait_s + POLL_GRACE_S)) as scope:
                code, body = await _read(link.calls, url, headers)
                if code == 0:
                    exchange.reconnects += 1
                    await anyio.sleep(RECONNECT_S)
                    continue
                if code in (429, 503):  # busy for a moment (the body says so): poll again
                    await anyio.sleep(1.0)
                    continue
                result = self._result(record, code, body)
                if result is None:
                    exchange.closed = True
                    return
                check_progress(record, statuses[-1] if statuses else None, result.status)
                statuses.append(result.status)
                if result.status in TERMINAL_STATUSES:
                    await self._finished(record, exchange, result, body, link.calls, url, headers)
                    return
            if scope.cancelled_caught:
                exchange.reconnects += 1  # a poll past the server's wait: dropped, sent again
        record.add(
            NO_COMPLETION,
            f"no finished result within {wait_s:g} s (agent + grader timeouts + the slack); "
            "the rollout was cancelled",
        )
        cancel = json.dumps(CancelBody(ids=[record.rollout_id]).model_dump(exclude_unset=True))
        exchange.cancel = await _read(
            link.calls, f"{link.base_url}/rollout/cancel", server_headers(link.key), cancel.encode()
        )
        check_cancel(record, exchange, *exchange.cancel)
        exchange.closed = True

    def _result(self, record: RolloutRecord, code: int, body: Any) -> PollingResult | None:
        """A poll's answer as a result, or a finding and None (the server forgot the rollout,
        refused its own lease, or answered a body that is not a result)."""
        if code != 200:
            record.add(
                NO_COMPLETION,
                f"a result poll with the rollout's lease answered HTTP {code}: the server "
                "lost the rollout or refused its own lease",
            )
            return None
        try:
            result = PollingResult.model_validate(body)
        except ValidationError as exc:
            record.add(
                MALFORMED_REQUEST, f"malformed result answer: {describe_validation_error(exc)}"
            )
            return None
        if result.rollout_id != record.rollout_id:
            record.add(
                MALFORMED_REQUEST,
                f"a result poll answered rollout_id {result.rollout_id[:80]!r}, not its own",
            )
        return result

    async def _finished(
        self,
        record: RolloutRecord,
        exchange: PollingExchange,
        result: PollingResult,
        body: dict[str, Any],
        calls: ServerCalls,
        url: str,
        headers: dict[str, str],
    ) -> None:
        """The terminal event: the result's checks, the second read, the wrong lease, done."""
        exchange.result = body
        check_result(record, result)
        # the agent phase is over: a chat call from now on is chat_after_completion
        exchange.completions.append(
            CompletionCallback(status=result.status, rollout_id=record.rollout_id)
        )
        check_reread(record, body, *await _read(calls, url, headers))
        wrong = {**headers, LEASE_HEADER: "not-" + (exchange.lease or "")}
        code = 0
        with anyio.move_on_after(WRONG_LEASE_WAIT_S):
            code, _ = await _read(calls, url, wrong)
        check_wrong_lease(record, code)
        neutral = polling_result(record.rollout_id, result)
        if exchange.declared is not None:  # the rollout's tools, not only its last call's
            record.tools = list(exchange.declared)
        check_completion(record, neutral)
        record.completions.append(neutral)
        observe = getattr(self.gate.backend, "rollout_completed", None)
        if observe is not None:
            observe(record, neutral)
        exchange.terminal.set()
        exchange.closed = True
        record.done.set()

    async def _abandon(
        self,
        record: RolloutRecord,
        exchange: PollingExchange,
        calls: ServerCalls,
        url: str,
        headers: dict[str, str],
    ) -> None:
        """The ``lease_ignored`` probe: no poll for the lease and a second, then one read."""
        exchange.lease_ends_at = time.monotonic() + exchange.lease_s
        await anyio.sleep(exchange.lease_s + 1.0)
        code, body = 0, None
        with anyio.move_on_after(exchange.wait_s + POLL_GRACE_S):
            code, body = await _read(calls, url, headers)
        status = body.get("status") if code == 200 and isinstance(body, dict) else None
        check_lease_expiry(record, exchange.lease_s, str(status or code), exchange.late)
        result = self._result(record, code, body) if status in TERMINAL_STATUSES else None
        if result is not None and isinstance(body, dict):
            exchange.result = body
            record.completions.append(polling_result(record.rollout_id, result))
        exchange.closed = True
        record.done.set()


Controller = PollingController


def start_body(
    request: RolloutRequest,
    *,
    base_url: str,
    llm_key: str,
    agent_timeout_s: float,
    grader_timeout_s: float,
) -> dict[str, Any]:
    """The polling ``POST /rollout`` body for the rollout ``request`` describes: its messages
    and metadata, the row's ``ground_truth`` as ``label``, the chat URL scoped to its id, the
    LLM key, grading asked for. Only ``protocol.PollingInit``'s fields (an undeclared one raises
    ``TypeError``), not validated by it: the server under test judges what a row asks."""
    body = {
        "rollout_id": request.rollout_id,
        "initial_messages": request.messages,
        "label": start_label(request),
        "metadata": request.metadata,
        "chat_completions_url": base_url.rstrip("/") + rollout_path(request.rollout_id),
        "llm_api_key": llm_key,
        "grade": True,
        "agent_timeout_sec": agent_timeout_s,
        "grader_timeout_sec": grader_timeout_s,
    }
    undeclared = body.keys() - PollingInit.model_fields.keys()
    if undeclared:
        raise TypeError(f"start_body sets {sorted(undeclared)}, which PollingInit does not declare")
    return body


def rollout_path(rollout_id: str) -> str:
    """The mock's chat base path of one rollout: the id as one percent-encoded segment."""
    return f"{_PREFIX}{quote(rollout_id, safe='')}"


def polling_result(rollout_id: str, result: PollingResult) -> RolloutResponse:
    """The neutral result of a finished polling rollout: COMPLETED for ``success``, else ERROR
    with the server's category and message. Our ``finish_reason`` travels in the sample's
    ``extra_fields`` or ``metrics`` when the server put it there."""
    sample = result.sample
    succeeded = result.status == "success"
    message = None
    if not succeeded:
        text = result.err_message or f"{result.status} without a message"
        message = f"{result.err_category}: {text}" if result.err_category else text
    extras = dict(sample.extra_fields) if sample is not None else {}
    finish = extras.get("finish_reason")
    if finish is None and sample is not None:
        finish = sample.metrics.get("finish_reason")
    if not isinstance(finish, str):
        finish = (
            "stop"
            if succeeded
            else "cancelled"
            if result.status == "cancelled"
            else "timeout"
            if result.err_category == "timeout"
            else "error"
        )
    reward = sample.reward if sample is not None else None
    return RolloutResponse(
        rollout_id=rollout_id,
        status=RolloutStatus.COMPLETED if succeeded else RolloutStatus.ERROR,
        final_messages=list(sample.messages) if sample is not None else [],
        finish_reason=finish,
        error_message=message,
        reward=reward if reward is not None and math.isfinite(reward) else None,
        # a server that sends no metrics of ours (osmosis-ai's): None, not zeros
        metrics=v2_metrics(sample.metrics) if sample is not None and sample.metrics else None,
        extra_fields=extras,
    )


async def _read(
    calls: ServerCalls, url: str, headers: dict[str, str], body: bytes | None = None
) -> tuple[int, Any]:
    """One result poll (``body`` None: a GET) or cancel: (HTTP status, JSON body or None); a
    failure in transit is status 0."""
    import httpx2

    try:
        reply = await (calls.get(url, headers) if body is None else calls.post(url, body, headers))
    except (TransportFailure, httpx2.TransportError):
        return 0, None
    try:
        return reply.status_code, reply.json()
    except ValueError:
        return reply.status_code, None


def name_urls(text: str, base_url: str) -> str:
    """``text`` with the chat URLs of a rollout under ``base_url`` named for a reader."""
    return re.sub(
        re.escape(base_url) + r"/polling/[^/\s]+/chat/completions",
        "the mock TrainGate's chat endpoint",
        text,
    )
