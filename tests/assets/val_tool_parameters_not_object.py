"""Broken: parameters is an array schema."""

from osmosis_rollout import RolloutAgentLoop

TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add.",
        "parameters": {"type": "array", "items": {"type": "number"}},
    },
}


class ArrayParamsAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return [TOOL]

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
