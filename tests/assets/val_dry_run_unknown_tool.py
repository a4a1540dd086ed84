"""Broken at run time: the final conversation calls a tool that was never declared."""

from osmosis_rollout import RolloutAgentLoop

FAKE_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    ],
}


class InventedToolAgent(RolloutAgentLoop):
    name = "invented-tool"

    def get_tools(self, request):
        return []

    async def run(self, ctx):  # <- DRY_RUN_UNKNOWN_TOOL
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        return ctx.complete([*messages, result.message, FAKE_CALL])
