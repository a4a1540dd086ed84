"""The seed document's CalculatorAgent, verbatim except for its imports."""

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult


class CalculatorAgent(RolloutAgentLoop):
    name = "calculator"

    def get_tools(self, request: RolloutRequest) -> list:
        return [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two numbers",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                        "required": ["a", "b"],
                    },
                },
            }
        ]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)

        # Iterative loop for multi-turn reasoning
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)

            if not result.has_tool_calls:
                break

            # Process tool calls (logic defined by implementer)
            for tc in result.tool_calls:
                # Execution logic here...
                ctx.record_tool_call(latency_ms=10.5)

        return ctx.complete(messages)
