"""Agents that fail in the ways run_rollout must survive: each chats once, then misbehaves."""

import anyio

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult


class _ChatsOnce(RolloutAgentLoop):
    """Shared ``get_tools`` and first turn; ``run`` decides how the rollout ends."""

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def first_turn(self, ctx: RolloutContext) -> list:
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        return messages


class ChatOnceAgent(_ChatsOnce):
    """Behaves: one turn, then completes with reward 1."""

    name = "fnd-chat-once"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        return ctx.complete(await self.first_turn(ctx), reward=1.0)


class RaisesAfterReplyAgent(_ChatsOnce):
    """Raises after the first reply, as a crashing tool would."""

    name = "fnd-raises"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        await self.first_turn(ctx)
        raise RuntimeError("tool backend exploded")


class HangingAgent(_ChatsOnce):
    """Never returns after its first turn; sets ``started`` once it is stuck."""

    name = "fnd-hangs"

    def __init__(self, started: anyio.Event | None = None) -> None:
        self.started = started

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        await self.first_turn(ctx)
        if self.started is not None:
            self.started.set()
        await anyio.sleep_forever()
        return ctx.complete([])


class ReturnsNoneAgent(_ChatsOnce):
    """Forgets to return ``ctx.complete(...)``."""

    name = "fnd-returns-none"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        await self.first_turn(ctx)


class ReturnsDictAgent(_ChatsOnce):
    """Returns a dict that looks like a result but is not one."""

    name = "fnd-returns-dict"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = await self.first_turn(ctx)
        return {"status": "COMPLETED", "final_messages": messages}


class NaNRewardAgent(_ChatsOnce):
    """Completes with a NaN reward (e.g. 0/0 in a scoring function)."""

    name = "fnd-nan-reward"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        return ctx.complete(await self.first_turn(ctx), reward=float("nan"))


class LeakyLoggerAgent(_ChatsOnce):
    """Logs its api_key into debug events, by key and inside text."""

    name = "fnd-leaky-logger"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        key = ctx.request.api_key_value
        ctx.log_event("debug", api_key=key, note=f"calling with key={key}")
        ctx.log_event(
            "http",
            request={"headers": {"Authorization": f"Bearer {key}"}, "body": [{"text": key}]},
        )
        messages = await self.first_turn(ctx)
        messages.append({"role": "user", "content": f"my key is {key}"})
        ctx.log_event("history", messages=messages)
        return ctx.complete(messages)


class RaisesWithKeyAgent(_ChatsOnce):
    """Raises an exception whose text contains the api_key (e.g. a dumped request)."""

    name = "fnd-raises-with-key"

    def __init__(self, error_class: type[Exception] = RuntimeError) -> None:
        self.error_class = error_class

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        await self.first_turn(ctx)
        raise self.error_class(f"upstream rejected Bearer {ctx.request.api_key_value}")
