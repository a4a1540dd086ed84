"""What an init's ``completion_params`` may hold: the sampling fields, and one for extensions.

``completion_params`` become fields of every chat request the server sends, so a hostile init
must not choose them freely (docs/security.md): the known sampling fields are typed, every
number anywhere must be finite, and what an engine needs beyond them goes in ``extra_body``,
whose keys are sent as top-level fields (``agent.RolloutContext`` merges them) but never over a
named field. ``protocol.RolloutRequest`` applies :func:`check_completion_params`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["EXTENSION_FIELD", "SamplingParams", "check_completion_params"]

#: The one ``completion_params`` field for what the others do not name: its keys are sent as
#: top-level fields of each chat request (like the OpenAI SDK's ``extra_body``).
EXTENSION_FIELD = "extra_body"
#: What ``extra_body`` may not set: the request's own fields, and ``stream`` (replies are read
#: whole).
_NOT_EXTENSIONS = frozenset({"messages", "rollout_id", "model", "tools", "stream", EXTENSION_FIELD})


class SamplingParams(BaseModel):
    """What an init's ``completion_params`` may hold: OpenAI's chat-completions sampling fields
    and vLLM's common ones, plus ``extra_body``. Unknown fields are refused (a hostile init
    must not choose the body of the server's requests); every number is finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: list[str] | None = Field(default=None, fail_fast=True)
    seed: int | None = None
    n: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    #: Accepted for compatibility and never sent: the agent's tools are TrainGate's already.
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    extra_body: dict[str, Any] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("extra_body")
    @classmethod
    def _check_extra_body(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in value or {}:
            if key in _NOT_EXTENSIONS or key in cls.model_fields:
                raise ValueError(
                    f"extra_body cannot set {shown_field(key)}: it is not an extension"
                )
        return value


def check_completion_params(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` if it holds only known sampling fields with finite numbers, else a
    ``ValueError`` naming the first field that is wrong."""
    try:
        SamplingParams.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False, include_context=False)[0]
        field = shown_field(str(first["loc"][0])) if first["loc"] else "a field"
        if first["type"] == "extra_forbidden":
            raise ValueError(
                f"{field} is not a known sampling field: send extensions inside "
                f"completion_params.{EXTENSION_FIELD} (docs/protocol.md)"
            ) from None
        loc = ".".join(_shown_part(part) for part in first["loc"])
        raise ValueError(f"{loc}: {first['msg']}" if loc else str(first["msg"])) from None
    if not _finite(value, 0):
        raise ValueError("completion_params holds NaN or an infinite number: send finite numbers")
    return value


#: A field name a 4xx may repeat: a short identifier, nothing a caller could smuggle text in.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def shown_field(name: str) -> str:
    """``name`` as an error message may show it: quoted when it is a short identifier, else
    only its length, so a 4xx never echoes what a caller wrote into a field name."""
    if _IDENTIFIER.fullmatch(name):
        return repr(name)
    return f"an unknown field of {len(name)} characters"


def _shown_part(part: int | str) -> str:
    """One step of an error's location: an index, a known field or a short identifier."""
    if isinstance(part, int) or _IDENTIFIER.fullmatch(part):
        return str(part)
    return "<field>"


def _finite(value: Any, depth: int) -> bool:
    """No NaN or infinity anywhere in ``value`` (bounded depth: deeper is refused too)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return depth < 32 and all(_finite(item, depth + 1) for item in value.values())
    if isinstance(value, list):
        return depth < 32 and all(_finite(item, depth + 1) for item in value)
    return True
