"""A stand-alone agent program (a "harness"): it knows nothing of osmosis-rollout.

It reads the conversation so far as JSON on stdin, talks to whatever OpenAI-compatible server
``OPENAI_BASE_URL`` names with ``OPENAI_API_KEY``, runs its own tools, and writes the final
conversation as JSON on stdout. ``agent.py`` runs it once per rollout.

    echo '[{"role": "user", "content": "What is 2 + 3?"}]' | python harness.py
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from openai import OpenAI

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.capitalize()} two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
    for name in ("add", "multiply")
]


def call_tool(name: str, arguments: str) -> str:
    """Run one tool call; a bad call is answered as text, as a model can read it."""
    try:
        args = json.loads(arguments)
        a, b = float(args["a"]), float(args["b"])
    except (ValueError, KeyError, TypeError):
        return "error: give numbers a and b"
    return str(a + b if name == "add" else a * b)


def main() -> None:
    messages: list[dict[str, Any]] = json.load(sys.stdin)
    max_turns = int(os.environ.get("HARNESS_MAX_TURNS", "8"))
    # A context-window manager some harnesses have: after this many turns, keep only the first
    # message and the latest exchange: a history rewritten, which a trainer cannot use.
    trim_after = int(os.environ.get("HARNESS_TRIM_AFTER", "0"))
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY, from the environment
    for turn in range(1, max_turns + 1):
        if trim_after and turn > trim_after:
            messages = [messages[0], *messages[-2:]]
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = call_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    json.dump(messages, sys.stdout)


if __name__ == "__main__":
    main()
