"""The polling wire's start body (``docs/protocol-polling.md``), and the rollout the core runs.

``POST /rollout``'s body as osmosis-ai 0.3.3+ sends it is ``protocol.PollingInit``, one model
for both sides (the mock TrainGate builds it); the server reads it as ``PollingInit`` here, the
protocol's received form (unknown fields ignored) plus the one refusal only a server makes.
``PollingRollout`` is what the scheduler and the agent see: a ``RolloutRequest`` plus the
polling fields, so a repeated id is "the same body" exactly when all of them match.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationInfo, model_validator
from pydantic_core import from_json

from ...protocol import PollingInitReceived, RolloutRequest
from .v2_body import start_fields

__all__ = ["V2_ONLY_FIELDS", "PollingInit", "PollingRollout", "is_v2_body"]

#: Top-level fields only a v2 init has: a body naming one of them is v2's, never polling's.
V2_ONLY_FIELDS = ("completion_callback_url", "grader_callback_url", "controller_api_key")
_V2_MARKS = tuple(f'"{name}"'.encode() for name in V2_ONLY_FIELDS)


def is_v2_body(body: bytes) -> bool:
    """Whether a ``POST /rollout`` body is a v2 init: a JSON object with a callback URL or the
    controller key as a top-level key (any value, null too: a v2 controller that sent a null
    URL gets v2's 422, not a polling rollout nobody polls). A body that is not a JSON object
    goes to v2's parser too (its 422 is as bounded as ours). Most bodies name none of the
    three anywhere, and are told apart by a substring search without parsing twice; the others
    are parsed with pydantic's parser, a third of ``json.loads``'s CPU (every v2 start pays it)."""
    if not any(mark in body for mark in _V2_MARKS):
        return False
    try:
        value = from_json(body)
    except ValueError:
        return True
    if not isinstance(value, dict):
        return True
    return any(name in value for name in V2_ONLY_FIELDS)


class PollingInit(PollingInitReceived):
    """``protocol.PollingInitReceived`` as this server reads it: under ``--workers`` without a
    shared state (the validation context's ``refuse``) every polling init is refused, a 422."""

    @model_validator(mode="before")
    @classmethod
    def _served(cls, value: Any, info: ValidationInfo) -> Any:
        refuse = info.context.get("refuse") if isinstance(info.context, dict) else None
        if refuse:
            raise ValueError(refuse)
        return value


class PollingRollout(RolloutRequest):
    """A polling rollout as the core and the agent see it (see the module docstring)."""

    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    label: str | None = None
    extra_fields: dict[str, Any] | None = None
    #: False: the controller asked for no grading (the agent's ``grade()`` is not run).
    grade: bool = True

    @classmethod
    def of(cls, body: PollingInit) -> PollingRollout:
        """The rollout ``body`` asks for (already checked: built without validating again)."""
        return cls.model_construct(
            **start_fields(body), rollout_id=body.rollout_id, grade=body.grade
        )

    def called_urls(self) -> list[tuple[str, str]]:
        """The one URL the server calls for this rollout (the edge checks it against the
        destination policy): its chat base URL. Results are read, never sent."""
        return [("chat_completions_url", self.server_url)]
