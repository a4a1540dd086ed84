"""One rollout by the official osmosis-ai 0.3.8 ``RolloutClient.run_rollout``: run by
tests/test_polling_templates_interop.py in a Python 3.12+ venv of its own (never imported by our
tests: osmosis_ai is not installed beside us).

Arguments: the server's URL, its key, the chat URL and a JSON file of the rollout (``rollout_id``,
``initial_messages``, ``label``, ``metadata``). Prints the SDK's result as one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.client import RolloutClient


async def main(url: str, key: str, chat_url: str, rollout: str) -> dict[str, Any]:
    spec = json.loads(Path(rollout).read_text(encoding="utf-8"))
    client = RolloutClient(url=url, api_key=key)
    try:
        result = await client.run_rollout(
            spec["initial_messages"],
            chat_url,
            spec["rollout_id"],
            llm_api_key="llm-key-templates",
            label=spec["label"],
            metadata=spec["metadata"],
            agent_timeout_sec=120,
            grader_timeout_sec=60,
        )
    finally:
        await client.aclose()
    return result.model_dump(mode="json")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:5]))))
