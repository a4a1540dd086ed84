"""Broken: a schema default that JSON cannot encode (a set)."""

from osmosis_rollout import RolloutAgentLoop

TOOL = {
    "type": "function",
    "function": {
        "name": "pick",
        "description": "Pick.",
        "parameters": {"type": "object", "properties": {"k": {"default": {1, 2}}}},
    },
}


class SetDefaultAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return [TOOL]

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
