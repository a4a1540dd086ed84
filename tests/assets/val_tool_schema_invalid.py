"""Broken: parameters is not a valid JSON Schema (a misspelt type)."""

from osmosis_rollout import RolloutAgentLoop

TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add.",
        "parameters": {"type": "object", "properties": {"a": {"type": "numbr"}}},
    },
}


class BadSchemaAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return [TOOL]

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
