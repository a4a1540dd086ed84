"""The mock TrainGate as a protocol v2 controller (spec §11 and §14.6): the routes side.

Three routes scoped to one rollout by its path: ``/v1/rollouts/{id}/chat/completions`` (the
agent's turns, with the LLM key, JSON or SSE replies), ``.../completion`` and ``.../grader``
(the two callbacks, with the callback key). A rollout is found by its path id; a body id, when
present, must be the same. The driver side (``POST /rollout``, the deadline, status and
cancel) is :mod:`.v2_driver`.

Every call becomes records and findings on the same :class:`RolloutRecord` the v1 routes use;
when the grader callback arrives, the two callbacks become one neutral result
(:func:`.v2_bodies.v2_result`) in ``record.completions``, so rows, results files and cassettes
read the same on both wires.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import anyio
from pydantic import TypeAdapter, ValidationError

from ..errors import LLMBackendError
from ..findings import (
    BAD_API_KEY,
    BODY_ID_MISMATCH,
    CALLBACK_KEY_IN_CHAT,
    MALFORMED_REQUEST,
    UNKNOWN_ROLLOUT,
)
from ..protocol import (
    CompletionsRequest,
    CompletionsResponse,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    describe_validation_error,
)
from ..transport import Reply
from ..transport.sse import DONE_EVENT, encode_event
from .protocol_checks import check_completion
from .protocol_checks_v2 import (
    check_chat_v2,
    check_completion_callback,
    check_grader_callback,
)
from .records import Finding, RolloutRecord
from .v2_bodies import (
    CompletionCallback,
    GraderCallback,
    v2_result,
)

if TYPE_CHECKING:
    from .traingate import MockTrainGate

__all__ = ["V2Endpoints", "V2Exchange", "v2_route"]

#: Route kinds under ``/v1/rollouts/{id}/``.
CHAT, COMPLETION, GRADER = "chat/completions", "completion", "grader"
_PREFIX = "/v1/rollouts/"
TOOLS = TypeAdapter(list[OpenAIFunctionToolSchema])
_JSON = {"content-type": "application/json"}


@dataclass
class V2Exchange:
    """A v2 rollout as its controller sees it: the callback key, the callbacks, the answers."""

    callback_key: str | None
    #: The tools the agent declares, where known (in process: its ``get_tools``): a chat call
    #: without ``tools`` is then a ``tools_not_sent`` finding.
    declared: list[OpenAIFunctionToolSchema] | None = None
    completions: list[CompletionCallback] = field(default_factory=list)
    graders: list[GraderCallback] = field(default_factory=list)
    terminal: anyio.Event = field(default_factory=anyio.Event)
    #: The answers read after the terminal event or at the deadline: (HTTP status, body).
    status: tuple[int, Any] | None = None
    cancel: tuple[int, Any] | None = None
    #: Inits answered 429 before the one that was accepted.
    throttled: int = 0
    #: Set once the controller gave up on the rollout (refused, or past its deadline): later
    #: callbacks are acknowledged quietly (spec §11.4).
    closed: bool = False


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


def _bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def _same(token: str | None, key: str) -> bool:
    return token is not None and hmac.compare_digest(token.encode("utf-8", "replace"), key.encode())


def _reply(status: int, data: Any) -> Reply:
    content = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Reply(status, _JSON, content.encode())


class V2Endpoints:
    """The v2 routes of one :class:`~.traingate.MockTrainGate` (``gate.v2`` adds the driver)."""

    def __init__(self, gate: MockTrainGate) -> None:
        self.gate = gate
        #: The last tool list a chat call sent, and its models: an agent sends the same tools
        #: on every call of every rollout, so they are validated once (the models are shared
        #: by the records, read-only).
        self._last_tools: tuple[list[Any], list[OpenAIFunctionToolSchema]] = ([], [])

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
        record.v2 = V2Exchange(callback_key=callback_key, declared=tools)
        if tools is not None:
            record.tools, record.tools_known = list(tools), True
        record.tools_ready.set()  # v2 tools come with each chat call: nothing to wait for
        self.gate.records[rollout_id] = record
        return record

    def _find(self, rollout_id: str, what: str) -> tuple[RolloutRecord, V2Exchange] | Reply:
        record = self.gate.records.get(rollout_id)
        if record is None or record.v2 is None:
            self.gate.stray_findings.append(
                Finding(UNKNOWN_ROLLOUT, f"{what} for a rollout never started", rollout_id)
            )
            return _reply(404, {"detail": "unknown rollout_id"})
        return record, record.v2

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
        token = _bearer(headers)
        callback_key = exchange.callback_key
        if callback_key and callback_key != record.api_key and _same(token, callback_key):
            record.add(
                CALLBACK_KEY_IN_CHAT,
                "chat call carried the callback key (controller_api_key): the agent must "
                "only ever hold the LLM key",
            )
            return _reply(401, {"detail": "Unauthorized"})
        if record.api_key is not None and not _same(token, record.api_key):
            record.add(BAD_API_KEY, "chat call without the rollout's llm_api_key")
            return _reply(401, {"detail": "Unauthorized"})
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
        check_chat_v2(record, exchange, body, tools_wire is not None)
        if tools_wire is not None and exchange.declared is None:
            exchange.declared = tools  # known now: a later call without them is a finding
        record.tools, record.tools_known = tools, True  # what the model is told this turn
        record.tools_wire = tools_wire if isinstance(tools_wire, list) else []
        record.request_ids.append(request_id)
        record.chats.append(body)
        try:
            reply = await self.gate.backend.complete(body, record)
        except LLMBackendError as exc:
            record.backend_error = exc
            record.chats.pop()
            record.request_ids.pop()
            if exc.systemic and self.gate.systemic_error is None:
                self.gate.systemic_error = exc
            status = 424 if exc.systemic else 503
            return _reply(status, {"detail": f"LLM backend error: {exc}"})
        record.replies.append(reply)
        if stream:
            return Reply(200, {"content-type": "text/event-stream"}, sse_reply(reply))
        return Reply(200, _JSON, reply.model_dump_json(exclude_none=True).encode())

    async def handle_callback(
        self, kind: str, rollout_id: str, headers: Mapping[str, str], content: bytes
    ) -> Reply:
        """``POST /v1/rollouts/{id}/completion`` or ``.../grader`` (spec §11.3-4): the
        callback key, the body, its id; acknowledged with ``{"ok": true}``."""
        what = f"{kind} callback"
        found = self._find(rollout_id, what)
        if isinstance(found, Reply):
            return found
        record, exchange = found
        if exchange.callback_key is not None and not _same(_bearer(headers), exchange.callback_key):
            record.add(BAD_API_KEY, f"{what} without the rollout's controller_api_key")
            return _reply(401, {"detail": "Unauthorized"})
        if exchange.closed:
            return _reply(200, {"ok": True})  # late, after the deadline: acknowledged quietly
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
        return _reply(200, {"ok": True})

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
        return _reply(status, {"detail": f"malformed {what}: {detail}"})

    def _mismatch(self, record: RolloutRecord, what: str, body_id: Any) -> Reply:
        record.add(
            BODY_ID_MISMATCH,
            f"{what} names rollout_id {str(body_id)[:80]!r} in its body but was posted to "
            "this rollout's URL: the ids must be the same",
        )
        return _reply(422, {"detail": "rollout_id mismatch"})


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
