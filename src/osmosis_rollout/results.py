"""What the agent API returns: ``RolloutResult`` (how ``run()`` ended) and ``CompletionsResult``
(one LLM reply, ready to append to the history)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .protocol import ChatMessage, CompletionsResponse, Message, RolloutMetrics, RolloutStatus


def reply_message(message: ChatMessage) -> Message:
    """The reply as the dict an agent appends: every key TrainGate sent, nulls included, and
    always ``content`` (None beside tool calls, as OpenAI and the legacy SDK had it), so the common
    ``msg["content"]`` never raises ``KeyError``. Unsent optional fields stay out."""
    sent = message.model_fields_set | set(message.model_extra or ())
    data = message.model_dump(mode="json")
    reply = {"role": data.pop("role"), "content": data.pop("content")}
    reply.update((key, value) for key, value in data.items() if value is not None or key in sent)
    return reply


def without_nulls(message: Message) -> Message:
    """``message`` without its ``None`` fields (the same dict when it has none), for a reader
    that wants them absent; the wires send messages as the agent kept them (docs/protocol.md)."""
    if any(value is None for value in message.values()):
        return {key: value for key, value in message.items() if value is not None}
    return message


__all__ = [
    "REWARD_COMPONENTS",
    "CompletionsResult",
    "RolloutResult",
    "reply_message",
    "result_extras",
    "without_nulls",
]

#: The ``extra_fields`` key that carries ``ctx.complete(reward_components=...)``.
REWARD_COMPONENTS = "reward_components"


def result_extras(
    extra_fields: Mapping[str, Any] | None, reward_components: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A result's ``extra_fields``, with the reward's components (name -> a finite number) under
    ``"reward_components"``; a component that is not one raises ``TypeError`` saying which."""
    extra = dict(extra_fields or {})
    if reward_components is None:
        return extra
    components: dict[str, float] = {}
    for name, value in reward_components.items():
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number):
            raise TypeError(f"reward_components[{name!r}] must be a finite number, got {value!r}")
        components[str(name)] = float(number)
    extra[REWARD_COMPONENTS] = components
    return extra


@dataclass
class RolloutResult:
    """How ``run()`` ended, as returned by ``ctx.complete(...)`` or ``ctx.error(...)``.

    The positional order is the legacy SDK's:
    ``(status, final_messages, finish_reason, error_message, metrics, reward)``. ``metrics`` is the
    context's snapshot when the result was made; the server sends the final metrics of the rollout.
    """

    status: RolloutStatus
    final_messages: list[Message]
    finish_reason: str | None = None
    error_message: str | None = None
    metrics: RolloutMetrics | None = None
    reward: float | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompletionsResult:
    """One LLM reply, ready to append: ``messages.append(result.message)``.

    Positional order as in the legacy SDK: ``(message, token_ids, logprobs, usage, finish_reason)``.
    """

    message: Message
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None

    @classmethod
    def from_response(cls, response: CompletionsResponse) -> CompletionsResult:
        """The first choice of a chat completion, as a dict message plus token data."""
        choice = response.choices[0]
        return cls(
            message=reply_message(choice.message),
            token_ids=response.token_ids,
            logprobs=response.logprobs,
            usage=response.usage.model_dump(),
            finish_reason=choice.finish_reason,
            prompt_token_ids=response.prompt_token_ids,
        )

    @property
    def content(self) -> str | None:
        """The assistant's text, or None when it only called tools."""
        content = self.message.get("content")
        return content if isinstance(content, str) else None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls as OpenAI dicts (``{"id", "type", "function": {name, arguments}}``)."""
        return list(self.message.get("tool_calls") or [])

    @property
    def has_tool_calls(self) -> bool:
        """True when the model asked for at least one tool call."""
        return bool(self.message.get("tool_calls"))
