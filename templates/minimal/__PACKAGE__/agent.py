"""__CLASS__: one model call per rollout, scored against the row's ``ground_truth``."""

from __future__ import annotations

from osmosis_rollout import (
    OpenAIFunctionToolSchema,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
)


def score(answer: str | None, ground_truth: object) -> float | None:
    """1.0 when the answer contains the ground truth (case and spacing ignored), else 0.0."""
    if ground_truth is None:
        return None
    expected = " ".join(str(ground_truth).split()).casefold()
    return 1.0 if expected in " ".join((answer or "").split()).casefold() else 0.0


class __CLASS__(RolloutAgentLoop):
    """Sends the row's messages to the model once and rewards a correct answer."""

    name = "__PROJECT__"

    def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
        return []  # no tools: the model answers directly

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        reward = score(result.content, ctx.request.metadata.get("ground_truth"))
        return ctx.complete(messages, reward=reward)
