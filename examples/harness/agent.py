"""Run an existing agent program (``harness.py``) as a rollout, unchanged.

The harness reads ``OPENAI_BASE_URL``/``OPENAI_API_KEY``; this rollout hands it its own
endpoint (``ctx.openai_base_url``, ``ctx.openai_api_key``), so every call the harness makes is
one turn of this rollout: checked, traced and recorded like a ``ctx.chat`` turn.

    osmosis test examples/harness/agent.py:HarnessAgent -d examples/harness/dataset.jsonl
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult

HARNESS = Path(__file__).with_name("harness.py")
sys.path.insert(0, str(HARNESS.parent))

from harness import TOOLS  # noqa: E402  (the harness declares its tools; so do we, the same)


class HarnessAgent(RolloutAgentLoop):
    """One harness process per rollout; its final conversation is the rollout's."""

    name = "harness"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return TOOLS

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        env = {
            **_passed_on(os.environ),
            "OPENAI_BASE_URL": ctx.openai_base_url,
            "OPENAI_API_KEY": ctx.openai_api_key,
            "HARNESS_MAX_TURNS": str(ctx.request.max_turns),
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(HARNESS),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            out, err = await proc.communicate(json.dumps(ctx.request.messages).encode())
        finally:
            if proc.returncode is None:  # cancelled (the rollout's deadline): stop the harness
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return ctx.error(f"the harness exited with {proc.returncode}: {tail[0]}")
        messages = json.loads(out)
        return ctx.complete(messages, reward=_score(messages, ctx.request.metadata))


#: What the harness inherits from the server's environment: what a Python program needs to
#: start, and its own settings. Nothing else: the server's key (``OSMOSIS_API_KEY``), cloud
#: credentials and the trainer's secrets stay with the server.
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


def _passed_on(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` the harness gets."""
    return {
        name: value
        for name, value in environ.items()
        if name in _INHERITED or name.startswith("HARNESS_")
    }


def _score(messages: list[dict[str, Any]], metadata: dict[str, Any]) -> float:
    """1.0 when the harness's last reply holds the row's ground truth (a trainer needs a reward;
    protocol v2 refuses a sample without one)."""
    truth = metadata.get("ground_truth")
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
    return 1.0 if truth is not None and str(truth) in str(last.get("content") or "") else 0.0
