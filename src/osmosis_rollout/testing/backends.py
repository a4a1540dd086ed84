"""Offline LLM backends for the mock TrainGate: a deterministic mock, and scripted replies (a
real model's is :mod:`.openai_backend`).

Each implements :class:`~osmosis_rollout.testing.records.LLMBackend`: the mock TrainGate hands
them each chat request together with the rollout's record (the tools the server declared at init,
the previous requests and replies) and sends back whatever they return.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from ..errors import LLMBackendError, UnsatisfiableSchemaError
from ..protocol import (
    CompletionsRequest,
    CompletionsResponse,
    RolloutResponse,
)
from ._sampling.schema_instances import generate
from .mock_policy import check_policy, scripted_message, tool_plan
from .records import RolloutRecord, completion_from_message

__all__ = ["MockLLMBackend", "ScriptedBackend"]

_SUMMARY_CHARS = 120
_CHARS_PER_TOKEN = 4


class MockLLMBackend:
    """An offline, deterministic LLM that needs no key: it walks the agent's tools, then answers.

    ``policy`` says which tools each turn calls (:mod:`.mock_policy`): by default (``walk``)
    one per turn, each declared tool once, in a seeded order that leaves terminal-looking
    tools (``submit_answer``) for last; ``all`` calls every tool at once, ``tool_turns`` times.
    Each call's ``arguments`` are generated from the tool's ``parameters`` schema by
    :func:`~.schema_instances.generate`, seeded by ``seed`` and ``"<key>/<turn>/<tool index>"``,
    where the key is what :meth:`bind_rollout` gave (a row and sample) or else the rollout id:
    stable across runs and processes, different per row, sample, turn and tool.

    After that it gives a final text answer that quotes the latest tool results (``"add returned
    7"``) or, without any, the last user message, so rewards computed from the content have
    something to parse. ``usage``, ``token_ids``, ``logprobs`` and ``prompt_token_ids`` are
    filled with lengths that match the token counts. A reply longer than the request's
    ``max_tokens`` is cut to that many tokens with ``finish_reason`` ``"length"`` (a cut tool
    call becomes plain text, as a real model's would be unusable).
    """

    def __init__(self, seed: int = 0, tool_turns: int = 1, policy: str = "walk") -> None:
        self.seed = seed
        self.tool_turns = tool_turns
        self.policy = check_policy(policy)
        self._bound: dict[str, tuple[str, list[Any] | None]] = {}

    def bind_rollout(self, rollout_id: str, key: str, replies: list[Any] | None = None) -> None:
        """Seed ``rollout_id``'s replies by ``key`` (not the id, which holds a run's random
        part), and script them with ``replies`` (a row's ``mock_replies``), if given."""
        self._bound[rollout_id] = (key, replies)

    def rollout_completed(self, record: RolloutRecord, response: RolloutResponse) -> None:
        """The rollout is over: forget its binding."""
        self._bound.pop(record.rollout_id, None)

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        """Answer one turn of ``record``'s rollout."""
        turn = len(record.replies)
        key, replies = self._bound.get(record.rollout_id, (record.rollout_id, None))
        message: dict[str, Any]
        if replies is not None:
            if turn < len(replies):
                message = scripted_message(replies[turn], turn)
            else:
                message = {"content": _final_answer(request.messages)}
            return completion_from_message(request, message, turn=turn)
        tool_turns_made = sum(1 for reply in record.replies if reply.message.tool_calls)
        plan = tool_plan(self.policy, [t.name for t in record.tools], self.seed, key)
        if self.policy == "all":
            plan = plan * self.tool_turns
        if tool_turns_made < len(plan):
            calls = self._tool_calls(record, turn, key, plan[tool_turns_made])
            message = {"content": None, "tool_calls": calls}
        elif self.policy == "none":
            message = {"content": ""}
        else:
            message = {"content": _final_answer(request.messages)}
        reply = completion_from_message(request, message, turn=turn)
        limit = request.max_tokens
        if limit is None or reply.usage.completion_tokens <= limit:
            return reply
        if message.get("tool_calls"):
            shown = ", ".join(
                f"{c['function']['name']}({c['function']['arguments']})"
                for c in message["tool_calls"]
            )
            message = {"content": f"Calling {shown}"}
        text = str(message["content"])[: max(0, limit) * _CHARS_PER_TOKEN]
        return _cut(completion_from_message(request, {"content": text}, turn=turn), limit)

    def _tool_calls(
        self, record: RolloutRecord, turn: int, key: str, which: list[int]
    ) -> list[dict[str, Any]]:
        calls = []
        for number, index in enumerate(which):
            tool = record.tools[index]
            seeded = f"{key}/{turn}/{index}".encode()
            schema = tool.function.parameters
            if "type" not in schema:  # arguments are always an object, even for `{}`
                schema = {"type": "object", **schema}
            try:
                arguments = generate(schema, seed=self.seed + zlib.crc32(seeded))
            except UnsatisfiableSchemaError as exc:
                raise LLMBackendError(
                    f"the mock LLM cannot call tool {tool.name!r}: {exc}", kind="tool_schema"
                ) from None
            if not isinstance(arguments, dict):
                raise LLMBackendError(
                    f"the mock LLM cannot call tool {tool.name!r}: its parameters schema must "
                    'describe an object ({"type": "object", "properties": {...}})',
                    kind="tool_schema",
                )
            calls.append(
                {
                    "id": f"call_{turn + 1}_{number + 1}",
                    "type": "function",
                    "function": {"name": tool.name, "arguments": json.dumps(arguments)},
                }
            )
        return calls


class ScriptedBackend:
    """Replies with the given assistant messages in order, one per turn of each rollout.

    Each item is an assistant message dict (``{"content": ...}`` or ``{"tool_calls": [...]}``)
    or a full ``CompletionsResponse``. Past the end, it answers ``"done"``.
    """

    def __init__(self, replies: list[dict[str, Any] | CompletionsResponse]) -> None:
        self.replies = replies

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        turn = len(record.replies)
        item: dict[str, Any] | CompletionsResponse = (
            self.replies[turn] if turn < len(self.replies) else {"content": "done"}
        )
        if isinstance(item, CompletionsResponse):
            return item
        return completion_from_message(request, item, turn=turn)


def _final_answer(messages: list[dict[str, Any]]) -> str:
    """Quote the tool results that follow the last assistant message, or the last user turn."""
    results: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in reversed(messages):
        if message.get("role") == "tool":
            results.insert(0, message)
            continue
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict):
                    function = call.get("function") or {}
                    names[str(call.get("id"))] = str(function.get("name", "tool"))
        break
    if results:
        parts = [
            f"{names.get(str(m.get('tool_call_id')), 'tool')} returned {_text(m.get('content'))}"
            for m in results
        ]
        return f"Done. {'; '.join(parts)}."
    for message in reversed(messages):
        if message.get("role") == "user":
            return f"Answer to: {_text(message.get('content'))}"
    return "Done."


def _text(content: Any) -> str:
    if isinstance(content, list):  # multimodal parts: keep the text ones
        content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    text = " ".join(str(content if content is not None else "").split())
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 3] + "..."


def _cut(reply: CompletionsResponse, max_tokens: int) -> CompletionsResponse:
    """Cap a reply at ``max_tokens`` tokens, keeping usage and token lists consistent."""
    n = max(0, min(max_tokens, reply.usage.completion_tokens))
    usage = reply.usage.model_copy(
        update={"completion_tokens": n, "total_tokens": reply.usage.prompt_tokens + n}
    )
    choice = reply.choices[0].model_copy(update={"finish_reason": "length"})
    return reply.model_copy(
        update={
            "choices": [choice],
            "usage": usage,
            "token_ids": (reply.token_ids or [])[:n],
            "logprobs": (reply.logprobs or [])[:n],
        }
    )
