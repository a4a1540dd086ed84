"""The mock TrainGate as a protocol v1 trainer (``docs/protocol.md``): it sends ``POST
/v1/rollout/init`` (and learns the tools from the 202), answers ``POST /v1/chat/completions``
through the LLM backend, and receives ``POST /v1/rollout/completed``, the one callback.

Every call is checked (:mod:`..protocol_checks`) and recorded on the rollout's
:class:`~..records.RolloutRecord`; each violation becomes a named finding, never a crash. The
handlers work on headers and body bytes, so the HTTP routes and an in-process server's
``TrainGateClient`` (``MockTrainGate.post_transport``) reach the same code with the same bytes.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import ValidationError
from pydantic_core import to_json

from ...errors import LLMBackendError
from ...findings import (
    BAD_API_KEY,
    DUPLICATE_COMPLETION,
    MALFORMED_REQUEST,
    NO_COMPLETION,
    UNKNOWN_ROLLOUT,
)
from ...protocol import (
    CompletionsRequest,
    InitResponse,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
    describe_validation_error,
    wire_json,
)
from ...transport import Reply
from ..protocol_checks import check_chat, check_completion
from ..records import Finding, RolloutRecord
from . import GateState, Handler, ServerLink, as_response, bearer, json_reply, server_headers

if TYPE_CHECKING:
    import httpx2
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from ...transport import PostTransport

__all__ = ["CHAT_PATH", "COMPLETED_PATH", "Controller", "V1Controller", "name_urls"]

CHAT_PATH = "/v1/chat/completions"
COMPLETED_PATH = "/v1/rollout/completed"
INIT_PATH = "/v1/rollout/init"


class V1Controller:
    """Protocol v1's side of one mock TrainGate (see the module docstring)."""

    def __init__(self, gate: GateState) -> None:
        self.gate = gate
        #: Tools already parsed, by the exact bytes of an init answer's tools (see _learn_tools).
        self._parsed_tools: dict[bytes, tuple[list[OpenAIFunctionToolSchema], Any]] = {}
        self._handlers: dict[str, Handler] = {
            CHAT_PATH: self.handle_chat,
            COMPLETED_PATH: self.handle_completed,
        }

    # -- the wire seam (``testing.wire.Controller``) -------------------------------------------

    def routes(self) -> list[BaseRoute]:
        """``POST /v1/chat/completions`` and ``POST /v1/rollout/completed``."""
        from starlette.routing import Route

        def endpoint(handler: Handler) -> Any:
            async def serve(request: Request) -> Response:
                return as_response(await handler(request.headers, await request.body()))

            return serve

        return [
            Route(path, endpoint(handler), methods=["POST"])
            for path, handler in self._handlers.items()
        ]

    def handler(self, path: str) -> Handler | None:
        """The handler of ``path``, if it is one of v1's two."""
        return self._handlers.get(path)

    async def probe(self, http: httpx2.AsyncClient, server_url: str, key: str | None) -> None:
        """Nothing beyond ``/health`` and the key, which the harness checks for every wire."""

    async def run(
        self,
        link: ServerLink,
        request: RolloutRequest,
        *,
        timeout_s: float,
        grader_timeout_s: float,
    ) -> tuple[RolloutRecord, Reply]:
        """The init, then its completion callback, awaited a little longer than ``timeout_s``
        (the server's own deadline starts later, when the agent starts), so that an agent that
        runs too long shows up as the server's ``ERROR``/``timeout``, not as a lost callback."""
        record, reply = await self.init_rollout_via(
            link.post, link.base_url, request, server_key=link.key
        )
        if reply.status_code == 202:
            wait_s = timeout_s + max(1.0, timeout_s / 10)
            record = await self.wait_completed(request.rollout_id, wait_s)
        return record, reply

    # -- driving a rollout server --------------------------------------------------------------

    def expect(
        self,
        rollout_id: str,
        *,
        api_key: str | None = None,
        tools: list[OpenAIFunctionToolSchema] | None = None,
    ) -> RolloutRecord:
        """Register a rollout before its init is sent, so its calls are recognised."""
        record = RolloutRecord(
            rollout_id=rollout_id,
            api_key=api_key,
            tools=list(tools or []),
            tools_known=tools is not None,
        )
        record.tools_ready.set()
        self.gate.records[rollout_id] = record
        return record

    async def init_rollout(
        self, server: httpx2.AsyncClient, request: RolloutRequest, *, server_key: str | None = None
    ) -> tuple[RolloutRecord, httpx2.Response]:
        """POST ``/v1/rollout/init`` to a rollout server and record the tools it declared."""
        record, content = self._begin(request)
        try:
            headers = server_headers(server_key)
            response = await server.post(INIT_PATH, content=content, headers=headers)
            self._learn_tools(record, response.status_code, response.content)
        finally:
            record.tools_ready.set()  # known now, or never: chat calls waiting must go on
        return record, response

    async def init_rollout_via(
        self,
        transport: PostTransport,
        url: str,
        request: RolloutRequest,
        *,
        server_key: str | None = None,
    ) -> tuple[RolloutRecord, Reply]:
        """:meth:`init_rollout` through a :class:`~osmosis_rollout.transport.PostTransport`
        (``url``: the server's base URL)."""
        record, content = self._begin(request)
        try:
            reply = await transport.post(f"{url}{INIT_PATH}", content, server_headers(server_key))
            self._learn_tools(record, reply.status_code, reply.content)
        finally:
            record.tools_ready.set()
        return record, reply

    def _begin(self, request: RolloutRequest) -> tuple[RolloutRecord, bytes]:
        """Register the rollout and build the init's body."""
        record = RolloutRecord(rollout_id=request.rollout_id, api_key=request.api_key_value)
        record.request = request
        self.gate.records[request.rollout_id] = record
        return record, wire_json(request)

    def _learn_tools(self, record: RolloutRecord, status: int, content: bytes) -> None:
        """The tools a 202 declared. A server answers every init with the same tools, so the
        answer's bytes after its ``rollout_id`` are parsed once: the same bytes, the same tools
        (the models are shared by the records, read-only).

        Kept on measurement (``benchmarks/bench_replay.py``, 1,000 rows, alternating with the
        tree without it): parsing each init's tools costs only ~28 us, but a batch keeps every
        record, and a record's own copy of the tool models is ~100 more objects for each full
        collection to walk: without the cache, replay in process ran 640-784 rows/s against
        885-911 (1.26-1.55 ms of CPU a row against 1.08-1.12).
        """
        if status != 202:
            return
        prefix = b'{"rollout_id":' + to_json(record.rollout_id) + b',"tools":'
        key = content[len(prefix) :] if content.startswith(prefix) else None
        known = self._parsed_tools.get(key) if key is not None else None
        if known is None:
            tools = list(InitResponse.model_validate_json(content).tools)
            known = (tools, json.loads(content).get("tools"))
            if key is not None:
                if len(self._parsed_tools) >= 16:
                    self._parsed_tools.clear()
                self._parsed_tools[key] = known
        record.tools = list(known[0])
        record.tools_wire = known[1]
        record.tools_known = True

    async def wait_completed(self, rollout_id: str, timeout_s: float) -> RolloutRecord:
        """Wait for the completion callback; a miss becomes a ``no_completion`` finding."""
        record = self.gate.records[rollout_id]
        with anyio.move_on_after(timeout_s):
            await record.done.wait()
        if not record.completions:
            record.add(NO_COMPLETION, f"no completion callback within {timeout_s:g} s")
        return record

    # -- the two endpoints --------------------------------------------------------------------

    def _authorised(self, headers: Mapping[str, str], record: RolloutRecord) -> bool:
        expected = record.api_key
        if expected is None:
            return True
        token = bearer(headers)
        return token is not None and hmac.compare_digest(
            token.encode("utf-8", "replace"), expected.encode()
        )

    async def _receive(
        self, headers: Mapping[str, str], content: bytes, model: type[Any], what: str
    ) -> tuple[Any, RolloutRecord] | Reply:
        """Parse a call's body, find its rollout, check its key: the body and record, or the
        error reply (each failure also recorded as a finding)."""
        try:
            body = model.model_validate_json(content)
        except ValidationError as exc:
            detail = describe_validation_error(exc)
            self.gate.stray_findings.append(
                Finding(MALFORMED_REQUEST, f"malformed {what}: {detail}")
            )
            return json_reply(400, {"detail": detail})
        record = self.gate.records.get(body.rollout_id)
        if record is None:
            self.gate.stray_findings.append(
                Finding(UNKNOWN_ROLLOUT, f"{what} for a rollout never started", body.rollout_id)
            )
            return json_reply(404, {"detail": "unknown rollout_id"})
        if not self._authorised(headers, record):
            record.add(BAD_API_KEY, f"{what} without the rollout's bearer api_key")
            return json_reply(401, {"detail": "invalid api key"})
        return body, record

    async def handle_chat(self, headers: Mapping[str, str], content: bytes) -> Reply:
        """``POST /v1/chat/completions``: check the turn, ask the backend, record both.

        ``headers`` must look names up case-insensitively (Starlette's do; lower-case names
        in a plain dict do too)."""
        received = await self._receive(headers, content, CompletionsRequest, "chat call")
        if isinstance(received, Reply):
            return received
        body, record = received
        # The first turn may arrive before the init's 202 (the server starts the agent first):
        # answer it only once the declared tools are known, so the LLM always gets them.
        if not record.tools_ready.is_set():  # no checkpoint otherwise: keep the usual order
            await record.tools_ready.wait()
        request_id = headers.get("x-request-id", "")
        if request_id and record.request_ids and record.request_ids[-1] == request_id:
            # A retry of the last turn (its reply was lost on the way): it replaces that turn.
            record.request_ids.pop()
            record.chats.pop()
            if len(record.replies) > len(record.chats):
                record.replies.pop()
                record.served_ms.pop()
        check_chat(record, body)
        record.request_ids.append(request_id)
        record.chats.append(body)
        gate = self.gate
        try:
            started = time.perf_counter()
            reply = await gate.backend.complete(body, record)
        except LLMBackendError as exc:
            # Not the agent's fault: answer like a failing trainer and let the runner report it.
            record.backend_error = exc
            record.chats.pop()  # unanswered: the client's retry must not look like a rewrite
            record.request_ids.pop()
            if exc.systemic and gate.systemic_error is None:
                gate.systemic_error = exc
            # Systemic failures get a status the server will not retry (424); others a 503,
            # which a real trainer would also answer with when its model server hiccups.
            status = 424 if exc.systemic else 503
            if gate.wire_log is not None:
                gate.wire_log.add(body.rollout_id, "chat", started, request=body, error=exc)
            return json_reply(status, {"detail": f"LLM backend error: {exc}"})
        record.replies.append(reply)
        record.served_ms.append((time.perf_counter() - started) * 1000)
        if gate.wire_log is not None:
            gate.wire_log.add(body.rollout_id, "chat", started, request=body, reply=reply)
        return Reply(200, _JSON_HEADERS, reply.model_dump_json(exclude_none=True).encode())

    async def handle_completed(self, headers: Mapping[str, str], content: bytes) -> Reply:
        """``POST /v1/rollout/completed``: check and record the rollout's result."""
        started = time.perf_counter()
        received = await self._receive(headers, content, RolloutResponse, "completion callback")
        if isinstance(received, Reply):
            return received
        body, record = received
        if not record.tools_ready.is_set():  # the tools check needs them, as chat calls do
            await record.tools_ready.wait()
        if record.completions:
            record.add(DUPLICATE_COMPLETION, "a second completion callback arrived")
        else:
            check_completion(record, body)
        record.completions.append(body)
        observe = getattr(self.gate.backend, "rollout_completed", None)
        if observe is not None and len(record.completions) == 1:
            observe(record, body)  # e.g. a replay compares the result with its recording
        log = self.gate.wire_log
        if log is not None:
            log.add(body.rollout_id, "callback", started, name="completed", body=body)
        record.done.set()
        return json_reply(200, {"ok": True})


Controller = V1Controller
_JSON_HEADERS = {"content-type": "application/json"}


def name_urls(text: str, base_url: str) -> str:
    """``text`` with v1's two mock endpoints under ``base_url`` named for a reader."""
    return text.replace(f"{base_url}{CHAT_PATH}", "the mock TrainGate's chat endpoint").replace(
        f"{base_url}{COMPLETED_PATH}", "the mock TrainGate's completion endpoint"
    )
