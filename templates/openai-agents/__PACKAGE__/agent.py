"""__CLASS__: an OpenAI Agents SDK agent, run as a rollout unchanged.

The SDK's ``OpenAIChatCompletionsModel`` is given ``ctx.openai_client()``, an
``openai.AsyncOpenAI`` whose every call is one turn of this rollout (in process, no socket):
TrainGate's model answers, and each turn is checked, traced and recorded like a ``ctx.chat``
turn. The SDK runs the tools; ``get_tools`` declares the same schemas the SDK sends.
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
)
from agents.exceptions import MaxTurnsExceeded
from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult

from .reward import score
from .tools import add, divide, multiply, subtract

TOOLS: list[FunctionTool] = [function_tool(f) for f in (add, subtract, multiply, divide)]


class __CLASS__(RolloutAgentLoop):
    """A tool-calling Agents SDK agent: the reward is 1.0 for a correct final number."""

    name = "__PROJECT__"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        # The schemas the SDK sends each call, so TrainGate trains on the tools the model saw.
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.params_json_schema,
                },
            }
            for tool in TOOLS
        ]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        # `model` is a name only: the policy being trained answers.
        model = OpenAIChatCompletionsModel(model="policy", openai_client=ctx.openai_client())
        agent = Agent(name=self.name, model=model, tools=list(TOOLS))
        # No traces leave the machine: osmosis-rollout traces each turn itself (--debug-dir).
        config = RunConfig(tracing_disabled=True)
        ground_truth = ctx.request.metadata.get("ground_truth")
        try:
            result = await Runner.run(
                agent,
                list(ctx.request.messages),
                max_turns=ctx.request.max_turns,
                run_config=config,
            )
        except MaxTurnsExceeded:
            return ctx.complete(ctx.partial_messages, finish_reason="max_turns", reward=0.0)
        # The conversation as TrainGate saw it: the last history sent and its reply.
        answer = result.final_output if isinstance(result.final_output, str) else None
        return ctx.complete(ctx.partial_messages, reward=score(answer, ground_truth))
