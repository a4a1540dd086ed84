"""Issue 28: v1 (osmosis-ai 0.2.x) samples, run with only their imports changed.

Each test is written the way a v1 user wrote it; where the issue asks, the completion callback
is compared field by field with what v1 sent (``V1_*`` below, written down from v1's client:
the reply dict as TrainGate sent it, ``content: null`` beside tool calls included).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from osmosis_rollout.compat import (
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
)
from osmosis_rollout.testing import Harness, ScriptedBackend

pytestmark = pytest.mark.anyio

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'},
}
QUESTION = [{"role": "user", "content": "3 + 4?"}]


class ContentReader(RolloutAgentLoop):
    """A v1 agent that reads ``msg["content"]`` on every reply, tool calls or not."""

    name = "content_reader"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two numbers",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                        "required": ["a", "b"],
                    },
                },
            }
        ]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages, **ctx.request.completion_params)
            msg = result.message
            messages.append(msg)
            if msg["content"] and not result.has_tool_calls:  # v1: the key is always there
                return ctx.complete(messages, reward=1.0)
            for call in result.tool_calls:
                args = json.loads(call["function"]["arguments"])
                ctx.record_tool_call()
                messages.append(
                    {
                        "role": "tool",
                        "content": str(args["a"] + args["b"]),
                        "tool_call_id": call["id"],
                    }
                )
        return ctx.complete(messages, finish_reason="max_turns")


#: What v1 sent as the completion callback of ContentReader's rollout (metrics aside).
V1_TOOL_CALL_CALLBACK = {
    "status": "COMPLETED",
    "finish_reason": "stop",
    "error_message": None,
    "reward": 1.0,
    "final_messages": [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "7", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "7"},
    ],
}


# -- item 1: result.message keeps "content": None ------------------------------------------------


async def test_a_tool_call_reply_keeps_content_none_as_v1_did() -> None:
    """``msg["content"]`` on a tool-call reply is None, not a KeyError: the rollout completes
    with v1's callback, and the next chat request carries the message as the agent kept it."""
    backend = ScriptedBackend([{"tool_calls": [CALL]}, {"content": "7"}])
    async with Harness(ContentReader(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, rollout_id="content-1")
    assert outcome.result is not None
    sent = outcome.result.model_dump(mode="json")
    for key, expected in V1_TOOL_CALL_CALLBACK.items():
        assert sent[key] == expected, key
    second_turn = outcome.record.chats[1].messages
    assert second_turn[1] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert outcome.findings == []
