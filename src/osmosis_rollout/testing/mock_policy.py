"""How the mock LLM walks an agent: which tools it calls at each turn, and when it answers.

The default, ``walk``, calls one tool per turn, every declared tool once, in an order seeded
per rollout that leaves the tools whose names look terminal (``submit_answer``, ``final``...)
for last, then gives a final answer: an agent that stops at its ``submit`` tool still runs its
multi-turn branches first. ``all`` calls every tool at once in the first turn (the mock's
first behaviour), ``random`` a seeded random number of turns of one random tool each, ``first``
the first tool once, and ``none`` answers at once with no text and no tool (the do-nothing
policy the reward checks use). A dataset row's ``mock_replies`` column scripts its replies
instead (see :func:`scripted_message`).

Every choice depends on the seed and the rollout's *key* only (its row and sample, bound by
the runner; the rollout id otherwise), never on a run's random id: two runs of one command
send the agent the same messages.
"""

from __future__ import annotations

import json
import random
import re
import zlib
from typing import Any

from ..errors import ConfigError

__all__ = ["POLICIES", "TERMINAL", "check_policy", "scripted_message", "tool_plan"]

#: The policies ``--mock-policy`` takes.
POLICIES = ("walk", "all", "random", "first", "none")
#: A tool whose name has one of these words looks like the one that ends a rollout.
TERMINAL = re.compile(r"(^|_|-)(submit|answer|final|finish|done|respond|reply|end|stop)", re.I)


def check_policy(policy: str) -> str:
    """``policy``, if it is one of :data:`POLICIES`; a ``ConfigError`` naming them otherwise."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown mock policy {policy!r}; choose {', '.join(POLICIES)}")
    return policy


def rng_for(seed: int, key: str, salt: str = "") -> random.Random:
    """A random source for one rollout's choices: its seed and key, nothing else."""
    return random.Random(seed * 1_000_003 + zlib.crc32(f"{key}/{salt}".encode()))


def tool_plan(policy: str, names: list[str], seed: int, key: str) -> list[list[int]]:
    """The tool calls of each tool-call turn, as indexes into ``names``; the turns after them
    give the final answer."""
    if not names or policy == "none":
        return []
    if policy == "all":
        return [list(range(len(names)))]
    if policy == "first":
        return [[0]]
    rng = rng_for(seed, key, "plan")
    if policy == "random":
        return [[rng.randrange(len(names))] for _ in range(rng.randint(0, len(names)))]
    ordinary = [i for i, name in enumerate(names) if not TERMINAL.search(name)]
    terminal = [i for i, name in enumerate(names) if TERMINAL.search(name)]
    rng.shuffle(ordinary)
    rng.shuffle(terminal)
    return [[i] for i in ordinary + terminal]


def scripted_message(item: Any, turn: int) -> dict[str, Any]:
    """One scripted assistant reply of a ``mock_replies`` column as an assistant message.

    An item is a string (the reply's text) or an object with ``content`` and/or
    ``tool_calls``; a tool call may be written short, ``{"name": "add", "arguments": {"a":
    1}}``, or as OpenAI sends it. Raises ``ValueError`` saying what is wrong with the item.
    """
    if isinstance(item, str):
        return {"content": item}
    if not isinstance(item, dict):
        raise ValueError(f"a reply must be a string or an object, got {type(item).__name__}")
    unknown = set(item) - {"content", "tool_calls", "role"}
    if unknown:
        raise ValueError(f"a reply has content and tool_calls only, not {sorted(unknown)}")
    content = item.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError("a reply's content must be a string")
    calls = item.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ValueError("a reply's tool_calls must be a list")
    message: dict[str, Any] = {"content": content if content is not None or calls else ""}
    if calls:
        message["tool_calls"] = [_call(call, turn, i) for i, call in enumerate(calls)]
    return message


def _call(call: Any, turn: int, index: int) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise ValueError("each tool call must be an object with a name")
    function = call.get("function", call)
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("each tool call needs a name")
    arguments = function.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": str(call.get("id") or f"call_{turn + 1}_{index + 1}"),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
