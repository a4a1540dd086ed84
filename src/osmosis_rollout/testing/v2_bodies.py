"""The protocol v2 bodies as a controller reads and writes them: the start request it sends,
the completion and grader callbacks it receives, and the one neutral result they make.

The controller parses leniently (unknown keys are kept, as the spec says they are ignored),
but strictly where a controller depends on a value: the status enums, the id, the reward's
type. The two callbacks become one :class:`~osmosis_rollout.protocol.RolloutResponse`, so
that everything after the mock (rows, results files, cassettes, replay) reads one shape
whichever wire a rollout ran on.
"""

from __future__ import annotations

import math
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..protocol import RolloutMetrics, RolloutRequest, RolloutResponse, RolloutStatus

__all__ = [
    "CompletionCallback",
    "GraderCallback",
    "Sample",
    "rollout_path",
    "start_body",
    "v2_result",
]

#: The statuses each callback may carry (spec §11.3): anything else is answered with 422.
CompletionState = Literal["success", "failure", "cancelled"]
GraderState = Literal["success", "failure"]
#: Terminal values of ``GET /rollout/{id}/status``; in-flight ones are queued/running/grading.
TERMINAL_STATUSES = frozenset({"success", "failure", "cancelled"})
DISPOSITIONS = frozenset({"cancelled_queued", "cancelled_running", "not_found"})


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class CompletionCallback(_Body):
    """``POST .../completion``: the agent phase's verdict, no sample."""

    status: CompletionState
    rollout_id: str | None = None
    extra_fields: dict[str, Any] | None = None
    err_message: str | None = None
    err_category: str | None = None


class Sample(_Body):
    """The grader callback's sample: the conversation and its reward."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    label: str | None = None
    reward: float | None = None
    remove_sample: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)
    extra_fields: dict[str, Any] = Field(default_factory=dict)


class GraderCallback(_Body):
    """``POST .../grader``: the terminal event of a v2 rollout."""

    status: GraderState
    rollout_id: str | None = None
    sample: Sample | None = None
    err_message: str | None = None
    err_category: str | None = None


def rollout_path(rollout_id: str) -> str:
    """The mock's path prefix for one rollout: the id as one percent-encoded path segment."""
    return f"/v1/rollouts/{quote(rollout_id, safe='')}"


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
    id, two distinct keys. v2 has no sampling parameters: the controller applies them."""
    prefix = base_url.rstrip("/") + rollout_path(request.rollout_id)
    truth = request.metadata.get("ground_truth")
    label = None if truth is None else truth if isinstance(truth, str) else _label(truth)
    return {
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


def _label(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


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
    metrics = _metrics(sample.metrics) if sample is not None else None
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


def _metrics(data: dict[str, Any]) -> RolloutMetrics | None:
    try:
        return RolloutMetrics.model_validate(data)
    except ValidationError:
        return None
