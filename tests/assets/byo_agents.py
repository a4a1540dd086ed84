"""Agents written for the `openai` client, not ctx.chat (tests/test_openai_endpoint*.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.tools import Toolbox


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


TOOLBOX = Toolbox([add, multiply])
TOOLS = [t.model_dump(mode="json", exclude_none=True) for t in TOOLBOX.schemas]


async def _tool_results(ctx: RolloutContext, message: Any) -> list[dict[str, Any]]:
    calls = [call.model_dump() for call in message.tool_calls or []]
    return await TOOLBOX.execute(ctx, calls)


class OpenAISdkAgent(RolloutAgentLoop):
    """The plain `openai` client loop: create, append the reply, run the tools, repeat."""

    name = "openai-sdk"
    stream = False
    trim_after: int | None = None  # keep only the first and the last messages from this turn

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return TOOLBOX.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        client = ctx.openai_client()
        messages: list[Any] = list(ctx.request.messages)
        for turn in range(1, ctx.request.max_turns + 1):
            if self.trim_after is not None and turn > self.trim_after:
                messages = [messages[0], *messages[-2:]]
            message = await self._create(client, messages)
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return ctx.complete(messages)
            messages.extend(await _tool_results(ctx, message))
        return ctx.complete(messages, finish_reason="max_turns")

    async def _create(self, client: Any, messages: list[Any]) -> Any:
        if not self.stream:
            reply = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS
            )
            return reply.choices[0].message
        async with client.chat.completions.stream(
            model="policy", messages=messages, tools=TOOLS
        ) as stream:
            async for _ in stream:
                pass
            final = await stream.get_final_completion()
        return final.choices[0].message


class StreamingAgent(OpenAISdkAgent):
    name = "openai-sdk-stream"
    stream = True


class TrimmingAgent(OpenAISdkAgent):
    """Trims its history after 3 turns, like a context-window manager."""

    name = "openai-sdk-trims"
    trim_after = 3


class ToolDroppingAgent(OpenAISdkAgent):
    """Sends only the first of its tools: not what it declared at init."""

    name = "openai-sdk-drops-a-tool"

    async def _create(self, client: Any, messages: list[Any]) -> Any:
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS[:1], tool_choice="required"
        )
        return reply.choices[0].message


class ManyChoicesAgent(OpenAISdkAgent):
    name = "openai-sdk-n2"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        import openai

        client = ctx.openai_client()
        try:
            await client.chat.completions.create(
                model="policy", messages=ctx.request.messages, tools=TOOLS, n=2
            )
        except openai.BadRequestError as exc:
            return ctx.error(f"refused: {exc.message}")
        return ctx.error("n=2 was accepted")


class ParallelAgent(OpenAISdkAgent):
    """Sends two calls of one rollout at once."""

    name = "openai-sdk-parallel"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        client = ctx.openai_client()
        messages = list(ctx.request.messages)
        first, _ = await asyncio.gather(
            client.chat.completions.create(model="p", messages=messages, tools=TOOLS),
            client.chat.completions.create(model="p", messages=messages, tools=TOOLS),
        )
        return ctx.complete([*messages, first.choices[0].message.model_dump(exclude_none=True)])


class LateCallAgent(OpenAISdkAgent):
    """Calls again after ctx.complete()."""

    name = "openai-sdk-late"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        import openai

        client = ctx.openai_client()
        messages = list(ctx.request.messages)
        reply = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        result = ctx.complete(messages)
        try:
            await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        except openai.APIStatusError as exc:
            result.extra_fields["late_status"] = exc.status_code
        return result


class ChatTwin(OpenAISdkAgent):
    """The same loop on ctx.chat: what the endpoint's agents must be indistinguishable from."""

    name = "chat-twin"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages)
            messages.extend(await TOOLBOX.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns")


class ProbeAgent(OpenAISdkAgent):
    """Calls its loopback endpoint with a wrong token, an unknown rollout and the right token;
    returns the statuses, its URL and token (void by the time the test reads them)."""

    name = "loopback-probe"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        import httpx2

        url, key = ctx.openai_base_url, ctx.openai_api_key
        body = {"model": "p", "messages": ctx.request.messages, "tools": TOOLS}
        other = url.replace("/rollouts/", "/rollouts/x")
        async with httpx2.AsyncClient(timeout=30) as http:
            wrong = await http.post(f"{url}/chat/completions", json=body, headers=_bearer("nope"))
            missing = await http.post(f"{url}/chat/completions", json=body)
            unknown = await http.post(f"{other}/chat/completions", json=body, headers=_bearer(key))
            responses = await http.post(f"{url}/responses", json=body, headers=_bearer(key))
            right = await http.post(f"{url}/chat/completions", json=body, headers=_bearer(key))
        reply = right.json()["choices"][0]["message"]
        result = ctx.complete([*ctx.request.messages, reply])
        result.extra_fields.update(
            url=url,
            key=key,
            statuses=[r.status_code for r in (wrong, missing, unknown, responses, right)],
            errors=[r.json()["error"]["message"] for r in (wrong, unknown, responses)],
        )
        return result


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


class BadParameterAgent(OpenAISdkAgent):
    """Sends a temperature that is not a number."""

    name = "openai-sdk-bad-param"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        import openai

        client = ctx.openai_client()
        try:
            await client.chat.completions.create(
                model="p", messages=ctx.request.messages, temperature="hot"
            )
        except openai.BadRequestError as exc:
            return ctx.error(f"refused: {exc.message}")
        return ctx.error("accepted")
