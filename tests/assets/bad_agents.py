"""Agents that break the protocol on purpose, one way each, for the mock TrainGate's findings."""

from __future__ import annotations

import asyncio

from osmosis_rollout import (
    CompletionsRequest,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResponse,
    RolloutResult,
    RolloutStatus,
    TrainGateError,
)

ECHO_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Echo a text back.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
}


class _OneTurn(RolloutAgentLoop):
    """Base: one LLM turn, then complete."""

    name = "one-turn"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, object]]:
        return [ECHO_TOOL]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete(messages)


class GoodAgent(_OneTurn):
    """Follows the protocol."""

    name = "good"


class RewritesHistoryAgent(RolloutAgentLoop):
    """Replaces the user's message before the second turn."""

    name = "rewrites-history"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, object]]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        messages[-2] = {"role": "user", "content": "something else entirely"}
        messages.append({"role": "user", "content": "and?"})
        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete(messages)


class CompletesTwiceAgent(_OneTurn):
    """Posts its own completion callback, then lets the server send the real one."""

    name = "completes-twice"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await super().run(ctx)
        early = RolloutResponse(
            rollout_id=ctx.request.rollout_id,
            status=RolloutStatus.COMPLETED,
            final_messages=result.final_messages,
            finish_reason="stop",
        )
        channel = ctx.llm
        await channel.client.complete_rollout(  # type: ignore[attr-defined]
            channel.server_url,  # type: ignore[attr-defined]
            early,
            api_key=ctx.request.api_key_value,
        )
        return result


class WrongKeyAgent(_OneTurn):
    """Calls TrainGate once with a key of its own instead of the rollout's."""

    name = "wrong-key"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        channel = ctx.llm
        request = CompletionsRequest(rollout_id=ctx.request.rollout_id, messages=[])
        try:
            await channel.client.chat_completions(  # type: ignore[attr-defined]
                channel.server_url, request, api_key="not-the-key", request_id="x"
            )
        except TrainGateError:
            pass
        return await super().run(ctx)


class UnknownToolAgent(_OneTurn):
    """Ends with a call to a tool it never declared."""

    name = "unknown-tool"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await super().run(ctx)
        rogue = {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_rogue",
                    "type": "function",
                    "function": {"name": "delete_everything", "arguments": "{}"},
                }
            ],
        }
        return ctx.complete([*result.final_messages, rogue])


class SlowAgent(_OneTurn):
    """Takes longer than the row timeout the tests give it."""

    name = "slow"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        await asyncio.sleep(30)
        return await super().run(ctx)
