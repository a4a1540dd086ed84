"""Agents for the review regressions: odd values in messages, slow or cancelled get_tools."""

from __future__ import annotations

import anyio

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult


class Opaque:
    """Not JSON: an object an agent might put into a message by mistake."""

    def __repr__(self) -> str:
        return "<Opaque>"


class OpaqueMessageAgent(RolloutAgentLoop):
    """Puts a non-JSON object into its history before the first turn."""

    name = "opaque"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, object]]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = [*ctx.request.messages, {"role": "user", "content": Opaque()}]
        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete(messages)


class OpaqueResultAgent(OpaqueMessageAgent):
    """Chats normally, then completes with a non-JSON object in its final messages."""

    name = "opaque-result"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete([*messages, {"role": "user", "content": Opaque()}])


class SlowToolsAgent(OpaqueMessageAgent):
    """Its get_tools never returns in time."""

    name = "slow-tools"

    async def get_tools(self, request: RolloutRequest) -> list[dict[str, object]]:  # type: ignore[override]
        await anyio.sleep(30)
        return []
