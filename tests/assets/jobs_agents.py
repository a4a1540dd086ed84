"""Agents for ``osmosis test --jobs``: deterministic under the mock LLM, and ones that die.

Each instance notes its process id in ``$JOBS_PIDS`` (when set), so a test can check that no
worker outlives the run. With ``$JOBS_FAIL_IN_WORKER`` set, this module imports in the command
but raises in a worker process, as an agent whose import depends on its environment would.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from osmosis_rollout import RolloutAgentLoop, RolloutRequest, RolloutResult, Toolbox

if TYPE_CHECKING:
    from osmosis_rollout import RolloutContext


def in_worker() -> bool:
    """Whether this runs in a ``--jobs`` worker process (not the command itself)."""
    return multiprocessing.parent_process() is not None


if os.environ.get("JOBS_FAIL_IN_WORKER") and in_worker():
    raise RuntimeError("this agent cannot be imported in a worker process")


def shout() -> str:
    """Say hello loudly (no arguments, so the mock LLM's call is the same in every run)."""
    return "HELLO"


class WordAgent(RolloutAgentLoop):
    """One tool turn, then a reward from the row's ``ground_truth``; ``fail`` rows raise."""

    name = "jobs_words"

    def __init__(self) -> None:
        self.toolbox = Toolbox([shout])
        pids = os.environ.get("JOBS_PIDS")
        if pids:
            Path(pids, str(os.getpid())).touch()

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        if ctx.request.metadata.get("fail"):
            raise RuntimeError("this row fails on purpose")
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                break
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
            await self.on_tool_turn(ctx)
        truth = str(ctx.request.metadata.get("ground_truth", ""))
        answer = str(messages[-1].get("content") or "")
        return ctx.complete(messages, reward=1.0 if truth and truth in answer else 0.0)

    async def on_tool_turn(self, ctx: RolloutContext) -> None:
        """A hook for the agents below."""


class DyingAgent(WordAgent):
    """Its worker process kills itself (SIGKILL) on a row whose prompt is ``die``."""

    async def on_tool_turn(self, ctx: RolloutContext) -> None:
        if ctx.request.messages[-1]["content"] == "die" and in_worker():
            os.kill(os.getpid(), signal.SIGKILL)


class SlowAgent(WordAgent):
    """Rows whose prompt is ``slow`` take a minute; the test interrupts the run meanwhile."""

    async def on_tool_turn(self, ctx: RolloutContext) -> None:
        if ctx.request.messages[-1]["content"] == "slow":
            await anyio.sleep(60)


class FileAgent(RolloutAgentLoop):
    """Keeps a buffered file open in each process (``$JOBS_LOG_DIR/<pid>.log``), never closed;
    its toolbox holds one of its own methods, so only a garbage collection finalizes it (and
    flushes the file)."""

    name = "file-agent"

    def __init__(self) -> None:
        path = Path(os.environ["JOBS_LOG_DIR"]) / f"{os.getpid()}.log"
        self.log = path.open("w")  # open for the agent's life, on purpose
        self.toolbox = Toolbox([self.note])

    def note(self, text: str) -> str:
        """Note a text."""
        return text

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        self.log.write(f"ran {ctx.request.rollout_id}\n")
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete([*ctx.request.messages, result.message])
