"""A small protocol v2 rollout server that follows the spec (docs: /work/shared/protocol-v2.md
§3-§6), for testing the mock TrainGate's v2 controller apart from our own server.

Its "agent" asks the chat endpoint until a reply has no tool calls (answering each tool call
with "7"), then posts the completion and grader callbacks. ``Behaviour`` bends one rule at a
time, so each v2 finding can be provoked on purpose.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


_REQUIRED = ("initial_messages", "chat_completions_url", "completion_callback_url")


@dataclass
class Behaviour:
    """What the stub does; the defaults follow the spec (and our guarantees) to the letter."""

    tools: list[dict[str, Any]] = field(default_factory=lambda: [ADD_TOOL])
    send_tools: bool = True
    tools_in_202: bool = False  # our server's extension: the 202 names get_tools' answer
    stream: bool = False
    chat_with_callback_key: bool = False
    body_id: str | None = None  # a different id in the callback bodies
    agent_fails: bool = False
    agent_sleep_s: float = 0.0
    grader_first: bool = False
    duplicate_grader: bool = False
    reward_on_failure: bool = False
    send_completion: bool = True
    send_grader: bool = True
    status_says: str | None = None  # a fixed status answer after the end
    cancel_says: str | None = None  # a fixed disposition
    max_in_flight: int = 100
    retry_after: str = "0.05"


@dataclass
class _Rollout:
    body: dict[str, Any]
    status: str = "queued"
    reward: float | None = None
    err_message: str | None = None
    task: asyncio.Task[None] | None = None


class V2Stub:
    """The stub's state and Starlette ``app``; ``inits`` counts every ``POST /rollout``."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.rollouts: dict[str, _Rollout] = {}
        self.inits = 0
        self.refused = 0
        self.chat_bodies: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/health", self.health),
                Route("/rollout", self.start, methods=["POST"]),
                Route("/rollout/cancel", self.cancel, methods=["POST"]),
                Route("/rollout/{rid:path}/status", self.status),
            ]
        )

    async def health(self, request: Request) -> JSONResponse:
        running = sum(1 for r in self.rollouts.values() if r.status in ("queued", "running"))
        return JSONResponse({"status": "ok", "concurrency": {"running": running}})

    async def start(self, request: Request) -> JSONResponse:
        body = await request.json()
        missing = [k for k in _REQUIRED if k not in body]
        if missing:  # validation comes first (spec §3.1), and starts nothing
            return JSONResponse({"detail": f"missing {', '.join(missing)}"}, status_code=422)
        self.inits += 1
        in_flight = sum(1 for r in self.rollouts.values() if r.status in ("queued", "running"))
        if in_flight >= self.behaviour.max_in_flight:
            self.refused += 1
            return JSONResponse(
                {"detail": "rollout queue is full; retry later"},
                status_code=429,
                headers={"Retry-After": self.behaviour.retry_after},
            )
        rid = body.get("rollout_id") or uuid.uuid4().hex
        rollout = _Rollout(body=body)
        self.rollouts[rid] = rollout
        rollout.task = asyncio.get_running_loop().create_task(self._run(rid, rollout))
        answer: dict[str, Any] = {"rollout_id": rid}
        if self.behaviour.tools_in_202:
            answer["tools"] = self.behaviour.tools
        return JSONResponse(answer, status_code=202)

    async def status(self, request: Request) -> JSONResponse:
        rid = request.path_params["rid"]
        rollout = self.rollouts.get(rid)
        status = rollout.status if rollout is not None else "unknown"
        if status in ("success", "failure"):
            status = self.behaviour.status_says or status
        return JSONResponse(
            {
                "rollout_id": rid,
                "status": status,
                "reward": rollout.reward if rollout else None,
                "err_message": rollout.err_message if rollout else None,
            }
        )

    async def cancel(self, request: Request) -> JSONResponse:
        body = await request.json()
        answer: dict[str, str] = {}
        for rid in body.get("ids") or []:
            rollout = self.rollouts.get(rid)
            if self.behaviour.cancel_says is not None:
                answer[rid] = self.behaviour.cancel_says
            elif rollout is None or rollout.task is None or rollout.task.done():
                answer[rid] = "not_found"
            else:
                answer[rid] = f"cancelled_{rollout.status}"
                rollout.task.cancel()
                rollout.status = "cancelled"
        return JSONResponse({"dispositions": answer})

    # -- the "agent" and the callbacks -----------------------------------------------------

    async def _run(self, rid: str, rollout: _Rollout) -> None:
        b, body = self.behaviour, rollout.body
        rollout.status = "running"
        key = body["controller_api_key"] if b.chat_with_callback_key else body["llm_api_key"]
        messages = list(body["initial_messages"])
        failure: str | None = None
        async with httpx2.AsyncClient(timeout=10.0) as http:
            try:
                await asyncio.sleep(b.agent_sleep_s)
                if b.agent_fails:
                    raise RuntimeError("boom from the stub's agent")
                for _turn in range(4):
                    message = await self._chat(http, body, key, messages)
                    messages.append(message)
                    calls = message.get("tool_calls") or []
                    if not calls:
                        break
                    messages.extend(
                        {"role": "tool", "tool_call_id": call["id"], "content": "7"}
                        for call in calls
                    )
            except (RuntimeError, httpx2.HTTPError, KeyError, ValueError) as exc:
                failure = str(exc) or type(exc).__name__
            await self._callbacks(http, rid, rollout, messages, failure)

    async def _chat(
        self, http: httpx2.AsyncClient, body: dict[str, Any], key: str, messages: list[Any]
    ) -> dict[str, Any]:
        b = self.behaviour
        chat: dict[str, Any] = {"model": "osmosis-rollout", "messages": messages}
        if b.send_tools:
            chat["tools"] = b.tools
        if b.stream:
            chat["stream"] = True
        self.chat_bodies.append(chat)
        response = await http.post(
            body["chat_completions_url"] + "/chat/completions",
            json=chat,
            headers={"Authorization": f"Bearer {key}"},
        )
        if response.status_code != 200:
            raise RuntimeError(f"chat answered HTTP {response.status_code}")
        if not b.stream:
            return dict(response.json()["choices"][0]["message"])
        chunks = [
            json.loads(line[len("data: ") :])
            for line in response.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
        delta = dict(chunks[0]["choices"][0]["delta"])
        for call in delta.get("tool_calls") or []:
            call.pop("index", None)
        return delta

    async def _callbacks(
        self,
        http: httpx2.AsyncClient,
        rid: str,
        rollout: _Rollout,
        messages: list[Any],
        failure: str | None,
    ) -> None:
        b, body = self.behaviour, rollout.body
        headers = {"Authorization": f"Bearer {body['controller_api_key']}"}
        sent_id = b.body_id or rid
        ok = failure is None
        completion = {
            "status": "success" if ok else "failure",
            "rollout_id": sent_id,
            "extra_fields": None,
            "err_message": failure,
            "err_category": None if ok else "agent_error",
        }
        last = str(messages[-1].get("content") or "") if messages else ""
        reward = 1.0 if ok and body.get("label") and body["label"] in last else 0.0
        grader = {
            "status": "success" if ok else "failure",
            "rollout_id": sent_id,
            "sample": {
                "messages": messages,
                "label": body.get("label"),
                "reward": reward if ok or b.reward_on_failure else None,
                "remove_sample": False,
                "metrics": {},
                "extra_fields": {},
            },
            "err_message": failure,
            "err_category": None if ok else "agent_error",
        }
        rollout.status = "success" if ok else "failure"
        rollout.reward = reward if ok else None
        rollout.err_message = failure
        posts: list[tuple[str, dict[str, Any]]] = []
        if b.send_completion:
            posts.append((body["completion_callback_url"], completion))
        if b.send_grader and body.get("grader_callback_url"):
            posts.insert(0 if b.grader_first else len(posts), (body["grader_callback_url"], grader))
            if b.duplicate_grader:
                posts.append((body["grader_callback_url"], grader))
        for url, data in posts:
            await http.post(url, json=data, headers=headers)
