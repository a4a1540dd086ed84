"""``ReplayBackend``: answer an agent with a cassette's recorded replies, offline, and say exactly
where its behaviour left the recording.

Each rollout is matched to its recorded row by its input (the init's messages and metadata). At
every turn the agent's request must equal the recorded one: the same messages, sampling
parameters and tools. The first difference becomes a ``replay_diverged`` finding naming the row,
the turn, the message and field, with a short diff. In ``strict`` mode the row then stops (the
model "fails"); in ``lenient`` mode the backend answers with the nearest recorded turn and says so
in the finding. When a rollout completes, its status, finish reason, reward and final messages
are compared with the recording too.
"""

from __future__ import annotations

import difflib
import json
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigError, LLMBackendError
from ..findings import REPLAY_DIVERGED
from ..judging.tape import JudgeTape, use_tape
from ..protocol import CompletionsRequest, CompletionsResponse, Message, RolloutResponse
from ..testing.records import RolloutRecord
from .cassette import Cassette, CassetteRow, read_cassette, request_params
from .divergence import Divergence, first_difference
from .runner import RowInput, RunOptions

if TYPE_CHECKING:
    from ..agent import RolloutAgentLoop
    from .runner import RowResult

__all__ = ["ReplayBackend", "ReplayMode", "ReplayReport"]

ReplayMode = Literal["strict", "lenient"]
_MODES = ("strict", "lenient")


@dataclass
class _Replay:
    """One rollout being replayed: its recorded row and what has happened so far."""

    row: CassetteRow
    requests: list[list[Message]]
    diverged: bool = False
    lenient_answers: int = 0


@dataclass
class ReplayReport:
    """What :meth:`ReplayBackend.replay` found: every row's result, in cassette order."""

    rows: list[RowResult]
    stopped_early: str | None = None
    divergences: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every row completed as recorded, with no findings."""
        return bool(self.rows) and all(r.passed for r in self.rows) and not self.stopped_early

    def explain(self) -> str:
        """A readable account of every row that did not pass, for an assertion message."""
        lines = []
        for r in self.rows:
            if r.passed:
                continue
            error = f" ({r.error_message})" if r.error_message else ""
            lines.append(f"row {r.index}: {r.status}{error}")
            for f in r.findings:
                lines.append(f"  {f.code}: {f.message}")
                diff = (f.details or {}).get("diff")
                if diff:
                    lines.extend("    " + line for line in diff.splitlines())
        if self.stopped_early:
            lines.append(f"stopped early: {self.stopped_early}")
        return "\n".join(lines) or "no rows replayed"


class ReplayBackend:
    """An LLM backend that serves a cassette's recorded replies instead of a model.

    ``ReplayBackend(path)`` reads the cassette (a :class:`~.cassette.CassetteError` says what is
    wrong with it). Use it as any backend (``Harness(agent, backend=ReplayBackend(path))``), or
    replay the whole cassette in one line: ``report = await ReplayBackend(path).replay(agent)``
    then ``assert report.passed, report.explain()``.
    """

    def __init__(self, cassette: str | Path | Cassette, *, mode: ReplayMode = "strict") -> None:
        if mode not in _MODES:
            raise ConfigError(f"unknown replay mode {mode!r}; choose strict or lenient")
        self.cassette = cassette if isinstance(cassette, Cassette) else read_cassette(cassette)
        self.mode: ReplayMode = mode
        self._unbound: dict[str, deque[CassetteRow]] = {}
        #: rollout id -> the sample it runs (``bind_rollout``), to replay that sample's row.
        self._samples: dict[str, int] = {}
        #: The recorded judge calls: a replay answers them without a request (``use_tape``).
        self.judge_tape = JudgeTape(replaying=True)
        for row in sorted(self.cassette.rows, key=lambda r: (r.row, r.sample)):
            key = _input_key(row.input.messages, row.input.metadata)
            self._unbound.setdefault(key, deque()).append(row)
            self.judge_tape.load(row.judge)
        self._live: dict[str, _Replay] = {}

    # -- what to run ------------------------------------------------------------------------

    def rows(self) -> list[RowInput]:
        """The recorded rows as runner input: the same messages and metadata, in row order."""
        return [
            RowInput(
                index=r.row, messages=r.input.messages, metadata=r.input.metadata, sample=r.sample
            )
            for r in sorted(self.cassette.rows, key=lambda r: (r.row, r.sample))
        ]

    def options(self, *, timeout_s: float = 300.0, concurrency: int = 8) -> RunOptions:
        """The run options the cassette was recorded with."""
        recorded = self.cassette.header.options
        return RunOptions(
            max_turns=recorded.max_turns,
            max_tokens_total=recorded.max_tokens_total,
            completion_params=dict(recorded.completion_params),
            timeout_s=timeout_s,
            concurrency=concurrency,
        )

    async def replay(self, agent: RolloutAgentLoop, *, concurrency: int = 8) -> ReplayReport:
        """Replay every recorded row through a :class:`~.harness.Harness` (the real server and
        mock TrainGate, in process) and report each row's result and findings."""
        from ..testing.harness import Harness
        from .runner import run_batch

        options = self.options(concurrency=concurrency)
        with use_tape(self.judge_tape):
            async with Harness(agent, backend=self, max_concurrent=concurrency) as harness:
                report = await run_batch(harness, self.rows(), options)
        return ReplayReport(rows=report.rows, stopped_early=report.stopped_early)

    # -- the LLM backend --------------------------------------------------------------------

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        """The recorded reply to this turn, once the request is checked against the recording."""
        replay = self._bind(record)
        index = len(record.replies)
        turns = replay.row.turns
        if index < len(turns):
            recorded = replay.requests[index]
            if request.messages == recorded and (index or self._same_tools(replay, record)):
                params = request_params(request)
                if params == turns[index].request.params:
                    return turns[index].reply
            divergence = self._request_divergence(replay, record, request, index)
            if divergence is None:  # equal but for redacted secrets
                return turns[index].reply
        elif replay.row.llm_error is not None and index == len(turns):
            error = replay.row.llm_error
            raise LLMBackendError(
                f"(recorded) {error.message}", kind=error.kind, status_code=error.status_code
            )
        else:
            divergence = Divergence(
                row=replay.row.row,
                turn=index + 1,
                field="turn",
                recorded=len(turns),
                replayed=index + 1,
                note=f"the agent asked for turn {index + 1}; the recording ended after "
                f"{len(turns)} turn(s)",
            )
        return self._diverged(replay, record, request, divergence)

    def rollout_completed(self, record: RolloutRecord, response: RolloutResponse) -> None:
        """Compare a rollout's result with the recording (called by the mock TrainGate)."""
        try:
            replay = self._bind(record)
        except LLMBackendError as exc:  # a row the cassette lacks, that never asked the model
            record.add(REPLAY_DIVERGED, str(exc), details={"field": "input"})
            return
        if replay.diverged or response.finish_reason == "cancelled":
            return  # already reported, or stopped from outside (Ctrl-C at the REPL, shutdown)
        divergence = _result_divergence(replay, record, response)
        if divergence is not None:
            replay.diverged = True
            _add_finding(record, divergence)

    # -- matching ---------------------------------------------------------------------------

    def _bind(self, record: RolloutRecord) -> _Replay:
        """The recorded row this rollout replays, chosen at its first call by its input."""
        replay = self._live.get(record.rollout_id)
        if replay is not None:
            return replay
        init = record.request
        messages = init.messages if init is not None else []
        metadata = init.metadata if init is not None else {}
        row = self.take_row(messages, metadata, self._samples.pop(record.rollout_id, None))
        if row is None:
            raise LLMBackendError(
                f"rollout {record.rollout_id!r}: no row of the cassette {self.cassette.path} "
                "starts with these messages and metadata (a changed dataset?). Record the "
                "cassette again, or replay without --dataset to run the recorded rows",
                kind="replay_unknown_row",
            )
        replay = _Replay(row=row, requests=row.request_messages())
        self._live[record.rollout_id] = replay
        return replay

    def bind_rollout(self, rollout_id: str, key: str, replies: list[Any] | None = None) -> None:
        """``rollout_id`` runs row and sample ``key`` (``"3"``, ``"3/1"``: ``RowInput.key``):
        it replays that sample's recorded row."""
        self._samples[rollout_id] = int(key.rpartition("/")[2]) if "/" in key else 0

    def take_row(
        self, messages: list[Message], metadata: dict[str, Any], sample: int | None = None
    ) -> CassetteRow | None:
        """The recorded row a rollout with this input (and ``sample``, when given) replays,
        taken (a second rollout of the same input gets the next one); None when the cassette
        has none. ``--jobs`` binds each row in its parent this way, so workers replay the rows
        one process would."""
        queue = self._unbound.get(_input_key(messages, metadata))
        if queue:
            if sample is not None:
                for row in queue:
                    if row.sample == sample:
                        queue.remove(row)
                        return row
            return queue.popleft()
        if self.mode == "lenient" and self.cassette.rows:
            return _nearest_row(self.cassette.rows, messages, metadata)
        return None

    def _same_tools(self, replay: _Replay, record: RolloutRecord) -> bool:
        if record.tools_wire is not None and record.tools_wire == replay.row.tools:
            return True  # as sent: no need to dump each tool again
        return [_wire_tool(t) for t in record.tools] == replay.row.tools

    def _request_divergence(
        self, replay: _Replay, record: RolloutRecord, request: CompletionsRequest, index: int
    ) -> Divergence | None:
        row = replay.row.row
        found = first_difference(replay.requests[index], request.messages)
        if found is not None:
            path, recorded, replayed = found
            message = int(path[1 : path.index("]")])
            return Divergence(row, index + 1, f"messages{path}", recorded, replayed, message)
        found = first_difference(replay.row.turns[index].request.params, request_params(request))
        if found is not None:
            path, recorded, replayed = found
            return Divergence(row, index + 1, path.lstrip("."), recorded, replayed)
        if index == 0:
            tools = [_wire_tool(t) for t in record.tools]
            found = first_difference(replay.row.tools, tools)
            if found is not None:
                path, recorded, replayed = found
                return Divergence(row, 1, f"tools{path}", recorded, replayed)
        return None

    def _diverged(
        self,
        replay: _Replay,
        record: RolloutRecord,
        request: CompletionsRequest,
        divergence: Divergence,
    ) -> CompletionsResponse:
        """Report the divergence; stop the row (strict) or answer by nearest match (lenient)."""
        first = not replay.diverged
        replay.diverged = True
        if self.mode == "strict":
            if first:
                _add_finding(record, divergence)
            raise LLMBackendError(
                f"stopped at turn {divergence.turn}: the agent's request differs from the "
                "recording (--replay-mode lenient goes on)",
                kind="replay_diverged",
            )
        turns = replay.row.turns
        if not turns:
            if first:
                _add_finding(record, divergence)
            raise LLMBackendError(
                f"replay diverged: {divergence.summary()}; row {replay.row.row} has no recorded "
                "turn to answer with",
                kind="replay_diverged",
            )
        chosen = _nearest_turn(replay.requests, request.messages, len(record.replies))
        replay.lenient_answers += 1
        if first:
            note = (
                f"; answered with recorded turn {chosen + 1} (nearest match, --replay-mode lenient)"
            )
            _add_finding(record, divergence, note)
        return turns[chosen].reply


def _add_finding(record: RolloutRecord, divergence: Divergence, note: str = "") -> None:
    record.add(
        REPLAY_DIVERGED,
        divergence.summary() + note,
        turn=divergence.turn,
        details=divergence.as_dict(),
    )


def _wire_tool(tool: Any) -> dict[str, Any]:
    from ..protocol import wire

    return wire(tool)


def _input_key(messages: list[Message], metadata: dict[str, Any]) -> str:
    return json.dumps([messages, metadata], sort_keys=True, separators=(",", ":"), default=str)


def _nearest_row(
    rows: list[CassetteRow], messages: list[Message], metadata: dict[str, Any]
) -> CassetteRow:
    """Lenient mode, unknown input: the recorded row whose input text is most alike."""
    key = _input_key(messages, metadata)

    def likeness(row: CassetteRow) -> float:
        other = _input_key(row.input.messages, row.input.metadata)
        return difflib.SequenceMatcher(None, key, other, autojunk=False).quick_ratio()

    return max(rows, key=likeness)


def _nearest_turn(requests: list[list[Message]], messages: list[Message], index: int) -> int:
    """The recorded turn whose messages share the longest prefix with ``messages``; ties go to
    the turn closest to ``index``."""

    def score(i: int) -> tuple[int, int]:
        common = 0
        for recorded, live in zip(requests[i], messages, strict=False):
            if recorded != live:
                break
            common += 1
        return common, -abs(i - index)

    return max(range(len(requests)), key=score)


def _result_divergence(
    replay: _Replay, record: RolloutRecord, response: RolloutResponse
) -> Divergence | None:
    row = replay.row
    recorded = row.result
    turns = len(record.replies)
    if turns < len(row.turns):
        return Divergence(
            row.row,
            turns or None,
            "turns",
            len(row.turns),
            turns,
            note=f"the agent finished after {turns} turn(s); the recording made {len(row.turns)}",
        )
    if response.status.value != recorded.status:
        return Divergence(row.row, None, "status", recorded.status, response.status.value)
    if response.finish_reason != recorded.finish_reason:
        return Divergence(
            row.row, None, "finish_reason", recorded.finish_reason, response.finish_reason
        )
    if not _same_reward(recorded.reward, response.reward):
        return Divergence(row.row, None, "reward", recorded.reward, response.reward)
    final = row.final_messages()
    if response.final_messages != final:
        found = first_difference(final, response.final_messages)
        if found is not None:
            path, before, after = found
            message = int(path[1 : path.index("]")])
            return Divergence(row.row, None, f"final_messages{path}", before, after, message)
    return None


def _same_reward(recorded: float | None, replayed: float | None) -> bool:
    if recorded is None or replayed is None:
        return recorded is replayed
    return math.isclose(recorded, replayed, rel_tol=1e-9, abs_tol=1e-12)
