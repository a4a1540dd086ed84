"""The mock TrainGate as a protocol v2 controller (spec sections 11 and 14.6).

It drives a v2 server: ``POST /rollout`` (an init answered 429 is resent after its
``Retry-After``), then waits for the grader callback and checks ``GET /rollout/{id}/status``;
past the deadline (agent + grader timeouts + 60 s) it reports what is missing and sends ``POST
/rollout/cancel``. And it serves the three URLs each init names, scoped to one rollout by its
path: ``/v1/rollouts/{id}/chat/completions`` (the agent's turns, with the LLM key, JSON or SSE
replies), ``.../completion`` and ``.../grader`` (the two callbacks, with the callback key). The
``/v1/`` there is not protocol v1: it is the OpenAI-style API version of a chat base URL, and
the URL shape is the original SDK's own controller's (``<base>/v1/rollouts/<id>``, spec 6), so
a server meets the paths it meets in production. A rollout is found by its path id; a body id,
when present, must be the same.

Every body is read with the one v2 model the server builds it with (``protocol.V2Init``,
``CompletionCallback``, ``GraderCallback``, ``StatusAnswer``, ``CancelAnswer``: unknown fields
refused), every call becomes records and findings on the rollout's :class:`RolloutRecord` (its
``exchange`` a :class:`~..records.V2Exchange`), and when the grader callback arrives the two
callbacks become one neutral result (:func:`v2_result`) in ``record.completions``, so rows,
results files and cassettes read the same on both wires.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import anyio
from pydantic import TypeAdapter, ValidationError

from ...errors import ConfigError, LLMBackendError
from ...findings import (
    BAD_API_KEY,
    BODY_ID_MISMATCH,
    CALLBACK_KEY_IN_CHAT,
    MALFORMED_REQUEST,
    MISSING_GRADER_CALLBACK,
    NO_COMPLETION,
    UNKNOWN_ROLLOUT,
)
from ...protocol import (
    TERMINAL_STATUSES,
    CancelBody,
    CompletionCallback,
    CompletionsRequest,
    CompletionsResponse,
    GraderCallback,
    OpenAIFunctionToolSchema,
    RolloutMetrics,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
    V2Init,
    describe_validation_error,
)
from ...transport import PostTransport, Reply, TransportFailure, parse_retry_after
from ...transport.sse import DONE_EVENT, encode_event
from ..protocol_checks import check_completion
from ..protocol_checks_v2 import (
    check_cancel,
    check_chat_v2,
    check_completion_callback,
    check_grader_callback,
    check_status,
)
from ..records import Finding, RolloutRecord, V2Exchange
from . import (
    MOCK_API_KEY,
    MOCK_CALLBACK_KEY,
    GateState,
    Handler,
    ServerCalls,
    ServerLink,
    as_response,
    bearer,
    json_reply,
    server_headers,
)

if TYPE_CHECKING:
    import httpx2
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

__all__ = [
    "Controller",
    "V2Controller",
    "declared_tools",
    "name_urls",
    "retry_after",
    "rollout_path",
    "sse_reply",
    "start_body",
    "start_label",
    "v2_metrics",
    "v2_result",
    "v2_route",
]

#: Route kinds under ``/v1/rollouts/{id}/``.
CHAT, COMPLETION, GRADER = "chat/completions", "completion", "grader"
_PREFIX = "/v1/rollouts/"
TOOLS = TypeAdapter(list[OpenAIFunctionToolSchema])
_JSON = {"content-type": "application/json"}
#: How long the status answer may lag behind the grader callback's ack (the server records
#: the outcome as the delivery returns): a few polls, then a finding.
STATUS_GRACE_S = 1.0


def v2_route(path: str) -> tuple[str, str] | None:
    """``(kind, rollout_id)`` for a path of the v2 routes, None for any other path."""
    if not path.startswith(_PREFIX):
        return None
    rest = path[len(_PREFIX) :]
    for kind in (CHAT, COMPLETION, GRADER):
        if rest.endswith("/" + kind):
            segment = rest[: -len(kind) - 1]
            if segment and "/" not in segment:
                return kind, unquote(segment)
    return None


def _same(token: str | None, key: str) -> bool:
    return token is not None and hmac.compare_digest(token.encode("utf-8", "replace"), key.encode())


def raw_path(request: Request) -> str:
    """The request's path as sent, undecoded (a rollout id may hold an encoded "/")."""
    raw = request.scope.get("raw_path")
    return raw.decode("latin-1").partition("?")[0] if raw else request.url.path


class V2Controller:
    """Protocol v2's side of one mock TrainGate (see the module docstring)."""

    def __init__(self, gate: GateState) -> None:
        self.gate = gate
        #: The last tool list a chat call sent, and its models: an agent sends the same tools
        #: on every call of every rollout, so they are validated once (the models are shared
        #: by the records, read-only).
        self._last_tools: tuple[list[Any], list[OpenAIFunctionToolSchema]] = ([], [])

    # -- the wire seam (``testing.wire.Controller``) -------------------------------------------

    def routes(self) -> list[BaseRoute]:
        """One route for the three URLs of every rollout (the path names the rollout)."""
        from starlette.routing import Route

        return [Route(f"{_PREFIX}{{rest:path}}", self._serve, methods=["POST"])]

    async def _serve(self, request: Request) -> Response:
        route = v2_route(raw_path(request))
        if route is None:
            from starlette.responses import Response

            return Response(b"Not Found", status_code=404, media_type="text/plain")
        kind, rollout_id = route
        return as_response(
            await self.handle(kind, rollout_id, request.headers, await request.body())
        )

    def handler(self, path: str) -> Handler | None:
        """The handler of a POST to one rollout's URL, if ``path`` is one."""
        route = v2_route(path)
        if route is None:
            return None
        kind, rollout_id = route

        async def handle(headers: Mapping[str, str], content: bytes) -> Reply:
            return await self.handle(kind, rollout_id, headers, content)

        return handle

    async def probe(self, http: httpx2.AsyncClient, server_url: str, key: str | None) -> None:
        """Fail fast when the server has no ``POST /rollout`` (an older ``osmosis serve``, or
        another server). ``OPTIONS /rollout`` asks without starting anything and without a
        body to refuse: a server with the route answers 405 (or 200), one without it 404. An
        empty ``POST /rollout`` would do too, but the official server logs its 422 as an
        error in the user's log."""
        import httpx2

        try:
            response = await http.options("/rollout", headers=server_headers(key), timeout=10.0)
        except httpx2.TransportError:
            return  # /health answered a moment ago: let the run report what happens
        if response.status_code == 404:
            raise ConfigError(
                f"the rollout server at {server_url} does not speak protocol v2 (POST "
                f"/rollout is not served: OPTIONS /rollout answered HTTP 404); drop --protocol "
                "v2 to test it over v1, or serve the agent with an osmosis serve that has v2"
            )

    async def run(
        self,
        link: ServerLink,
        request: RolloutRequest,
        *,
        timeout_s: float,
        grader_timeout_s: float,
    ) -> tuple[RolloutRecord, Reply]:
        """One v2 rollout: ``POST /rollout`` (429s waited out), then its grader callback, the
        status check, or the deadline and a cancel. ``timeout_s`` is the init's
        ``agent_timeout_sec``, ``grader_timeout_s`` its ``grader_timeout_sec``."""
        declared = await declared_tools(link, request)
        wait_s = max(0.0, timeout_s) + max(0.0, grader_timeout_s) + link.slack_s
        record, reply = await self.start(
            link.post,
            link.base_url,
            request,
            llm_key=MOCK_API_KEY,
            callback_key=MOCK_CALLBACK_KEY,
            agent_timeout_s=timeout_s,
            grader_timeout_s=grader_timeout_s,
            server_key=link.key,
            declared=declared,
            give_up_at=time.monotonic() + wait_s,
        )
        if reply.status_code == 202:
            await self.finish(record, link.calls, link.base_url, wait_s=wait_s, server_key=link.key)
        return record, reply

    # -- registering ----------------------------------------------------------------------

    def expect(
        self,
        rollout_id: str,
        *,
        api_key: str | None = None,
        callback_key: str | None = None,
        tools: list[OpenAIFunctionToolSchema] | None = None,
        request: RolloutRequest | None = None,
    ) -> RolloutRecord:
        """Register a v2 rollout before its ``POST /rollout`` is sent. ``tools``: what the
        agent declares, when known (for ``tools_not_sent``)."""
        record = RolloutRecord(rollout_id=rollout_id, api_key=api_key, request=request)
        record.exchange = V2Exchange(callback_key=callback_key, declared=tools)
        if tools is not None:
            record.tools, record.tools_known = list(tools), True
        record.tools_ready.set()  # v2 tools come with each chat call: nothing to wait for
        self.gate.records[rollout_id] = record
        return record

    def _find(self, rollout_id: str, what: str) -> tuple[RolloutRecord, V2Exchange] | Reply:
        record = self.gate.records.get(rollout_id)
        exchange = record.exchange if record is not None else None
        if record is None or not isinstance(exchange, V2Exchange):
            self.gate.stray_findings.append(
                Finding(UNKNOWN_ROLLOUT, f"{what} for a rollout never started", rollout_id)
            )
            return json_reply(404, {"detail": "unknown rollout_id"})
        return record, exchange

    def _tools(self, wire: Any) -> list[OpenAIFunctionToolSchema]:
        """A chat call's tools as models: the last list's when it is equal (the usual case)."""
        last_wire, last = self._last_tools
        if wire == last_wire and last:
            return list(last)
        tools = TOOLS.validate_python(wire)
        self._last_tools = (wire, tools)
        return list(tools)

    @staticmethod
    def _parse(content: bytes) -> dict[str, Any] | None:
        try:
            data = json.loads(content)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    # -- the three routes -----------------------------------------------------------------

    async def handle(
        self, kind: str, rollout_id: str, headers: Mapping[str, str], content: bytes
    ) -> Reply:
        """Answer one POST to the route ``kind`` of ``rollout_id`` (lower-case header names)."""
        if kind == CHAT:
            return await self.handle_chat(rollout_id, headers, content)
        return await self.handle_callback(kind, rollout_id, headers, content)

    async def handle_chat(
        self, rollout_id: str, headers: Mapping[str, str], content: bytes
    ) -> Reply:
        """``POST /v1/rollouts/{id}/chat/completions``: check the turn, learn its tools, ask
        the backend, answer in JSON, or in SSE when the body asks ``stream: true``."""
        found = self._find(rollout_id, "chat call")
        if isinstance(found, Reply):
            return found
        record, exchange = found
        token = bearer(headers)
        callback_key = exchange.callback_key
        if callback_key and callback_key != record.api_key and _same(token, callback_key):
            record.add(
                CALLBACK_KEY_IN_CHAT,
                "chat call carried the callback key (controller_api_key): the agent must "
                "only ever hold the LLM key",
            )
            return json_reply(401, {"detail": "Unauthorized"})
        if record.api_key is not None and not _same(token, record.api_key):
            record.add(BAD_API_KEY, "chat call without the rollout's llm_api_key")
            return json_reply(401, {"detail": "Unauthorized"})
        raw = self._parse(content)
        if raw is None:
            return self._malformed(record, "chat call", "the body is not a JSON object", 400)
        body_id = raw.pop("rollout_id", None)
        if body_id is not None and body_id != rollout_id:
            return self._mismatch(record, "chat call", body_id)
        stream = raw.pop("stream", False) is True
        raw.pop("stream_options", None)
        tools_wire = raw.pop("tools", None)
        try:
            tools = self._tools(tools_wire) if tools_wire is not None else []
            params = record.request.completion_params if record.request is not None else {}
            body = CompletionsRequest.model_validate({**params, **raw, "rollout_id": rollout_id})
        except ValidationError as exc:
            return self._malformed(record, "chat call", describe_validation_error(exc), 400)
        request_id = headers.get("x-request-id", "")
        if request_id and record.request_ids and record.request_ids[-1] == request_id:
            record.request_ids.pop()  # a retry of the last turn replaces it (as on v1)
            record.chats.pop()
            if len(record.replies) > len(record.chats):
                record.replies.pop()
                record.served_ms.pop()
        check_chat_v2(record, exchange, body, tools_wire is not None)
        if tools_wire is not None and exchange.declared is None:
            exchange.declared = tools  # known now: a later call without them is a finding
        record.tools, record.tools_known = tools, True  # what the model is told this turn
        record.tools_wire = tools_wire if isinstance(tools_wire, list) else []
        record.request_ids.append(request_id)
        record.chats.append(body)
        try:
            started = time.perf_counter()
            reply = await self.gate.backend.complete(body, record)
        except LLMBackendError as exc:
            record.backend_error = exc
            record.chats.pop()
            record.request_ids.pop()
            if exc.systemic and self.gate.systemic_error is None:
                self.gate.systemic_error = exc
            status = 424 if exc.systemic else 503
            self._note_chat(record, started, body, tools_wire, stream, error=exc)
            return json_reply(status, {"detail": f"LLM backend error: {exc}"})
        record.replies.append(reply)
        record.served_ms.append((time.perf_counter() - started) * 1000)
        self._note_chat(record, started, body, tools_wire, stream, reply=reply)
        if stream:
            return Reply(200, {"content-type": "text/event-stream"}, sse_reply(reply))
        return Reply(200, _JSON, reply.model_dump_json(exclude_none=True).encode())

    def _note_chat(
        self,
        record: RolloutRecord,
        started: float,
        body: CompletionsRequest,
        tools: Any,
        stream: bool,
        **answer: Any,
    ) -> None:
        """One chat turn in the gate's wire log, when it keeps one."""
        log = self.gate.wire_log
        if log is not None:
            rid = record.rollout_id
            log.add(rid, "chat", started, request=body, tools=tools, stream=stream, **answer)

    async def handle_callback(
        self, kind: str, rollout_id: str, headers: Mapping[str, str], content: bytes
    ) -> Reply:
        """``POST /v1/rollouts/{id}/completion`` or ``.../grader`` (spec §11.3-4): the
        callback key, the body, its id; acknowledged with ``{"ok": true}``."""
        started = time.perf_counter()
        what = f"{kind} callback"
        found = self._find(rollout_id, what)
        if isinstance(found, Reply):
            return found
        record, exchange = found
        if exchange.callback_key is not None and not _same(bearer(headers), exchange.callback_key):
            record.add(BAD_API_KEY, f"{what} without the rollout's controller_api_key")
            return json_reply(401, {"detail": "Unauthorized"})
        if exchange.closed:
            return json_reply(200, {"ok": True})  # late, after the deadline: acknowledged quietly
        model = CompletionCallback if kind == COMPLETION else GraderCallback
        try:
            body = model.model_validate_json(content)
        except ValidationError as exc:
            return self._malformed(record, what, describe_validation_error(exc), 422)
        if body.rollout_id is not None and body.rollout_id != rollout_id:
            return self._mismatch(record, what, body.rollout_id)
        if isinstance(body, CompletionCallback):
            check_completion_callback(record, exchange, body)
            exchange.completions.append(body)
        else:
            check_grader_callback(record, exchange, body)
            exchange.graders.append(body)
            if len(exchange.graders) == 1:
                self._finish(record, exchange)
        if self.gate.wire_log is not None:
            self.gate.wire_log.add(rollout_id, "callback", started, name=kind, body=body)
        return json_reply(200, {"ok": True})

    def _finish(self, record: RolloutRecord, exchange: V2Exchange) -> None:
        """The terminal event: the neutral result, the v1-era checks of a result, done."""
        completion = exchange.completions[0] if exchange.completions else None
        result = v2_result(record.rollout_id, completion, exchange.graders[0])
        if exchange.declared is not None:  # the rollout's tools, not only its last call's
            record.tools = list(exchange.declared)
        check_completion(record, result)
        record.completions.append(result)
        observe = getattr(self.gate.backend, "rollout_completed", None)
        if observe is not None:
            observe(record, result)
        exchange.terminal.set()
        record.done.set()

    def _malformed(self, record: RolloutRecord, what: str, detail: str, status: int) -> Reply:
        record.add(MALFORMED_REQUEST, f"malformed {what}: {detail}")
        return json_reply(status, {"detail": f"malformed {what}: {detail}"})

    def _mismatch(self, record: RolloutRecord, what: str, body_id: Any) -> Reply:
        record.add(
            BODY_ID_MISMATCH,
            f"{what} names rollout_id {str(body_id)[:80]!r} in its body but was posted to "
            "this rollout's URL: the ids must be the same",
        )
        return json_reply(422, {"detail": "rollout_id mismatch"})

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
        headers = server_headers(server_key)
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
        headers = server_headers(server_key)
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
        cancel = CancelBody(ids=[record.rollout_id]).model_dump(exclude_unset=True)
        body = json.dumps(cancel).encode()
        exchange.cancel = await _answer(calls, f"{server_url}/rollout/cancel", headers, body)
        check_cancel(record, exchange, *exchange.cancel)
        if exchange.completions:
            first = exchange.completions[0]
            record.completions.append(v2_result(record.rollout_id, first, None))
        exchange.closed = True


Controller = V2Controller


def sse_reply(reply: CompletionsResponse) -> bytes:
    """A chat reply as Server-Sent Events: one ``chat.completion.chunk`` holding the whole
    delta (tool calls with their ``index``), its finish reason and usage, then ``[DONE]``."""
    choice = reply.choices[0]
    delta: dict[str, Any] = {"role": "assistant"}
    if choice.message.content is not None:
        delta["content"] = choice.message.content
    if choice.message.tool_calls:
        delta["tool_calls"] = [
            {"index": i, **call.model_dump(mode="json", exclude_none=True)}
            for i, call in enumerate(choice.message.tool_calls)
        ]
    chunk = {
        "id": reply.id,
        "object": "chat.completion.chunk",
        "created": reply.created,
        "model": reply.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": choice.finish_reason}],
        "usage": reply.usage.model_dump(mode="json"),
    }
    return encode_event(chunk) + DONE_EVENT


def rollout_path(rollout_id: str) -> str:
    """The mock's path prefix for one rollout: the id as one percent-encoded path segment."""
    return f"{_PREFIX}{quote(rollout_id, safe='')}"


def start_body(
    request: RolloutRequest,
    *,
    base_url: str,
    llm_key: str,
    callback_key: str,
    agent_timeout_s: float,
    grader_timeout_s: float,
) -> dict[str, Any]:
    """The ``POST /rollout`` body for the rollout ``request`` describes (spec §3.1): its
    messages and metadata, the row's ``ground_truth`` as ``label``, three URLs scoped to its
    id, two distinct keys. v2 has no sampling parameters: the controller applies them.

    Only ``protocol.V2Init``'s fields (an undeclared one raises ``TypeError``), not validated
    by it: the mock sends what a row asks, and the server under test judges it."""
    prefix = base_url.rstrip("/") + rollout_path(request.rollout_id)
    label = start_label(request)
    body = {
        "rollout_id": request.rollout_id,
        "initial_messages": request.messages,
        "label": label,
        "metadata": request.metadata,
        "chat_completions_url": prefix,
        "llm_api_key": llm_key,
        "controller_api_key": callback_key,
        "completion_callback_url": f"{prefix}/completion",
        "grader_callback_url": f"{prefix}/grader",
        "agent_timeout_sec": agent_timeout_s,
        "grader_timeout_sec": grader_timeout_s,
    }
    undeclared = body.keys() - V2Init.model_fields.keys()
    if undeclared:
        raise TypeError(f"start_body sets {sorted(undeclared)}, which V2Init does not declare")
    return body


def start_label(request: RolloutRequest) -> str | None:
    """A start body's ``label``: the row's ``ground_truth``, as a string (JSON if it is not
    one), as both wires without sampling parameters send it."""
    truth = request.metadata.get("ground_truth")
    if truth is None or isinstance(truth, str):
        return truth
    return json.dumps(truth, ensure_ascii=False, separators=(",", ":"))


async def declared_tools(
    link: ServerLink, request: RolloutRequest
) -> list[OpenAIFunctionToolSchema] | None:
    """What the agent declares, when it runs in this process (for ``tools_not_sent``)."""
    if link.agent is None:
        return None
    from ...tools.tool_set import resolve_tool_set

    with contextlib.suppress(Exception):  # a broken get_tools: the server reports it
        # the shared, checked models (read, never changed): no copy per row
        return list((await resolve_tool_set(link.agent, request)).tools)
    return None


def v2_result(
    rollout_id: str, completion: CompletionCallback | None, grader: GraderCallback | None
) -> RolloutResponse:
    """The neutral result of a v2 rollout: COMPLETED when both callbacks say success, else
    ERROR with the first message and category the server gave. Our ``finish_reason`` travels in
    the sample's ``extra_fields`` or ``metrics`` when the server put it there."""
    sample = grader.sample if grader is not None else None
    succeeded = (
        completion is not None
        and completion.status == "success"
        and grader is not None
        and grader.status == "success"
    )
    failed = next(
        (c for c in (completion, grader) if c is not None and c.status != "success"), None
    )
    message = None
    if failed is not None:
        category = failed.err_category
        text = failed.err_message or f"{failed.status} without a message"
        message = f"{category}: {text}" if category else text
    elif grader is None:
        message = "no grader callback"
    extras = dict(sample.extra_fields) if sample is not None else {}
    metrics = v2_metrics(sample.metrics) if sample is not None else None
    finish = extras.get("finish_reason")
    if finish is None and sample is not None:
        finish = sample.metrics.get("finish_reason")
    if not isinstance(finish, str):
        finish = _finish_reason(completion, failed, succeeded)
    reward = sample.reward if sample is not None else None
    return RolloutResponse(
        rollout_id=rollout_id,
        status=RolloutStatus.COMPLETED if succeeded else RolloutStatus.ERROR,
        final_messages=list(sample.messages) if sample is not None else [],
        finish_reason=finish,
        error_message=message,
        reward=reward if reward is not None and math.isfinite(reward) else None,
        metrics=metrics,
        extra_fields=extras,
    )


def _finish_reason(
    completion: CompletionCallback | None,
    failed: CompletionCallback | GraderCallback | None,
    succeeded: bool,
) -> str:
    if succeeded:
        return "stop"
    if completion is not None and completion.status == "cancelled":
        return "cancelled"
    if failed is not None and failed.err_category == "timeout":
        return "timeout"
    return "error"


def v2_metrics(data: dict[str, Any]) -> RolloutMetrics | None:
    """A sample's ``metrics`` as our ``RolloutMetrics``, None when they are not ours."""
    try:
        return RolloutMetrics.model_validate(data)
    except ValidationError:
        return None


async def _status(calls: ServerCalls, url: str, headers: dict[str, str]) -> tuple[int, Any]:
    """The status answer, polled for up to ``STATUS_GRACE_S`` while it is not terminal.
    ``unknown`` is final at once: a server that keeps no status (osmosis-ai 0.3's
    ``LocalBackend``) never answers otherwise, and polling it cost 50 calls a rollout (the
    bench's CPU a rollout against it fell from 33 ms, ``benchmarks/bench_launch.py``)."""
    give_up = time.monotonic() + STATUS_GRACE_S
    while True:
        answer = await _answer(calls, url, headers, None)
        status = answer[1].get("status") if isinstance(answer[1], dict) else None
        final = status in TERMINAL_STATUSES or status == "unknown"
        if final or answer[0] != 200 or time.monotonic() > give_up:
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


def retry_after(value: str | None) -> float:
    """A 429's ``Retry-After`` in seconds (``transport.parse_retry_after``), clamped to 0.05-60
    (1 when missing or unreadable), as the original controller clamps it."""
    seconds = parse_retry_after(value)
    if seconds is None or not math.isfinite(seconds):
        return 1.0
    return min(60.0, max(0.05, seconds))


def name_urls(text: str, base_url: str) -> str:
    """``text`` with the URLs of a rollout under ``base_url`` named for a reader."""
    return re.sub(
        re.escape(base_url) + r"/v1/rollouts/[^/\s]+/(chat/completions|completion|grader)",
        lambda m: f"the mock TrainGate's {_NAMES[m.group(1)]} endpoint",
        text,
    )


_NAMES = {CHAT: "chat", COMPLETION: "completion", GRADER: "grader"}
