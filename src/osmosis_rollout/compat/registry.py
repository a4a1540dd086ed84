"""The legacy agent loop registry: agents by name, for projects that look them up at run time.

The server does not use it (it serves the one agent it is given), as in the legacy SDK.
"""

from __future__ import annotations

import threading

from ..agent import RolloutAgentLoop
from ..errors import AgentLoopNotFoundError

__all__ = [
    "AgentLoopRegistry",
    "get_agent_loop",
    "list_agent_loops",
    "register_agent_loop",
    "unregister_agent_loop",
]


class AgentLoopRegistry:
    """A thread-safe map from ``agent.name`` to agent."""

    def __init__(self) -> None:
        self._loops: dict[str, RolloutAgentLoop] = {}
        self._lock = threading.Lock()

    def register(self, loop: RolloutAgentLoop) -> None:
        """Add ``loop``; ``ValueError`` if its name is already registered."""
        with self._lock:
            if loop.name in self._loops:
                raise ValueError(
                    f"Agent loop '{loop.name}' is already registered; unregister it first"
                )
            self._loops[loop.name] = loop

    def unregister(self, name: str) -> bool:
        """Remove the loop named ``name``; False when there was none."""
        with self._lock:
            return self._loops.pop(name, None) is not None

    def get(self, name: str) -> RolloutAgentLoop | None:
        """The loop named ``name``, or None."""
        with self._lock:
            return self._loops.get(name)

    def list_names(self) -> list[str]:
        """Registered names, in registration order."""
        with self._lock:
            return list(self._loops)

    def clear(self) -> None:
        """Remove every loop."""
        with self._lock:
            self._loops.clear()


_REGISTRY = AgentLoopRegistry()


def register_agent_loop(loop: RolloutAgentLoop) -> None:
    """Register ``loop`` in the global registry."""
    _REGISTRY.register(loop)


def unregister_agent_loop(name: str) -> bool:
    """Remove ``name`` from the global registry; False when it was not there."""
    return _REGISTRY.unregister(name)


def get_agent_loop(name: str) -> RolloutAgentLoop:
    """The globally registered loop named ``name``; ``AgentLoopNotFoundError`` otherwise."""
    loop = _REGISTRY.get(name)
    if loop is None:
        raise AgentLoopNotFoundError(name, _REGISTRY.list_names())
    return loop


def list_agent_loops() -> list[str]:
    """Names in the global registry."""
    return _REGISTRY.list_names()
