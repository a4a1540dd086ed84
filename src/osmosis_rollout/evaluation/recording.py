"""Recording: each finished row of a run becomes one cassette row, written at once.

The mock TrainGate already keeps everything a cassette needs for each rollout (the init, the
tools the server declared, every chat request and reply, a failure of the model server); the
runner's row result adds how the row ended and its findings. ``osmosis test --record`` hands
each row result to :meth:`CassetteRecorder.row_finished` as it arrives.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..judging.tape import JudgeTape
from ..protocol import Message, wire
from ..testing.records import RolloutRecord
from ..testing.traingate import MockTrainGate
from ..testing.wire import MockWire, wire_named
from .cassette import (
    CassetteHeader,
    CassetteRow,
    CassetteWriter,
    RecordedOptions,
    encode_history,
    reply_message,
    request_params,
)
from .runner import RowResult, RunOptions

__all__ = ["CassetteRecorder", "describe_llm"]


def describe_llm(backend: object) -> dict[str, Any]:
    """What the header says about the model: the backend kind, its URL (credentials and query
    removed) and model name."""
    kind = type(backend).__name__
    info: dict[str, Any] = {"backend": kind}
    base_url = getattr(backend, "base_url", None)
    if isinstance(base_url, str):
        parts = urlsplit(base_url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        info["url"] = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    model = getattr(backend, "model", None)
    if isinstance(model, str):
        info["model"] = model
    seed = getattr(backend, "seed", None)
    if isinstance(seed, int):
        info["seed"] = seed
    return info


class CassetteRecorder:
    """Writes the cassette of one run: the header at once, then each row as it finishes."""

    def __init__(
        self,
        path: str | Path,
        gate: MockTrainGate,
        options: RunOptions,
        *,
        agent: str | None = None,
        llm: dict[str, Any] | None = None,
        secrets: Iterable[str | None] = (),
        protocol: MockWire | str,
    ) -> None:
        self.gate = gate
        header = CassetteHeader(
            agent=agent,
            protocol=wire_named(protocol).protocol,  # named always: never v1 by default
            llm=llm or {},
            options=RecordedOptions(
                max_turns=options.max_turns,
                max_tokens_total=options.max_tokens_total,
                completion_params=dict(options.completion_params),
            ),
        )
        self.writer = CassetteWriter(path, header, secrets=secrets)
        #: The run's judge calls, kept per rollout while it records (``use_tape``).
        self.judge_tape = JudgeTape(replaying=False)

    @property
    def path(self) -> Path:
        """Where the cassette is written."""
        return self.writer.path

    @property
    def rows_written(self) -> int:
        """How many rows the cassette holds so far."""
        return self.writer.rows_written

    def row_finished(self, result: RowResult) -> None:
        """Write one finished row (rows skipped after a systemic failure never ran: not kept)."""
        if result.status == "SKIPPED":
            return
        record = self.gate.records.get(result.rollout_id)
        if record is None:  # refused before the mock saw it (e.g. an invalid request)
            record = RolloutRecord(rollout_id=result.rollout_id)
        judge = self.judge_tape.take(result.rollout_id)
        self.writer.write_row(cassette_row(result, record, judge=judge))

    def close(self, *, complete: bool = True) -> None:
        """Finish the cassette; ``complete=False`` marks an interrupted run."""
        self.writer.close(complete=complete)


def cassette_row(
    result: RowResult, record: RolloutRecord, *, judge: list[dict[str, Any]] | None = None
) -> CassetteRow:
    """One row of a cassette from what the mock TrainGate saw and how the row ended (and the
    judge calls its grading made)."""
    turns: list[dict[str, Any]] = []
    previous: list[Message] = []
    for number, (request, reply) in enumerate(zip(record.chats, record.replies, strict=False), 1):
        stored = encode_history(previous, request.messages)
        stored["params"] = request_params(request)
        turns.append({"turn": number, "request": stored, "reply": reply})
        previous = [*request.messages, reply_message(reply)]
    init = record.request
    data: dict[str, Any] = {
        "row": result.index,
        "sample": result.sample,
        "rollout_id": result.rollout_id,
        "input": {
            "messages": init.messages if init else [],
            "metadata": init.metadata if init else {},
            "max_turns": init.max_turns if init else 10,
            "max_tokens_total": init.max_tokens_total if init else 8192,
            "completion_params": init.completion_params if init else {},
        },
        "tools": [wire(tool) for tool in record.tools],
        "turns": turns,
        "result": {
            "status": result.status,
            "finish_reason": result.finish_reason,
            "reward": result.reward,
            "error_message": result.error_message,
            **encode_history(previous, result.final_messages),
        },
        "findings": [finding.as_dict() for finding in result.findings],
    }
    if judge:
        data["judge"] = judge
    error = record.backend_error
    if error is not None:
        data["llm_error"] = {
            "kind": error.kind,
            "message": str(error),
            "status_code": error.status_code,
        }
    return CassetteRow.model_validate(data)
