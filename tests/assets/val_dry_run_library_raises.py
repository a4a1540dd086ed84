"""Broken at run time: a library the agent calls raises, deep inside its own code."""

import json

import jsonschema

from osmosis_rollout import RolloutAgentLoop


class StdlibRaisesAgent(RolloutAgentLoop):
    """The stdlib raises (json/decoder.py): the problem is the agent's call."""

    name = "stdlib-raises"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        data = json.loads(result.message["content"] or "")  # <- STDLIB RAISES
        return ctx.complete([*messages, result.message], reward=float(data))


class LibraryRaisesAgent(RolloutAgentLoop):
    """An installed library raises (site-packages/jsonschema): the problem is the agent's call."""

    name = "library-raises"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        jsonschema.validate(result.message, {"type": "string"})  # <- LIBRARY RAISES
        return ctx.complete([*messages, result.message], reward=1.0)
