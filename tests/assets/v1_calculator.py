# ruff: noqa: UP006, UP035, I001
# The original SDK's "Basic Calculator Agent" example (docs/rollout/examples.md), as written;
# only the import line changed from ``osmosis_ai.rollout`` to ``osmosis_rollout.compat``.

import json
from typing import List

from osmosis_rollout.compat import (
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
    OpenAIFunctionToolSchema,
    OpenAIFunctionSchema,
    OpenAIFunctionParametersSchema,
    OpenAIFunctionPropertySchema,
    create_app,
)


class CalculatorAgent(RolloutAgentLoop):
    """Agent that can perform basic arithmetic."""

    name = "calculator"

    def get_tools(self, request: RolloutRequest) -> List[OpenAIFunctionToolSchema]:
        """Define the calculator tool."""
        return [
            OpenAIFunctionToolSchema(
                type="function",
                function=OpenAIFunctionSchema(
                    name="calculate",
                    description="Perform arithmetic calculation",
                    parameters=OpenAIFunctionParametersSchema(
                        properties={
                            "operation": OpenAIFunctionPropertySchema(
                                type="string",
                                description="The operation to perform",
                                enum=["add", "subtract", "multiply", "divide"],
                            ),
                            "a": OpenAIFunctionPropertySchema(
                                type="number",
                                description="First operand",
                            ),
                            "b": OpenAIFunctionPropertySchema(
                                type="number",
                                description="Second operand",
                            ),
                        },
                        required=["operation", "a", "b"],
                    ),
                ),
            ),
        ]

    def execute_tool(self, name: str, args: dict) -> str:
        """Execute a tool and return the result."""
        if name == "calculate":
            op = args["operation"]
            a, b = args["a"], args["b"]

            if op == "add":
                result = a + b
            elif op == "subtract":
                result = a - b
            elif op == "multiply":
                result = a * b
            elif op == "divide":
                if b == 0:
                    return "Error: Division by zero"
                result = a / b
            else:
                return f"Error: Unknown operation {op}"

            return str(result)

        return f"Error: Unknown tool {name}"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        """Execute the agent loop."""
        messages = list(ctx.request.messages)

        for turn in range(ctx.request.max_turns):
            # Call LLM
            result = await ctx.chat(
                messages,
                **ctx.request.completion_params,
            )
            messages.append(result.message)

            # Check if done
            if not result.has_tool_calls:
                return ctx.complete(messages)

            # Process tool calls
            for tool_call in result.tool_calls:
                tool_name = tool_call["function"]["name"]
                tool_args = json.loads(tool_call["function"]["arguments"])

                # Execute tool
                tool_result = self.execute_tool(tool_name, tool_args)
                ctx.record_tool_call()

                # Add tool result to messages
                messages.append(
                    {
                        "role": "tool",
                        "content": tool_result,
                        "tool_call_id": tool_call["id"],
                    }
                )

        return ctx.complete(messages, finish_reason="max_turns")


# Export instance for CLI usage
agent_loop = CalculatorAgent()

# Create FastAPI app
app = create_app(agent_loop)


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="0.0.0.0", port=9000)
