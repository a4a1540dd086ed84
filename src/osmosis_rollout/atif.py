"""ATIF trajectories: one rollout as an Agent Trajectory Interchange Format document, and back.

ATIF (the Harbor project's RFC 0001) is what the Osmosis platform's runner reads after every
rollout, from ``<artifact_root>/<rollout_id>/trajectory.json``; its uploads are built from those
files. We write ``ATIF-v1.7``, the newest version the platform's runner validates (osmosis-ai
0.3.8 checks documents against its own v1.7 models, strictly); the ``atif`` package's models
accept it too. The writer is plain JSON, checked by the tests against those models: serving a
rollout never imports a schema package or validates a document it built itself.

The document is built from what a rollout leaves behind (the final conversation, each LLM
turn's reply with its usage, token ids and logprobs, the result and its metrics): in the server
(``server/trajectories.py``) and from the mock TrainGate's record (``osmosis test
--trajectories``). :func:`read_atif` turns any ATIF document, ours or not, into the trace
reader's :class:`~osmosis_rollout.trajectory.Trajectory`, which ``osmosis view`` shows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ._version import __version__
from .protocol import (
    CompletionsResponse,
    Message,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
    wire,
)
from .redaction import REDACTED, scrub
from .tracing import is_secret_key
from .trajectory import ToolCallTrace, Trajectory, TurnTrace

__all__ = [
    "ATIF_VERSION",
    "PRODUCER",
    "TurnRecord",
    "build_trajectory",
    "encode_trajectory",
    "is_atif",
    "read_atif",
    "rollout_secrets",
]

#: The ATIF version written (the platform's runner reads ``ATIF-v1.0`` .. ``ATIF-v1.7``).
ATIF_VERSION = "ATIF-v1.7"
#: ``extra.osmosis.producer``: which toolkit wrote the document.
PRODUCER = "osmosis-rollout"

_SOURCES = {"system": "system", "developer": "system", "user": "user", "assistant": "agent"}
#: Arrays of numbers we wrote ourselves (checked ints, finite floats): never looked into again,
#: since a long rollout holds hundreds of thousands of them.
_NUMBER_ARRAYS = frozenset({"prompt_token_ids", "completion_token_ids", "logprobs"})


@dataclass(frozen=True)
class TurnRecord:
    """One LLM turn as TrainGate answered it: the reply and what the trainer needs of it."""

    reply: Message
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    #: When the reply arrived (Unix seconds), if known.
    at: float | None = None

    @classmethod
    def from_response(cls, response: CompletionsResponse, at: float | None = None) -> TurnRecord:
        """The turn ``response`` answered (``at``: when; else the reply's ``created``, if set)."""
        choice = response.choices[0]
        return cls(
            reply=choice.message.model_dump(mode="json", exclude_none=True),
            model=response.model or None,
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens,
            token_ids=response.token_ids,
            logprobs=response.logprobs,
            prompt_token_ids=response.prompt_token_ids,
            finish_reason=choice.finish_reason,
            at=at if at is not None else (float(response.created) if response.created else None),
        )


def rollout_secrets(request: RolloutRequest | None) -> list[str]:
    """The secrets a rollout's document must never hold: its TrainGate key and, on protocol
    v2, the controller's callback key."""
    if request is None:
        return []
    found = [request.api_key_value, getattr(request, "_controller_key", None)]
    return [s for s in found if isinstance(s, str) and s]


def build_trajectory(
    result: RolloutResponse,
    turns: Sequence[TurnRecord] = (),
    *,
    request: RolloutRequest | None = None,
    agent_name: str = "agent",
    tools: Sequence[OpenAIFunctionToolSchema] = (),
    findings: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The ATIF document of one finished rollout, as JSON-ready data.

    Steps follow the final conversation (``result.final_messages``, else the request's
    messages): system and user messages are their own steps, each assistant message an agent
    step with its tool calls, and the tool results after it that step's observation. The turn
    that produced an assistant message (matched in order, by content and tool calls) gives it
    ``metrics`` (token counts, token ids, logprobs) and ``model_name``. Non-finite numbers
    become null: the platform refuses a document with NaN.
    """
    messages = list(result.final_messages) or (list(request.messages) if request else [])
    steps, placed = _steps(messages, list(turns))
    if not steps:  # ATIF wants at least one step; a rollout that never got a message has none
        steps = [{"step_id": 1, "source": "system", "message": "", "extra": {"empty": True}}]
    rollout_id = result.rollout_id
    model = next((t.model for t in turns if t.model), None)
    agent: dict[str, Any] = {"name": agent_name, "version": __version__}
    if model:
        agent["model_name"] = model
    if tools:
        agent["tool_definitions"] = [wire(tool) for tool in tools]
    osmosis: dict[str, Any] = {
        "producer": PRODUCER,
        "rollout_id": rollout_id,
        "status": result.status.value,
        "finish_reason": result.finish_reason,
        "error_message": result.error_message,
        "reward": result.reward,
        "extra_fields": result.extra_fields or None,
        "metrics": result.metrics.model_dump() if result.metrics is not None else None,
        "unplaced_turns": len(turns) - placed or None,
        "findings": [dict(f) for f in findings] or None,
    }
    if request is not None:
        osmosis["label"] = getattr(request, "label", None)
        osmosis["request_metadata"] = request.metadata or None
        osmosis["request_extra_fields"] = getattr(request, "extra_fields", None)
    document: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": rollout_id,
        "trajectory_id": rollout_id,
        "agent": agent,
        "steps": steps,
        "final_metrics": _final_metrics(steps, turns, result),
        "extra": {"osmosis": {k: v for k, v in osmosis.items() if v is not None}},
    }
    finite: dict[str, Any] = _finite(document)
    return finite


def encode_trajectory(document: Mapping[str, Any], secrets: Iterable[str] = ()) -> bytes:
    """``document`` as the bytes of ``trajectory.json``: indented, numeric arrays (token ids,
    logprobs) on one line each, secrets removed (by key name and by value, as in traces)."""
    text = _pretty(document, "")
    for secret in secrets:  # scrub() also knows each secret's JSON-escaped forms
        if secret:
            text = scrub(text, secret)
    return (text + "\n").encode("utf-8")


def is_atif(document: object) -> bool:
    """Whether ``document`` (parsed JSON) is an ATIF trajectory: a ``schema_version`` of
    ``ATIF-v...`` and a list of ``steps``."""
    if not isinstance(document, dict):
        return False
    version = document.get("schema_version")
    return (
        isinstance(version, str)
        and version.startswith("ATIF-")
        and isinstance(document.get("steps"), list)
    )


# -- building -------------------------------------------------------------------------------


def _steps(messages: list[Any], turns: list[TurnRecord]) -> tuple[list[dict[str, Any]], int]:
    """The steps of ``messages``, and how many of ``turns`` found their message."""
    steps: list[dict[str, Any]] = []
    next_turn = 0
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role") or "")
        if role in ("tool", "function"):
            _observe(steps, message)
            continue
        source = _SOURCES.get(role, "user")
        step: dict[str, Any] = {
            "step_id": len(steps) + 1,
            "source": source,
            "message": _text(message.get("content")),
        }
        extra: dict[str, Any] = {}
        if role not in _SOURCES:
            extra["role"] = role
        calls = _tool_calls(message.get("tool_calls"))
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if source == "agent":
            if calls:
                step["tool_calls"] = calls
            if isinstance(reasoning, str) and reasoning:
                step["reasoning_content"] = reasoning
            found = _find_turn(message, turns, next_turn)
            if found is not None:
                next_turn = found + 1
                _add_turn(step, turns[found])
        else:  # ATIF allows tool calls and reasoning on agent steps only: kept aside
            if calls:
                extra["tool_calls"] = calls
            if isinstance(reasoning, str) and reasoning:
                extra["reasoning_content"] = reasoning
        if extra:
            step["extra"] = extra
        steps.append(step)
    placed = sum(1 for s in steps if s.get("llm_call_count") == 1)
    return steps, placed


def _find_turn(message: Mapping[str, Any], turns: list[TurnRecord], start: int) -> int | None:
    """The first turn from ``start`` whose reply is ``message`` (same text and tool calls)."""
    text = _text(message.get("content"))
    calls = _call_keys(message.get("tool_calls"))
    for index in range(start, len(turns)):
        reply = turns[index].reply
        if _text(reply.get("content")) == text and _call_keys(reply.get("tool_calls")) == calls:
            return index
    return None


def _call_keys(raw: Any) -> list[tuple[str, str]]:
    if not isinstance(raw, list):
        return []
    keys = []
    for call in raw:
        if isinstance(call, Mapping):
            function = call.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
            keys.append((str(call.get("id") or ""), str(name or "")))
    return keys


def _add_turn(step: dict[str, Any], turn: TurnRecord) -> None:
    metrics: dict[str, Any] = {}
    if turn.prompt_tokens is not None:
        metrics["prompt_tokens"] = turn.prompt_tokens
    if turn.completion_tokens is not None:
        metrics["completion_tokens"] = turn.completion_tokens
    if turn.prompt_token_ids is not None:
        metrics["prompt_token_ids"] = turn.prompt_token_ids
    if turn.token_ids is not None:
        metrics["completion_token_ids"] = turn.token_ids
    if turn.logprobs is not None:
        if all(math.isfinite(x) for x in turn.logprobs):
            metrics["logprobs"] = turn.logprobs
        else:  # JSON has no -inf: the list is left out rather than made up
            metrics["extra"] = {"logprobs_dropped": "not all finite"}
    if turn.finish_reason is not None:
        metrics.setdefault("extra", {})["finish_reason"] = turn.finish_reason
    if turn.model:
        step["model_name"] = turn.model
    if turn.at is not None and math.isfinite(turn.at) and turn.at > 0:
        step["timestamp"] = _iso(turn.at)
    if metrics:
        step["metrics"] = metrics
    step["llm_call_count"] = 1


def _observe(steps: list[dict[str, Any]], message: Mapping[str, Any]) -> None:
    """A tool message becomes a result in the observation of the agent step before it."""
    call_id = message.get("tool_call_id")
    owner = steps[-1] if steps and steps[-1]["source"] == "agent" else None
    known = {c["tool_call_id"] for c in owner.get("tool_calls", [])} if owner else set()
    result: dict[str, Any] = {"content": _text(message.get("content"))}
    if isinstance(call_id, str) and call_id in known:
        result["source_call_id"] = call_id
    elif call_id is not None:  # answers no call of that step: kept, unlinked
        result["extra"] = {"tool_call_id": str(call_id)}
    if owner is None:
        owner = {"step_id": len(steps) + 1, "source": "system", "message": ""}
        owner["extra"] = {"role": str(message.get("role") or "tool")}
        steps.append(owner)
    owner.setdefault("observation", {"results": []})["results"].append(result)


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        return []
    calls: list[dict[str, Any]] = []
    for number, call in enumerate(raw):
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        arguments = function.get("arguments")
        entry: dict[str, Any] = {
            "tool_call_id": str(call.get("id") or f"call_{number}"),
            "function_name": str(function.get("name") or ""),
            "arguments": {},
        }
        parsed: Any = arguments
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                parsed = None
        if isinstance(parsed, dict):
            entry["arguments"] = parsed
        elif arguments is not None:  # not a JSON object: ATIF wants one, the text is kept
            entry["extra"] = {"arguments": arguments}
        calls.append(entry)
    return calls


def _text(content: Any) -> str:
    """A message's content as text: text parts joined, other parts as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" for p in content
    ):
        return "".join(str(p.get("text") or "") for p in content)
    return json.dumps(content, ensure_ascii=False, default=str)


def _final_metrics(
    steps: list[dict[str, Any]], turns: Sequence[TurnRecord], result: RolloutResponse
) -> dict[str, Any]:
    metrics = result.metrics
    prompt = [t.prompt_tokens for t in turns if t.prompt_tokens is not None]
    completion = [t.completion_tokens for t in turns if t.completion_tokens is not None]
    final: dict[str, Any] = {"total_steps": len(steps)}
    if prompt:
        final["total_prompt_tokens"] = sum(prompt)
    if completion:
        final["total_completion_tokens"] = sum(completion)
    extra: dict[str, Any] = {"reward": result.reward}
    if metrics is not None:
        final.setdefault("total_prompt_tokens", metrics.prompt_tokens)
        final.setdefault("total_completion_tokens", metrics.response_tokens)
        extra["num_llm_calls"] = metrics.num_llm_calls
        extra["num_tool_calls"] = metrics.num_tool_calls
        extra["total_latency_ms"] = metrics.total_latency_ms
    final["extra"] = extra
    return final


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (a tool call's arguments may hold
    a NaN: Python's JSON reader accepts one)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: v if k in _NUMBER_ARRAYS else _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _pretty(value: Any, indent: str) -> str:
    """JSON indented by two spaces, except arrays of plain values (token ids, logprobs, a
    schema's ``required``), which stay on one line; what sits under a secret-looking key (as
    in traces: ``api_key``, ``password``, ``token``...) is written as ``**********``."""
    inner = indent + "  "
    if isinstance(value, Mapping) and value:
        items = [f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {_member(k, v, inner)}"
                 for k, v in value.items()]  # fmt: skip
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and value:
        if all(v is None or isinstance(v, str | int | float) for v in value):
            return _flat(value)
        return "[\n" + ",\n".join(inner + _pretty(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False, default=str)


def _member(key: Any, value: Any, indent: str) -> str:
    if key in _NUMBER_ARRAYS and isinstance(value, list):
        return _flat(value)
    if is_secret_key(key):
        return json.dumps(REDACTED)
    return _pretty(value, indent)


def _flat(values: list[Any]) -> str:
    return json.dumps(values, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


# -- reading (osmosis view) ------------------------------------------------------------------


def read_atif(document: Mapping[str, Any]) -> Trajectory:
    """Any ATIF document as the trace reader's :class:`Trajectory`: each agent step one turn
    (its reply, tool calls with their observed results, token counts), the steps between
    turns the messages they added, ``extra.osmosis`` (when we wrote it) the rollout's end."""
    steps = [s for s in _list(document.get("steps")) if isinstance(s, Mapping)]
    osmosis = _osmosis_extra(document)
    rollout_id = osmosis.get("rollout_id") or document.get("session_id")
    trajectory = Trajectory(rollout_id=str(rollout_id) if rollout_id is not None else None)
    agent = document.get("agent")
    agent_name = agent.get("name") if isinstance(agent, Mapping) else None
    trajectory.start = {"event": "rollout_start", "agent": agent_name}
    history: list[Message] = []
    pending: list[Message] = []
    first_ts: float | None = None
    for step in steps:
        source = step.get("source")
        ts = _seconds(step.get("timestamp"))
        first_ts = first_ts if first_ts is not None or ts is None else ts
        if source != "agent":
            role = "system" if source == "system" else "user"
            if step.get("message") not in (None, "") or not step.get("observation"):
                pending.append({"role": role, "content": _read_text(step.get("message"))})
            pending.extend(_observed(step))
            continue
        reply = _reply(step)
        raw = step.get("metrics")
        metrics: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        usage = {
            k: metrics[k]
            for k in ("prompt_tokens", "completion_tokens")
            if isinstance(metrics.get(k), int)
        }
        turn = TurnTrace(
            number=len(trajectory.turns) + 1,
            new_messages=pending,
            delta_from=len(history),
            reply=reply,
            usage=usage,
            ts=ts,
        )
        extra = metrics.get("extra")
        if isinstance(extra, Mapping) and isinstance(extra.get("finish_reason"), str):
            turn.finish_reason = extra["finish_reason"]
        results = {
            r.get("source_call_id"): r
            for r in _results(step)
            if isinstance(r.get("source_call_id"), str)
        }
        for call in reply.get("tool_calls", []):
            observed = results.get(call["id"])
            turn.tool_calls.append(
                ToolCallTrace(
                    turn=turn.number,
                    tool=call["function"]["name"],
                    tool_call_id=call["id"],
                    arguments=call["function"]["arguments"],
                    result=_read_text(observed.get("content")) if observed else None,
                )
            )
        trajectory.turns.append(turn)
        history = [*history, *pending, reply]
        pending = _observed(step)
    trajectory.start["ts"] = first_ts
    end: dict[str, Any] = {"event": "rollout_end", "final_from": len(history)}
    end["final_messages"] = pending
    for key in ("status", "finish_reason", "error_message", "reward", "metrics"):
        if key in osmosis:
            end[key] = osmosis[key]
    trajectory.end = end
    trajectory.findings = [f for f in _list(osmosis.get("findings")) if isinstance(f, dict)]
    return trajectory


def _list(value: Any) -> list[Any]:
    """``value`` if it is a JSON array, else an empty one (a foreign file may hold anything)."""
    return value if isinstance(value, list) else []


def _osmosis_extra(document: Mapping[str, Any]) -> dict[str, Any]:
    extra = document.get("extra")
    osmosis = extra.get("osmosis") if isinstance(extra, Mapping) else None
    return dict(osmosis) if isinstance(osmosis, Mapping) else {}


def _results(step: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    observation = step.get("observation")
    results = observation.get("results") if isinstance(observation, Mapping) else None
    return [r for r in _list(results) if isinstance(r, Mapping)]


def _observed(step: Mapping[str, Any]) -> list[Message]:
    """A step's observation as tool messages (a result of no tool call has no id)."""
    messages: list[Message] = []
    for result in _results(step):
        message: Message = {"role": "tool", "content": _read_text(result.get("content"))}
        if isinstance(result.get("source_call_id"), str):
            message["tool_call_id"] = result["source_call_id"]
        messages.append(message)
    return messages


def _reply(step: Mapping[str, Any]) -> Message:
    reply: Message = {"role": "assistant", "content": _read_text(step.get("message"))}
    calls = []
    for number, call in enumerate(_list(step.get("tool_calls"))):
        if not isinstance(call, Mapping):
            continue
        arguments = call.get("arguments")
        calls.append(
            {
                "id": str(call.get("tool_call_id") or f"call_{number}"),
                "type": "function",
                "function": {
                    "name": str(call.get("function_name") or "?"),
                    "arguments": json.dumps(arguments, ensure_ascii=False, default=str),
                },
            }
        )
    if calls:
        reply["tool_calls"] = calls
    if isinstance(step.get("reasoning_content"), str):
        reply["reasoning_content"] = step["reasoning_content"]
    return reply


def _read_text(content: Any) -> str:
    """ATIF content (text, or v1.6+ parts: text, image, audio) as text to show."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if part.get("type") == "text":
                parts.append(str(part.get("text") or ""))
            else:
                source = part.get("source")
                path = source.get("path") if isinstance(source, Mapping) else None
                parts.append(f"[{part.get('type')}: {path}]")
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def _seconds(timestamp: Any) -> float | None:
    if not isinstance(timestamp, str):
        return None
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
