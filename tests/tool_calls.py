"""Tool calls outside a rollout: a real ``RolloutContext`` to run them in, and call dicts."""

from __future__ import annotations

from typing import Any

from osmosis_rollout import RolloutContext
from osmosis_rollout.protocol import RolloutRequest


def make_request(rollout_id: str = "r-1") -> RolloutRequest:
    return RolloutRequest.model_validate(
        {
            "rollout_id": rollout_id,
            "server_url": "http://traingate.test",
            "messages": [{"role": "user", "content": "What is 3 + 4 and 2 * 5?"}],
            "completion_params": {"temperature": 0.7},
            "api_key": "tg-secret-key",
        }
    )


def make_ctx(events: list[dict[str, Any]] | None = None) -> RolloutContext:
    """A real context; tools never reach the LLM, so any object stands in for it."""
    trace = events.append if events is not None else None
    return RolloutContext(make_request(), [], object(), trace=trace)  # type: ignore[arg-type]


def call(name: str, arguments: Any = "{}", call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
