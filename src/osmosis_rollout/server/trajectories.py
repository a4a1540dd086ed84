"""``osmosis serve``'s ATIF trajectories: with an artifact root (``ServerSettings.artifact_root``,
the platform's ``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``), every rollout leaves
``<root>/<rollout_id>/trajectory.json`` (``trajectory_files``, docs/trajectories.md).

The scheduler wraps each rollout's chat channel in a :class:`TurnLog`, which keeps every reply
TrainGate sent (token ids and logprobs included), and hands the settled result (with its
grade's reward) to :meth:`TrajectorySaver.save` before delivering it, so the file is usually
there before the platform has the result. The document is built and written on the writer
thread; nothing here can fail a rollout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..agent import ChatBackend
from ..atif import TurnRecord, build_trajectory, rollout_secrets
from ..protocol import (
    CompletionsRequest,
    CompletionsResponse,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
)
from ..redaction import loggable
from ..trajectory_files import TrajectoryFiles

__all__ = ["TrajectorySaver", "TurnLog"]

logger = logging.getLogger("osmosis_rollout.trajectories")


class TurnLog:
    """A chat channel that keeps each turn's reply (``turns``) and is otherwise the channel it
    wraps (every other attribute is the inner one's: ``sends_tools``, ``client``...)."""

    def __init__(self, inner: ChatBackend) -> None:
        self._inner = inner
        self.turns: list[TurnRecord] = []

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse:
        """One turn through the inner channel, recorded when its reply arrives."""
        response = await self._inner.chat_completions(request, request_id=request_id)
        self.turns.append(TurnRecord.from_response(response, at=time.time()))
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TrajectorySaver:
    """Writes one ATIF trajectory per finished rollout under ``root``."""

    def __init__(self, root: Path, agent_name: str) -> None:
        self.files = TrajectoryFiles(root)
        self.agent_name = agent_name

    def save(
        self,
        request: RolloutRequest,
        result: RolloutResponse,
        turns: TurnLog | None,
        tools: Sequence[OpenAIFunctionToolSchema],
    ) -> None:
        """Queue the trajectory of ``request``'s rollout, which ended as ``result``."""
        recorded = list(turns.turns) if turns is not None else []
        tools = list(tools)
        name = self.agent_name

        def build() -> dict[str, Any]:
            return build_trajectory(result, recorded, request=request, agent_name=name, tools=tools)

        try:
            self.files.submit(request.rollout_id, build, rollout_secrets(request))
        except Exception as exc:  # e.g. no thread can be started: the rollout goes on
            logger.error(
                "could not queue the trajectory of rollout %s: %s",
                loggable(request.rollout_id),
                type(exc).__name__,
            )

    def close(self) -> None:
        """Write what is queued (at shutdown)."""
        self.files.close()
