"""Agents for the server tests, in-process and served by ``osmosis serve`` in a subprocess.

``ToolAgent`` is driven by the init's ``metadata`` so one served agent covers every scenario:
``sleep_s`` (wait before the first turn, to be in flight at SIGTERM), ``raise_after_tools``
and ``hang_after_tools`` (fail or hang after the first tool turn), ``no_chat`` (finish at once;
with ``report_loop`` the answer names the event loop's module: ``uvloop`` or ``asyncio...``).
"""

import asyncio
import json

import anyio

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "number"},
                "b": {"type": "number"},
                "mode": {"anyOf": [{"enum": [1, 2]}, {"type": "null"}], "default": None},
                "tags": {"type": "array", "items": {"type": "string", "minLength": 1}},
            },
            "required": ["a", "b"],
        },
    },
}
#: A tool without a description: the init response must not carry ``"description": null``.
NOTE_TOOL = {"type": "function", "function": {"name": "note"}}


class ToolAgent(RolloutAgentLoop):
    """Calls the LLM until it stops asking for tools, answering each ``add`` call itself."""

    name = "srv-tools"

    def get_tools(self, request: RolloutRequest) -> list:
        return [ADD_TOOL, NOTE_TOOL]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        meta = ctx.request.metadata
        messages = list(ctx.request.messages)
        if meta.get("sleep_s"):
            await anyio.sleep(float(meta["sleep_s"]))
        if meta.get("no_chat"):
            answer = "nothing to ask"
            if meta.get("report_loop"):
                answer = type(asyncio.get_running_loop()).__module__
            messages.append({"role": "assistant", "content": answer})
            return ctx.complete(messages, reward=0.5)
        for turn in range(ctx.request.max_turns):
            params = {"temperature": 0.2} if turn == 1 else {}  # a per-call override
            result = await ctx.chat(messages, **params)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages, reward=1.0)
            for call in result.tool_calls:
                args = json.loads(call["function"]["arguments"])
                total = args["a"] + args["b"]
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(total)})
                ctx.record_tool_call(latency_ms=1.5)
                ctx.log_event("tool_result", name="add", result=total)
            if meta.get("raise_after_tools"):
                raise RuntimeError("the calculator broke")
            if meta.get("hang_after_tools"):
                await anyio.sleep_forever()
        return ctx.complete(messages, finish_reason="max_turns")


class Gated(RolloutAgentLoop):
    """Counts its runs and holds each one until ``release`` is set (for in-process tests).

    ``get_tools`` yields to the event loop once, so duplicates arrive while an init is pending;
    it raises while ``broken`` is true.
    """

    name = "srv-gated"

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.broken = False

    async def get_tools(self, request: RolloutRequest) -> list:
        await anyio.sleep(0)
        if self.broken:
            raise ValueError("tool registry is not loaded")
        return [ADD_TOOL]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        self.runs.append(ctx.request.rollout_id)
        self.started.set()
        await self.release.wait()
        return ctx.complete([*ctx.request.messages, {"role": "assistant", "content": "ok"}])


class Broken(RolloutAgentLoop):
    """``get_tools`` returns a tool with an invalid name: the init must fail with 500."""

    name = "srv-broken-tools"

    def get_tools(self, request: RolloutRequest) -> list:
        return [{"type": "function", "function": {"name": "has spaces"}}]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        raise AssertionError("never started")


class Blocking(RolloutAgentLoop):
    """Blocks its event loop for ``metadata.block_s`` in a thread-less sleep (a badly written
    agent), first yielding once so the init is answered, then completes."""

    name = "srv-blocking"

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        import time

        await anyio.sleep(0.05)
        time.sleep(float(ctx.request.metadata.get("block_s", 0)))
        await anyio.sleep(0.3)  # the peer's sweep runs now
        return ctx.complete([*ctx.request.messages, {"role": "assistant", "content": "late"}])
