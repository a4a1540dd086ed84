"""Good agents written differently: a same-file base, async get_tools, tool models, try/except."""

import osmosis_rollout as osm
from osmosis_rollout import OpenAIFunctionSchema, OpenAIFunctionToolSchema


class Base(osm.RolloutAgentLoop):
    name = "variant"

    async def get_tools(self, request):
        return [
            OpenAIFunctionToolSchema(
                function=OpenAIFunctionSchema(
                    name="lookup",
                    description="Look a word up.",
                    parameters={"type": "object", "properties": {"word": {"type": "string"}}},
                )
            )
        ]


class VariantAgent(Base):
    async def run(self, ctx, *, verbose=False):
        messages = [*ctx.request.messages]
        try:
            reply = await ctx.chat(messages)
        except osm.TrainGateError as exc:
            return ctx.error(str(exc))
        messages = messages + [reply.message]  # noqa: RUF005 (append-only, on purpose)
        if reply.content:
            return ctx.complete(messages)
        return ctx.complete(messages, finish_reason="stop")
