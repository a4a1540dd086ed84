"""Agents for the hardening tests: each puts the rollout's api_key where a careless agent might.

``ErrorsWithKey`` returns ``ctx.error`` quoting the key; ``ChatsOnce`` makes one LLM turn (whose
failure, echoing the key, becomes the error message) and logs the key in a trace event.
"""

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutResult


class ErrorsWithKey(RolloutAgentLoop):
    """Ends with ``ctx.error`` whose message contains the key, raw and in its repr."""

    name = "hrd-error-with-key"

    def get_tools(self, request: object) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        key = ctx.request.api_key_value
        return ctx.error(f"upstream refused key {key} (repr {key!r})")


class ChatsOnce(RolloutAgentLoop):
    """One chat turn, then complete; a failed turn ends the rollout with its error."""

    name = "hrd-chats-once"

    def get_tools(self, request: object) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        ctx.log_event("agent_note", note=f"using {ctx.request.api_key_value}")
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete([*ctx.request.messages, result.message], reward=1.0)


class Quick(RolloutAgentLoop):
    """Completes at once without an LLM turn: for fuzzing and shutdown scenarios."""

    name = "hrd-quick"

    def get_tools(self, request: object) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        return ctx.complete([*ctx.request.messages, {"role": "assistant", "content": "7"}])
