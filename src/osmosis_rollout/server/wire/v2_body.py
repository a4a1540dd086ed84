"""The rollout the core runs for a protocol v2 init (``docs/protocol-v2.md``).

The init's body is ``protocol.V2Init`` (one model for the server and the mock TrainGate; the
server reads it as ``V2InitReceived``: unknown fields ignored). ``V2Rollout`` is what the
scheduler, the registry and the agent see: a ``RolloutRequest`` (chat base URL as
``server_url``, the LLM key as ``api_key``) plus the v2 fields, so that a repeated id is "the
same body" exactly when all of them match (D6). The controller key is never on it (D15): it
goes to the rollout's target only.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import PrivateAttr

from ...protocol import PollingInitReceived, RolloutRequest, V2Init
from ...redaction import ApiKey

__all__ = ["V2Rollout"]


def start_fields(body: V2Init | PollingInitReceived) -> dict[str, Any]:
    """What a ``POST /rollout`` body (v2's or polling's) gives the rollout it starts, the same
    on both wires: the history, the chat URL and key, the label (also as ``ground_truth``), the
    timeouts and ``extra_fields``."""
    metadata = dict(body.metadata or {})
    if body.label is not None:
        metadata.setdefault("ground_truth", body.label)
    return {
        "server_url": body.chat_completions_url.rstrip("/"),
        "messages": body.initial_messages,
        "completion_params": {},
        "metadata": metadata,
        "api_key": ApiKey(body.llm_api_key) if body.llm_api_key is not None else None,
        "agent_timeout_sec": body.agent_timeout_sec,
        "grader_timeout_sec": body.grader_timeout_sec,
        "label": body.label,
        "extra_fields": body.extra_fields,
    }


class V2Rollout(RolloutRequest):
    """A v2 rollout as the core and the agent see it (see the module docstring)."""

    completion_callback_url: str = ""
    grader_callback_url: str | None = None
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    label: str | None = None
    extra_fields: dict[str, Any] | None = None
    #: False when the init sent no rollout_id and the server invented it (D5).
    id_given: bool = True
    _controller_key: str | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, body: V2Init) -> V2Rollout:
        """The rollout ``body`` asks for (already checked: built without validating again)."""
        rollout = cls.model_construct(
            **start_fields(body),
            rollout_id=body.rollout_id or uuid.uuid4().hex,
            completion_callback_url=body.completion_callback_url,
            grader_callback_url=body.grader_callback_url,
            id_given=body.rollout_id is not None,
        )
        rollout._controller_key = body.controller_api_key
        return rollout

    def called_urls(self) -> list[tuple[str, str]]:
        """Every URL the server will call for this rollout, by its field: the edge checks each
        against the destination policy (``destinations.py``), as v1's ``server_url``."""
        urls = [
            ("chat_completions_url", self.server_url),
            ("completion_callback_url", self.completion_callback_url),
        ]
        if self.grader_callback_url:
            urls.append(("grader_callback_url", self.grader_callback_url))
        return urls

    def take_controller_key(self) -> str | None:
        """The callback key, removed from the rollout (the agent is handed it next)."""
        key, self._controller_key = self._controller_key, None
        return key
