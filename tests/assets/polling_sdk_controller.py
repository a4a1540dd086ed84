"""The official osmosis-ai 0.3.8 controller against our server: run by tests/test_polling_interop.py
in a Python 3.12+ venv of its own (never imported by our tests: osmosis_ai is not installed
beside us).

Arguments: the server's URL, its key and the chat gate's URL. Prints one JSON object: what each
case saw. Every body read by hand is parsed with the SDK's own models in strict mode, and its
keys must be the model's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.types import (
    POLLING_LEASE_HEADER,
    CancelRolloutsResponse,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutLifecycle,
    RolloutResultResponse,
)
from pydantic import BaseModel

FINISHED = {"success", "failure", "cancelled"}


def strict(model: type[BaseModel], text: str) -> Any:
    """``text`` parsed by ``model`` in strict mode, with no key the model does not have."""
    parsed = model.model_validate_json(text, strict=True)
    extra = set(json.loads(text)) - set(model.model_fields)
    if extra:
        raise AssertionError(f"{model.__name__} got unknown keys {sorted(extra)}")
    return parsed


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def main(url: str, key: str, gate: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"tokens": []}
    auth = {"Authorization": f"Bearer {key}"}
    client = RolloutClient(url=url, api_key=key)
    http = httpx.AsyncClient(base_url=url, headers=auth, timeout=30)

    def chat(rid: str) -> str:
        return f"{gate}/v1/rollouts/{rid}"

    # success, through run_rollout
    result = await client.run_rollout(
        user("What is 3 + 4?"), chat("ok"), "ok", llm_api_key="llm-key", label="7"
    )
    seen["success"] = result.model_dump(mode="json")

    # an agent that raises
    result = await client.run_rollout(user("raise"), chat("boom"), "boom", llm_api_key="llm-key")
    seen["raise"] = result.model_dump(mode="json")

    # a cancel while it runs
    handle = await client.run_rollout_async(user("sleep 30"), chat("stop"), "stop")
    await handle.wait_for_running()
    cancelled = await client.cancel_rollout("stop")
    result = await handle
    seen["cancel"] = {
        "dispositions": cancelled.dispositions,
        "result": result.model_dump(mode="json"),
    }

    # by hand, every body strict: init, polls until the end, a second read, a cancel
    body = RolloutInitRequest(
        initial_messages=user("What is 3 + 4?"),
        rollout_id="strict",
        chat_completions_url=chat("strict"),
        llm_api_key="llm-key",
        label="7",
    ).model_dump(mode="json")
    response = await http.post("/rollout", json=body)
    admission = strict(RolloutInitResponse, response.text)
    seen["tokens"].append(admission.polling_lease_token)
    lease = {POLLING_LEASE_HEADER: admission.polling_lease_token}
    statuses = []
    while True:
        response = await http.get("/rollout/strict/result", headers=lease)
        polled = strict(RolloutResultResponse, response.text)
        final_text = response.text
        statuses.append(polled.status.value)
        if polled.status.value in FINISHED:
            break
    again = await http.get("/rollout/strict/result", headers=lease)
    response = await http.post("/rollout/cancel", json={"ids": ["strict"]})
    seen["strict"] = {
        "init_status": admission.status.value,
        "statuses": statuses,
        "reward": polled.sample.reward if polled.sample is not None else None,
        "same_again": again.text == final_text,
        "cancel_after": strict(CancelRolloutsResponse, response.text).dispositions,
    }

    # a controller that stops polling: its rollout ends at the lease's end
    body = RolloutInitRequest(
        initial_messages=user("sleep 30"), rollout_id="gone", chat_completions_url=chat("gone")
    ).model_dump(mode="json")
    admission = strict(RolloutInitResponse, (await http.post("/rollout", json=body)).text)
    seen["tokens"].append(admission.polling_lease_token)
    lease = {POLLING_LEASE_HEADER: admission.polling_lease_token}
    await asyncio.sleep(admission.polling_lease_timeout_sec + 1.0)
    health = (await http.get("/health")).json()
    response = await http.get("/rollout/gone/result", headers=lease)
    seen["lease"] = {
        "result": strict(RolloutResultResponse, response.text).model_dump(mode="json"),
        "active_after": RolloutLifecycle.model_validate(health["lifecycle"]).active_rollouts,
    }

    # /health as the SDK reads it
    idle = await client.wait_idle(timeout_sec=10, poll_interval_sec=0.2)
    lifecycle = RolloutLifecycle.model_validate(idle["lifecycle"], strict=True)
    seen["health"] = {"lifecycle": lifecycle.model_dump(), "process_id": idle["process_id"]}

    await http.aclose()
    await client.aclose()
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
