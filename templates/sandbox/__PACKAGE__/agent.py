"""__CLASS__: the model writes Python, a bubblewrap sandbox runs it, the model answers.

Each dataset row becomes one rollout: its messages start the conversation and its
``ground_truth`` (in ``ctx.request.metadata``) scores the final answer.
"""

from __future__ import annotations

from osmosis_rollout import (
    OpenAIFunctionToolSchema,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
)
from osmosis_rollout.tools import Toolbox

from .reward import score
from .sandbox import Limits, run_python


class __CLASS__(RolloutAgentLoop):
    """A code-running agent: the reward is 1.0 for a correct final number."""

    name = "__PROJECT__"

    #: Seconds one piece of code may run, and characters of its output the model sees.
    code_timeout_s = 5.0
    max_output_chars = 4000
    #: Memory, CPU seconds, file size and open files of one run (the sandbox: sandbox.py).
    sandbox_limits = Limits()

    def __init__(self) -> None:
        self.toolbox = Toolbox([self.run_python])

    async def run_python(self, code: str) -> str:
        """Run a Python program and return what it printed (stdout and stderr).

        Args:
            code: A complete Python program; print the values you need.
        """
        result = await run_python(
            code,
            timeout_s=self.code_timeout_s,
            max_output_chars=self.max_output_chars,
            limits=self.sandbox_limits,
        )
        return result.for_model()

    def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        # The history only grows: TrainGate builds training samples from the exact turns sent.
        messages = list(ctx.request.messages)
        ground_truth = ctx.request.metadata.get("ground_truth")
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages, reward=score(result.content, ground_truth))
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)
