"""A good agent: one tool, a loop that appends, one result on every path."""

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


class GoodAgent(RolloutAgentLoop):
    name = "good"

    def get_tools(self, request: RolloutRequest) -> list[dict]:
        return [ADD]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                break
            for call in result.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "7"})
                ctx.record_tool_call(latency_ms=0.1)
        return ctx.complete(messages, reward=1.0)


good_instance = GoodAgent()
