"""``osmosis test --trajectories DIR``: each finished row (each sample) as an ATIF trajectory,
``DIR/<rollout id>/trajectory.json``, the layout ``osmosis serve`` writes under the platform's
artifact root.

The mock TrainGate keeps what a document needs (the init, the tools the server declared, every
reply with its token ids and logprobs, the result); the row result adds its findings. Works with
``--server`` too: the mock is that server's TrainGate.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..atif import TurnRecord, build_trajectory, rollout_secrets
from ..protocol import RolloutResponse, RolloutStatus
from ..testing.records import RolloutRecord
from ..testing.traingate import MockTrainGate
from ..trajectory_files import TrajectoryFiles
from .runner import RowResult

__all__ = ["TrajectoryRecorder"]


class TrajectoryRecorder:
    """Writes one trajectory per finished row, on a background thread."""

    def __init__(
        self,
        directory: str | Path,
        gate: MockTrainGate,
        *,
        agent_name: str = "agent",
        secrets: Iterable[str | None] = (),
    ) -> None:
        self.files = TrajectoryFiles(directory)
        self.gate = gate
        self.agent_name = agent_name
        self.secrets = [s for s in secrets if s]
        self.submitted = 0

    @property
    def directory(self) -> Path:
        """The folder the trajectories go to."""
        return self.files.root

    def row_finished(self, result: RowResult) -> None:
        """Queue the row's trajectory (a row refused at init or skipped never ran: none)."""
        if result.status in ("SKIPPED", "REFUSED"):
            return
        record = self.gate.records.get(result.rollout_id)
        if record is None:
            record = RolloutRecord(rollout_id=result.rollout_id)
        response = record.result or _no_result(result, record)
        turns = [TurnRecord.from_response(reply) for reply in record.replies]
        findings = [finding.as_dict() for finding in result.findings]
        request, tools, name = record.request, list(record.tools), self.agent_name

        def build() -> dict[str, object]:
            return build_trajectory(
                response, turns, request=request, agent_name=name, tools=tools, findings=findings
            )

        self.files.submit(
            result.rollout_id, build, [*self.secrets, *rollout_secrets(record.request)]
        )
        self.submitted += 1

    def close(self) -> None:
        """Write everything queued."""
        self.files.close()


def _no_result(result: RowResult, record: RolloutRecord) -> RolloutResponse:
    """What stands for the result of a row whose server sent none: an ``ERROR`` that keeps
    the conversation as far as the mock saw it."""
    messages = list(record.request.messages) if record.request is not None else []
    if record.chats:
        messages = list(record.chats[-1].messages)
        if record.replies and len(record.replies) == len(record.chats):
            reply = record.replies[-1].message.model_dump(mode="json", exclude_none=True)
            messages.append(reply)
    return RolloutResponse(
        rollout_id=result.rollout_id,
        status=RolloutStatus.ERROR,
        final_messages=messages,
        finish_reason=result.finish_reason or "error",
        error_message=result.error_message,
    )
