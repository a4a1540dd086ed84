"""A rollout server written with osmosis-ai 0.3.8's public API the way its scaffold writes one
(``osmosis rollout init``'s ``main.py``): an ``AgentWorkflow``, an optional ``Grader``, a
``LocalBackend`` and ``create_rollout_server``, served by uvicorn on
``$_OSMOSIS_ROLLOUT_PORT``. It runs in the SDK's own venv (tests/peer_sdk.py), never ours.

The workflow asks the chat endpoint the rollout names (raw HTTP, one of the scaffold's three
ways) until a reply has no tool calls, answering each tool call with the sum of its
arguments, and returns the conversation (the sample). The grader gives 1.0 when the last
reply holds the label, else 0.0. ``SDK_GRADER=0`` serves it without a grader; a row whose
metadata says ``raise`` makes the workflow raise.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import uvicorn
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import AgentWorkflowContext, GraderContext, get_rollout_context
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.server import create_rollout_server

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


class SumWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        rollout = get_rollout_context()
        assert rollout is not None
        if (ctx.metadata or {}).get("raise"):
            raise RuntimeError("the workflow broke")
        messages = [dict(m) for m in ctx.prompt]
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        url = rollout.chat_completions_url.rstrip("/") + "/chat/completions"
        async with httpx.AsyncClient(timeout=60) as http:
            for _ in range(6):
                body = {"model": "mock", "messages": messages, "tools": [ADD_TOOL]}
                response = await http.post(url, json=body, headers=headers)
                response.raise_for_status()
                message = response.json()["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    try:
                        args = json.loads(call["function"]["arguments"] or "{}")
                        content = str(float(args.get("a", 0)) + float(args.get("b", 0)))
                    except (ValueError, TypeError):
                        content = "error: bad arguments"
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": content}
                    )
        return messages


class LabelGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        last = ctx.sample.messages[-1] if ctx.sample.messages else {}
        answer = str(last.get("content") or "")
        ctx.set_reward(1.0 if ctx.label and ctx.label in answer else 0.0)


def main() -> None:
    grader = LabelGrader if os.environ.get("SDK_GRADER", "1") != "0" else None
    backend = LocalBackend(workflow=SumWorkflow, grader=grader)
    app = create_rollout_server(backend=backend)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")),
        log_level="warning",
    )


if __name__ == "__main__":
    main()
