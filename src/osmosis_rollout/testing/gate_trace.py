"""The mock TrainGate's side of each rollout as a debug trace: what ``osmosis test --server URL``
or ``--launch CMD`` writes with ``--debug-dir``, for a server that may be none of ours.

Such a server's own steps (its tool calls, what it does between turns) cannot be seen from
here; every call that crossed the wire can: the start and its answer, each chat turn the server
asked for (its messages, tools and parameters) with the reply the mock gave (finish reason,
token counts), each callback or result it sent, and the status and cancel answers, each with
its time. They are written in the trace format of ``docs/traces.md``, so ``read_trace`` and
``osmosis view`` read them as any trace: ``turn`` records for the chat turns, one record per
other call (``start``, ``status``, ``cancel``, ``poll``, ``callback``), and ``rollout_start``
marked ``"side": "traingate"``. The wires note chat turns and callbacks in the gate's
:class:`~.records.WireLog`; the calls the mock makes are noted by the link this module wraps
around the server (:meth:`GateTracer.link`), so no wire changes for it. Secrets never reach
the file: the mock's keys, the server's and the LLM's by value (:class:`~..tracing.Tracer`),
and any field named like a key or token (a polling lease) by name.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Awaitable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..protocol import CompletionsRequest, CompletionsResponse, Message
from ..redaction import REDACTED
from ..results import reply_message
from ..server_url import redacted_url
from ..tracing import Tracer, clip_text
from ..transport import PostTransport, Reply
from .records import RolloutRecord, WireCall, WireLog
from .wire import MOCK_API_KEY, MOCK_CALLBACK_KEY, ServerCalls, ServerLink

__all__ = ["SIDE", "GateTracer", "trace_events"]

#: ``rollout_start``'s ``side`` in a trace written by the mock TrainGate.
SIDE = "traingate"
#: A field holding a secret, by its name (``llm_api_key``, ``controller_api_key``,
#: ``polling_lease_token``...): written as ``**********`` whatever its value.
_SECRET_FIELD = re.compile(r"(^|_)(key|token|secret|password|authorization)$", re.IGNORECASE)
#: What the last segment of a path the mock calls says the call is (else ``start``).
_CALL_NAMES = {"status": "status", "cancel": "cancel", "result": "poll"}


class GateTracer:
    """Keeps the calls of each rollout while it runs and writes its trace when it ended:
    ``DIR/<safe rollout id>.jsonl``, on the one writer thread of a :class:`~..tracing.Tracer`.
    ``close()`` waits until everything is on disk."""

    def __init__(
        self,
        debug_dir: str | Path,
        *,
        server_url: str,
        protocol: str,
        secrets: Iterable[str | None] = (),
    ) -> None:
        self.tracer = Tracer(debug_dir, secrets=[MOCK_API_KEY, MOCK_CALLBACK_KEY, *secrets])
        #: The gate's wire log (``MockTrainGate.wire_log``): the wires note what they answer.
        self.log = WireLog()
        self.server_url = redacted_url(server_url)
        self.protocol = protocol
        #: The server's agent when its ``/health`` names one (ours: ``agent_loop``).
        self.agent: str | None = None

    def path_for(self, rollout_id: str) -> Path:
        """Where the trace of ``rollout_id`` goes."""
        return self.tracer.path_for(rollout_id)

    def link(self, link: ServerLink, rollout_id: str) -> ServerLink:
        """``link`` with every call the mock makes for ``rollout_id`` noted in the log."""
        return dataclasses.replace(
            link,
            post=_NotedPost(link.post, self.log, rollout_id),
            calls=self.noted(link.calls, rollout_id),
        )

    def noted(self, calls: ServerCalls, rollout_id: str) -> ServerCalls:
        """``calls`` with each one noted for ``rollout_id`` (a cancel asked from the REPL)."""
        return _NotedCalls(calls, self.log, rollout_id)

    def write(self, rollout_id: str, record: RolloutRecord | None, *, started: float) -> None:
        """Queue the trace of a rollout that ended (or was given up): its calls so far, its
        result and findings. ``started``: the wall-clock time it was begun."""
        calls = self.log.take(rollout_id)
        events = trace_events(
            rollout_id,
            record,
            calls,
            started=started,
            protocol=self.protocol,
            server=self.server_url,
            agent=self.agent,
        )
        emit = self.tracer.sink(rollout_id)
        for event in events:
            emit(event)

    def close(self) -> None:
        """Write everything queued."""
        self.tracer.close()


class _NotedPost:
    """A :class:`~..transport.PostTransport` that notes each POST (the start) in the log."""

    def __init__(self, inner: PostTransport, log: WireLog, rollout_id: str) -> None:
        self.inner, self.log, self.rollout_id = inner, log, rollout_id

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """The POST, noted."""
        call = self.inner.post(url, content, headers)
        return await _noted(self.log, self.rollout_id, "POST", url, content, call)

    async def aclose(self) -> None:
        """Nothing: the inner transport is the harness's to close."""


class _NotedCalls:
    """:class:`~.wire.ServerCalls` that note each call (status, cancel, result polls)."""

    def __init__(self, inner: ServerCalls, log: WireLog, rollout_id: str) -> None:
        self.inner, self.log, self.rollout_id = inner, log, rollout_id

    async def get(self, url: str, headers: Mapping[str, str]) -> Reply:
        """The GET, noted."""
        call = self.inner.get(url, headers)
        return await _noted(self.log, self.rollout_id, "GET", url, None, call)

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """The POST, noted."""
        call = self.inner.post(url, content, headers)
        return await _noted(self.log, self.rollout_id, "POST", url, content, call)


async def _noted(
    log: WireLog,
    rollout_id: str,
    method: str,
    url: str,
    content: bytes | None,
    call: Awaitable[Reply],
) -> Reply:
    """The answer of ``call``, noted with it; a failure in transit (or a cancel) is noted,
    then raised. Headers are never kept: they carry the server's key and the lease."""
    started = time.perf_counter()
    try:
        reply = await call
    except BaseException as exc:
        log.add(rollout_id, "server", started, method=method, url=url, body=content, failed=exc)
        raise
    log.add(rollout_id, "server", started, method=method, url=url, body=content, reply=reply)
    return reply


def trace_events(
    rollout_id: str,
    record: RolloutRecord | None,
    calls: list[WireCall],
    *,
    started: float,
    protocol: str,
    server: str,
    agent: str | None = None,
) -> list[dict[str, Any]]:
    """The trace records of one rollout from what crossed the wire (see the module docstring),
    in time order: ``rollout_start``, the calls, ``rollout_end``, then ``findings`` if any."""
    request = record.request if record is not None else None
    start: dict[str, Any] = {
        "event": "rollout_start",
        "rollout_id": rollout_id,
        "ts": round(started, 6),
        "side": SIDE,
        "protocol": protocol,
        "server": server,
        "agent": agent,
    }
    if record is not None and record.tools_known:
        start["tools"] = [t.name for t in record.tools]
    if request is not None:
        start.update(
            max_turns=request.max_turns,
            completion_params=request.completion_params,
            metadata=request.metadata,
        )
    events = [start]
    turns = _Turns()
    served_ms = 0.0
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    answered: int | None = None
    for call in sorted(calls, key=lambda c: c.ts):
        if call.kind == "chat":
            event = turns.event(call)
            served_ms += call.latency_ms
            for name in usage:
                usage[name] += int((event.get("usage") or {}).get(name) or 0)
        elif call.kind == "callback":
            event = {
                "event": "callback",
                "name": call.data.get("name"),
                "body": _model(call.data.get("body")),
            }
        else:
            event = _server_call(call)
            if answered is None and event["event"] == "start":
                answered = event.get("status_code")
        events.append(
            {**event, "rollout_id": rollout_id, "ts": call.ts, "latency_ms": call.latency_ms}
        )
    ended = time.time()
    measured = {
        "num_llm_calls": turns.number,
        "prompt_tokens": usage["prompt_tokens"],
        "response_tokens": usage["completion_tokens"],
        "llm_latency_ms": round(served_ms, 3),
        "total_latency_ms": round((ended - started) * 1000, 3),
    }
    events.append(_end(rollout_id, record, answered, turns.history, measured, ended))
    if record is not None and record.findings:
        findings = [f.as_dict() for f in record.findings]
        events.append({"event": "findings", "rollout_id": rollout_id, "findings": findings})
    return [_hidden(event) for event in events]


class _Turns:
    """Numbers the chat turns and writes each one's messages as a delta of the last one's
    history and reply, as an agent's own trace does (``docs/traces.md``)."""

    def __init__(self) -> None:
        self.number = 0
        #: The last turn's history and reply: what the next turn usually repeats.
        self.history: list[Message] = []
        self._tools: Any = None

    def event(self, call: WireCall) -> dict[str, Any]:
        self.number += 1
        body = call.data.get("request")
        assert isinstance(body, CompletionsRequest)
        history = list(body.messages)
        delta_from = _common_prefix(self.history, history)
        params = body.model_dump(
            mode="json", exclude_unset=True, exclude_none=True, exclude={"messages", "rollout_id"}
        )
        tools = call.data.get("tools", params.pop("tools", None))
        event: dict[str, Any] = {
            "event": "turn",
            "turn": self.number,
            "delta_from": delta_from,
            "messages": history[delta_from:],
            "params": params,
        }
        if isinstance(tools, list):
            event["tools"] = [_tool_name(t) for t in tools]
            if tools != self._tools:  # the schemas once, and again only when they change
                event["tool_schemas"] = tools
                self._tools = tools
        if call.data.get("stream"):
            event["stream"] = True
        reply = call.data.get("reply")
        self.history = history
        if isinstance(reply, CompletionsResponse):
            message = reply_message(reply.message)
            event["reply"] = message
            event["finish_reason"] = reply.choices[0].finish_reason
            event["usage"] = reply.usage.model_dump(mode="json")
            self.history = [*history, message]
        error = call.data.get("error")
        if error is not None:
            event["error"] = f"{type(error).__name__}: {error}"
        return event


def _end(
    rollout_id: str,
    record: RolloutRecord | None,
    answered: int | None,
    seen: list[Message],
    measured: dict[str, Any],
    ended: float,
) -> dict[str, Any]:
    """``rollout_end``: the result the server gave (its own metrics as ``server_metrics``),
    with the figures the mock measured as ``metrics``; NO_RESULT or REFUSED without one."""
    result = record.result if record is not None else None
    end: dict[str, Any] = {"event": "rollout_end", "rollout_id": rollout_id, "ts": ended}
    if result is None:
        refused = answered is not None and answered != 202
        end.update(
            status="REFUSED" if refused else "NO_RESULT",
            finish_reason=None,
            error_message=f"the start was answered HTTP {answered}"
            if refused
            else "no result reached the mock TrainGate",
            reward=None,
            metrics=measured,
        )
        return end
    final = list(result.final_messages)
    final_from = len(seen) if final[: len(seen)] == seen and seen else 0
    end.update(
        status=result.status.value,
        finish_reason=result.finish_reason,
        error_message=result.error_message,
        reward=result.reward,
        extra_fields=result.extra_fields,
        metrics=measured,
        server_metrics=result.metrics.model_dump(mode="json") if result.metrics else None,
        final_from=final_from,
        final_messages=final[final_from:],
    )
    return end


def _server_call(call: WireCall) -> dict[str, Any]:
    """A call the mock made, named by what its path asks (the start, status, cancel, a poll)."""
    url = str(call.data.get("url") or "")
    path = urlsplit(url).path
    event: dict[str, Any] = {
        "event": _CALL_NAMES.get(path.rstrip("/").rpartition("/")[2], "start"),
        "method": call.data.get("method"),
        "path": path,
    }
    body = call.data.get("body")
    if body:
        event["body"] = _payload(body)
    reply = call.data.get("reply")
    if isinstance(reply, Reply):
        event["status_code"] = reply.status_code
        event["answer"] = _payload(reply.content)
    failed = call.data.get("failed")
    if failed is not None:
        name = type(failed).__name__
        if "Cancel" in name:  # a long poll past its wait, or the run stopped
            event["error"] = "the mock stopped waiting for the answer"
        else:
            event["error"] = f"{name}: {failed}" if str(failed) else name
    return event


def _payload(content: bytes) -> Any:
    """A body as JSON when it is JSON, else its text (cut as a trace cuts text)."""
    try:
        return json.loads(content)
    except ValueError:
        text, full = clip_text(content.decode("utf-8", "replace"))
        return {"text": text, "chars": full} if full is not None else text


def _model(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json", exclude_none=True) if dump is not None else value


def _tool_name(tool: Any) -> Any:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def _common_prefix(previous: list[Message], current: list[Message]) -> int:
    """How many leading messages ``current`` repeats of ``previous`` exactly (what the view
    and ``Trajectory.messages()`` put back together, so nothing is rebuilt wrongly)."""
    count = 0
    for before, now in zip(previous, current, strict=False):
        if before != now:
            break
        count += 1
    return count


def _hidden(value: Any) -> Any:
    """``value`` with every field named like a secret written as ``**********``."""
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and _SECRET_FIELD.search(k) else _hidden(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_hidden(v) for v in value]
    return value
