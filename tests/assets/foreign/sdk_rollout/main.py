"""A rollout written with osmosis-ai 0.3's public API the way its scaffold writes one (``osmosis
rollout init``'s main.py): a workflow that drives the LLM over raw HTTP and registers its sample,
a grader that rewards an answer holding the row's label, served on $_OSMOSIS_ROLLOUT_PORT.
``NO_GRADER=1`` serves the workflow alone; ``LEAKY_GRADER=1`` a grader that rewards every answer
(a leak for ``osmosis validate --reward`` to find). Run by tests/test_launch_sdk.py and
tests/test_launch_bench.py in the SDK's own venv.
"""

from __future__ import annotations

import os

import httpx
import uvicorn
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import (
    AgentWorkflowContext,
    GraderContext,
    SampleSource,
    get_rollout_context,
)
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.types import RolloutSample


class Conversation(SampleSource):
    def __init__(self, messages: list[dict]) -> None:
        self.messages = messages

    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=self.messages)


class MyAgentWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        rollout = get_rollout_context()
        messages = list(ctx.prompt)
        source = Conversation(messages)
        rollout.set_sample_source(source)
        headers = {"authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        async with httpx.AsyncClient(timeout=60) as http:
            reply = await http.post(
                rollout.chat_completions_url.rstrip("/") + "/chat/completions",
                json={"model": "default", "messages": messages},
                headers=headers,
            )
            reply.raise_for_status()
            messages.append(reply.json()["choices"][0]["message"])


class LeakyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(1.0)


class MyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        last = ctx.sample.messages[-1] if ctx.sample and ctx.sample.messages else None
        content = (getattr(last, "content", None) or "") if last is not None else ""
        if isinstance(last, dict):
            content = last.get("content") or ""
        ctx.set_reward(1.0 if ctx.label and ctx.label in str(content) else 0.0)


def main() -> None:
    grader = None if os.environ.get("NO_GRADER") else MyGrader
    if os.environ.get("LEAKY_GRADER"):
        grader = LeakyGrader
    backend = LocalBackend(workflow=MyAgentWorkflow, grader=grader)
    app = create_rollout_server(backend=backend)
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))


if __name__ == "__main__":
    main()
