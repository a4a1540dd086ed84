"""Run in osmosis-ai 0.3.2's own venv (tests/peer_sdk.py): the trainer's code drives our server.

``python sdk032_driver.py SERVER_URL`` uses the SDK's ``HttpRolloutDriver``, its
``CallbackStore`` and its callback app (``create_callback_app``, served on 127.0.0.1 as its
local eval runner serves it), with a scripted chat endpoint beside it, and prints one JSON
report: each case's outcome, the driver's read of ``/health``, and every callback body as it
arrived with what the SDK's models made of it. Nothing here is ours: the test reads the report.

The chat endpoint answers "7" to "What is 3 + 4?", waits 30 s on a prompt saying "slow" (the
case the driver cancels), and counts the calls.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from fastapi import FastAPI, Request
from osmosis_ai.eval.local.runner import _probe_health, health_capacity
from osmosis_ai.rollout.controller.listener import LocalhostUvicornServer, create_callback_app
from osmosis_ai.rollout.controller.store import CallbackStore, TerminalCallbackResult
from osmosis_ai.rollout.driver import RolloutRunRequest
from osmosis_ai.rollout.http_driver import HttpRolloutDriver
from osmosis_ai.rollout.types import GraderCompleteRequest, RolloutCompleteRequest

CONTROLLER_KEY = "controller-key-for-callbacks-0123"
LLM_KEY = "llm-key-for-chat-4567"
QUESTION = [{"role": "user", "content": "What is 3 + 4?"}]


class Recorder:
    """Wraps the SDK's callback app: keeps each callback's path, body and answer."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        entry: dict[str, Any] = {
            "path": scope["path"],
            "body": body.decode("utf-8", "replace"),
            "authorization": dict(scope["headers"]).get(b"authorization", b"").decode(),
        }
        self.seen.append(entry)
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
            await send(message)

        await self.app(scope, replay, capture)


def chat_app(calls: list[dict[str, Any]], slow_started: asyncio.Event) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/rollouts/{rollout_id}/chat/completions")
    async def chat(rollout_id: str, request: Request) -> dict[str, Any]:
        body = await request.json()
        calls.append(
            {"rollout_id": rollout_id, "authorization": request.headers.get("authorization")}
        )
        text = json.dumps(body.get("messages", []))
        if "slow" in text:
            slow_started.set()
            for _ in range(300):  # 30 s, unless the server hangs up first (it was cancelled)
                if await request.is_disconnected():
                    break
                await asyncio.sleep(0.1)
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "m"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "7"},
                    "finish_reason": "stop",
                }
            ],
        }

    return app


def parsed(entry: dict[str, Any]) -> dict[str, Any]:
    """What the SDK's own models make of one callback body (or why they refuse it)."""
    model = GraderCompleteRequest if entry["path"].endswith("/grader") else RolloutCompleteRequest
    try:
        value = model.model_validate_json(entry["body"])
    except Exception as exc:  # the report says which body and why
        return {"valid": False, "error": str(exc)[:500]}
    return {"valid": True, "value": value.model_dump(mode="json")}


def outcome_of(outcome: Any) -> dict[str, Any]:
    sample = outcome.sample
    return {
        "status": str(outcome.status),
        "error": outcome.error,
        "reward": None if sample is None else sample.reward,
        "messages": None if sample is None else len(sample.messages),
    }


async def main(server: str) -> dict[str, Any]:
    terminals: list[TerminalCallbackResult] = []

    async def commit(result: TerminalCallbackResult) -> None:
        terminals.append(result)

    store = CallbackStore(on_terminal_commit=commit)
    callbacks = Recorder(create_callback_app(store, auth_token=CONTROLLER_KEY))
    calls: list[dict[str, Any]] = []
    slow_started = asyncio.Event()
    report: dict[str, Any] = {}
    async with (
        LocalhostUvicornServer(callbacks) as listener,
        LocalhostUvicornServer(chat_app(calls, slow_started)) as llm,
        httpx.AsyncClient(timeout=30) as http,
    ):
        driver = HttpRolloutDriver(
            rollout_base_url=server,
            callback_store=store,
            completion_url_for=lambda rid: f"{listener.base_url}/v1/rollouts/{rid}/completion",
            grader_url_for=lambda rid: f"{listener.base_url}/v1/rollouts/{rid}/grader",
            chat_completions_url_for=lambda rid: f"{llm.base_url}/v1/rollouts/{rid}",
            chat_api_key=LLM_KEY,
            controller_api_key=CONTROLLER_KEY,
            http_client=http,
            fresh_cancel_client=True,
            callback_timeout_sec=60,
        )
        probe = await _probe_health(http, server)
        report["health"] = {
            "capacity": None if probe is None else health_capacity(probe.payload),
            "instance_id": None if probe is None else probe.instance_id,
        }

        success = await driver.run(
            RolloutRunRequest(messages=QUESTION, label="7", rollout_id="row-0-success")
        )
        report["success"] = outcome_of(success)

        raising = await driver.run(
            RolloutRunRequest(
                messages=[{"role": "user", "content": "please raise"}],
                label="7",
                rollout_id="row-1-raises",
            )
        )
        report["raises"] = outcome_of(raising)

        slow = asyncio.create_task(
            driver.run(
                RolloutRunRequest(
                    messages=[{"role": "user", "content": "slow: what is 3 + 4?"}],
                    label="7",
                    rollout_id="row-2-cancelled",
                )
            )
        )
        await asyncio.wait_for(slow_started.wait(), 30)
        slow.cancel()  # as the runner does when a run is stopped: the driver cancels it
        try:
            await slow
            report["cancelled"] = {"raised": False}
        except asyncio.CancelledError:
            report["cancelled"] = {"raised": True}
        for _ in range(100):  # the server's answer to the driver's cancel
            status = (await http.get(f"{server}/rollout/row-2-cancelled/status")).json()
            if status["status"] not in ("queued", "running", "grading"):
                break
            await asyncio.sleep(0.1)
        report["cancelled"]["status"] = status
        for _ in range(100):  # and its callbacks, which the store acknowledges late
            if sum("row-2-cancelled" in e["path"] for e in callbacks.seen) >= 2:
                break
            await asyncio.sleep(0.1)
        await driver.aclose()
    report["callbacks"] = [{**entry, "parsed": parsed(entry)} for entry in callbacks.seen]
    report["terminals"] = [t.source for t in terminals]
    report["chat_calls"] = calls
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1].rstrip("/")))))
