"""__CLASS__: an agent written with the ``openai`` client, run as a rollout unchanged.

``ctx.openai_client()`` is an ``openai.AsyncOpenAI`` whose every call is one turn of this
rollout (in process, no socket): TrainGate's model answers, and the turn is checked, traced and
recorded like any other. Code you already have that takes a client works the same.
"""

from __future__ import annotations

from typing import Any

from osmosis_rollout import (
    OpenAIFunctionToolSchema,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
)
from osmosis_rollout.tools import Toolbox

from .reward import score
from .tools import add, divide, multiply, subtract


class __CLASS__(RolloutAgentLoop):
    """A multi-turn tool-calling agent on the openai client: reward 1.0 for a correct number."""

    name = "__PROJECT__"

    def __init__(self) -> None:
        # A slow or stuck tool becomes an error message for the model after 10 s.
        self.toolbox = Toolbox([add, subtract, multiply, divide], timeout_s=10.0)
        # The tools as the openai client sends them: the same list as get_tools declares.
        self.tools = [t.model_dump(mode="json", exclude_none=True) for t in self.toolbox.schemas]

    def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        client = ctx.openai_client()
        # The history only grows: TrainGate builds training samples from the exact turns sent.
        messages: list[dict[str, Any]] = list(ctx.request.messages)
        ground_truth = ctx.request.metadata.get("ground_truth")
        for _ in range(ctx.request.max_turns):
            # `model` is a name only: the policy being trained answers.
            completion = await client.chat.completions.create(
                model="policy", messages=messages, tools=self.tools
            )
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return ctx.complete(messages, reward=score(message.content, ground_truth))
            calls = [call.model_dump() for call in message.tool_calls]
            messages.extend(await self.toolbox.execute(ctx, calls))
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)
