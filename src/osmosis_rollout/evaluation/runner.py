"""The batch runner behind ``osmosis test``: dataset rows -> rollouts -> per-row results.

Rows run concurrently through a :class:`Harness` (the real server app and the mock TrainGate).
A systemic LLM-backend failure (bad key, unreachable) stops the batch early: the rows not yet
started are reported as skipped instead of each failing the same way.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..endpoint.tool_history import counts_from_turns
from ..errors import OsmosisError
from ..protocol import Message, RolloutMetrics
from ..testing.harness import Harness, RolloutOutcome, ServerUnreachable
from ..testing.records import Finding
from ..testing.traingate import name_gate_urls
from .collector import lighter_gc
from .trainability import untrainable_codes

__all__ = ["BatchReport", "RowInput", "RowResult", "RunOptions", "run_batch", "summarise"]


@dataclass(frozen=True)
class RowInput:
    """One rollout to run: the row's number (1-based), its messages and metadata."""

    index: int
    messages: list[Message]
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The row's ``mock_replies``: the mock LLM's scripted replies for it.
    replies: list[Any] | None = None
    #: Which of the row's ``--samples`` this rollout is (0-based).
    sample: int = 0

    @property
    def key(self) -> str:
        """What seeds the mock LLM's replies: the row and sample, never a run's random id."""
        return f"{self.index}/{self.sample}" if self.sample else str(self.index)


@dataclass(frozen=True)
class RunOptions:
    """Per-rollout request settings (``--max-turns``, ``--temperature``, ``--max-tokens``...)."""

    max_turns: int = 10
    max_tokens_total: int = 8192
    completion_params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0
    concurrency: int = 8


@dataclass
class RowResult:
    """What one row produced; ``passed`` means COMPLETED with no findings."""

    index: int
    rollout_id: str
    status: str  # COMPLETED, ERROR, NO_RESULT (no callback), REFUSED (init failed), SKIPPED
    finish_reason: str | None = None
    error_message: str | None = None
    reward: float | None = None
    turns: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    latency_ms: float = 0.0
    llm_ms: float = 0.0
    tool_ms: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    final_messages: list[Message] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Each LLM turn's finish_reason as TrainGate answered it (``"length"``: cut by max_tokens).
    turn_finish_reasons: list[str | None] = field(default_factory=list)
    #: The dataset row's metadata as sent with the rollout (``ground_truth`` included).
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The rollout's debug trace, when the server wrote one (``--debug-dir``).
    trace: str | None = None
    #: The ``kind`` of the LLM backend error that failed the row, if one did.
    llm_error: str | None = None
    #: The result's ``extra_fields`` (``reward_components`` among them, if the agent gave any).
    extra_fields: dict[str, Any] = field(default_factory=dict)
    #: Which of its row's ``--samples`` this rollout was (0-based; the group is the row).
    sample: int = 0
    #: Per tool: ``[calls, errors, timeouts]`` (errors: the tool raised or timed out).
    tool_counts: dict[str, list[int]] = field(default_factory=dict)
    #: How many of ``tool_calls`` the server counted from the history a harness sent back
    #: (tools run outside the context, behind the per-rollout endpoint).
    tool_calls_from_history: int = 0

    @property
    def reward_components(self) -> dict[str, float]:
        """The reward's named parts, as ``ctx.complete(reward_components=...)`` gave them."""
        components = self.extra_fields.get("reward_components")
        return dict(components) if isinstance(components, dict) else {}

    @property
    def tool_errors(self) -> dict[str, int]:
        """The failed calls of each tool that failed at least once."""
        return {name: c[1] for name, c in self.tool_counts.items() if c[1]}

    @property
    def tool_schema_errors(self) -> dict[str, int]:
        """Per tool, the failed calls whose arguments the schema ``get_tools`` declared allows
        but the function refused (the metrics' ``tool_schema_errors``): the agent's schema and
        function disagree."""
        counts = self.metrics.get("tool_schema_errors")
        if not isinstance(counts, dict):
            return {}
        return {str(k): v for k, v in counts.items() if isinstance(v, int) and v > 0}

    @property
    def tool_error_count(self) -> int:
        """How many tool calls of this rollout raised or timed out."""
        return sum(c[1] for c in self.tool_counts.values())

    @property
    def ground_truth(self) -> Any:
        """The row's ``ground_truth``, if the dataset had one."""
        return self.metadata.get("ground_truth")

    @property
    def passed(self) -> bool:
        """COMPLETED with no protocol findings."""
        return self.status == "COMPLETED" and not self.findings

    @property
    def other_ms(self) -> float:
        """Time spent in neither the LLM nor tools: the agent's own code and the SDK."""
        return max(0.0, self.latency_ms - self.llm_ms - self.tool_ms)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object written to ``--output`` for this row."""
        return {
            "type": "row",
            "row": self.index,
            "group": self.index,
            "sample": self.sample,
            "rollout_id": self.rollout_id,
            "status": self.status,
            "passed": self.passed,
            "finish_reason": self.finish_reason,
            "error_message": self.error_message,
            "llm_error": self.llm_error,
            "reward": self.reward,
            "reward_components": self.reward_components,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_calls_from_history": self.tool_calls_from_history,
            "prompt_tokens": self.prompt_tokens,
            "response_tokens": self.response_tokens,
            "latency_ms": round(self.latency_ms, 3),
            "llm_ms": round(self.llm_ms, 3),
            "tool_ms": round(self.tool_ms, 3),
            "tool_errors": self.tool_errors,
            "tool_timeouts": {n: c[2] for n, c in self.tool_counts.items() if c[2]},
            "tool_counts": self.tool_counts,
            "other_ms": round(self.other_ms, 3),
            "turn_finish_reasons": self.turn_finish_reasons,
            "findings": [f.as_dict() for f in self.findings],
            "metrics": self.metrics,
            "ground_truth": self.ground_truth,
            "metadata": self.metadata,
            "extra_fields": self.extra_fields,
            "trace": self.trace,
            "final_messages": self.final_messages,  # last: readers can index the rest cheaply
        }


@dataclass
class BatchReport:
    """Every row's result, in dataset order, plus how the batch ended."""

    rows: list[RowResult]
    wall_s: float
    stopped_early: str | None = None
    #: How many of ``rows`` a ``--resume`` kept from the results file (not run in ``wall_s``).
    resumed: int = 0


def result_from_outcome(index: int, outcome: RolloutOutcome, *, gate_url: str = "") -> RowResult:
    """Turn what the mock TrainGate saw into a row result (``gate_url``: the mock's base URL,
    named as such in error messages)."""
    row = RowResult(
        index=index,
        rollout_id=outcome.rollout_id,
        status="NO_RESULT",
        latency_ms=outcome.wall_ms,
        findings=list(outcome.findings),
        turn_finish_reasons=[r.choices[0].finish_reason for r in outcome.record.replies],
    )
    backend_error = outcome.record.backend_error
    if not outcome.accepted:
        row.status, row.error_message = "REFUSED", outcome.init_error
        return row
    result = outcome.result
    if result is None:  # the turns it asked for were served all the same
        row.error_message = "the server sent no completion callback"
        served_figures(row, outcome)
        return row
    row.status = result.status.value
    row.finish_reason = result.finish_reason
    row.error_message = name_gate_urls(result.error_message, gate_url)
    if backend_error is not None:
        row.error_message = f"LLM backend ({backend_error.kind}): {backend_error}"
        row.llm_error = backend_error.kind
    row.reward = result.reward
    row.extra_fields = dict(result.extra_fields or {})
    row.final_messages = result.final_messages
    if result.metrics is not None:
        m = result.metrics
        row.turns, row.tool_calls = m.num_llm_calls, m.num_tool_calls
        row.prompt_tokens, row.response_tokens = m.prompt_tokens, m.response_tokens
        row.llm_ms, row.tool_ms = m.llm_latency_ms, tool_wall_ms(m)
        row.latency_ms = m.total_latency_ms
        row.metrics = m.model_dump()
        row.tool_counts = tool_counts(m)
        observed = (m.model_extra or {}).get("tool_calls_from_history")
        row.tool_calls_from_history = observed if isinstance(observed, int) else 0
    served_figures(row, outcome)
    return row


def served_figures(row: RowResult, outcome: RolloutOutcome) -> None:
    """A row's turns, tokens and model time as the mock TrainGate served them, not as the
    server's metrics say: a server we did not write may send none (the official SDK's sends
    ``{}``), or count otherwise. The server's own metrics stay in ``row.metrics`` as reported;
    tool calls and the rollout's time are its to tell, taken from the mock only when it said
    nothing (the calls the model asked for, each tool's errors as its results in the later
    turns read, the wall time of the rollout)."""
    replies = outcome.record.replies
    if not replies:
        return
    row.turns = len(replies)
    row.prompt_tokens = sum(r.usage.prompt_tokens for r in replies)
    row.response_tokens = sum(r.usage.completion_tokens for r in replies)
    served_ms = outcome.record.served_ms
    if served_ms:
        row.llm_ms = sum(served_ms)
    metrics = outcome.result.metrics if outcome.result is not None else None
    told = metrics.model_fields_set if metrics is not None else set()
    if "num_tool_calls" not in told:  # a server that counted them said so, 0 included
        row.tool_calls = sum(len(r.choices[0].message.tool_calls or ()) for r in replies)
        if not row.tool_counts:  # per tool, with the errors its results say, from the turns
            row.tool_counts = counts_from_turns(
                [chat.messages for chat in outcome.record.chats],
                [
                    [c.model_dump(exclude_none=True) for c in r.choices[0].message.tool_calls or ()]
                    for r in replies
                ],
                outcome.result.final_messages if outcome.result is not None else (),
            )
            row.tool_calls_from_history = row.tool_calls
    if "total_latency_ms" not in told:
        row.latency_ms = outcome.wall_ms


def tool_wall_ms(metrics: RolloutMetrics) -> float:
    """The rollout time spent in tools: wall time (parallel calls once), not their sum."""
    wall = (metrics.model_extra or {}).get("tool_wall_ms")
    return float(wall) if isinstance(wall, int | float) else metrics.tool_latency_ms


def tool_counts(metrics: RolloutMetrics) -> dict[str, list[int]]:
    """``[calls, errors, timeouts]`` per tool as the context counted them (none from a server
    older than the counts, or an agent that runs its tools without a ``Toolbox``)."""
    counts = (metrics.model_extra or {}).get("tool_counts")
    if not isinstance(counts, dict):
        return {}
    return {
        str(name): [int(n) for n in c[:3]]
        for name, c in counts.items()
        if isinstance(c, list) and len(c) >= 3 and all(isinstance(n, int) for n in c[:3])
    }


def rollout_id_of(row: RowInput, run_id: str) -> str:
    """``row-<n>-<run_id>``, and ``row-<n>-s<k>-<run_id>`` for a row's sample k > 0."""
    sample = f"s{row.sample}-" if row.sample else ""
    return f"row-{row.index}-{sample}{run_id}"


async def run_batch(
    harness: Harness,
    rows: Sequence[RowInput],
    options: RunOptions,
    *,
    on_result: Callable[[RowResult], None] | None = None,
    run_id: str | None = None,
) -> BatchReport:
    """Run every row (at most ``options.concurrency`` at once); results keep dataset order.

    ``run_id`` ends every rollout id (``row-<n>-<run_id>``); one is made up when not given, and
    ``--jobs`` workers share their parent's so a run's ids read as one run.
    """
    run_id = run_id or uuid.uuid4().hex[:8]
    results: dict[int, RowResult] = {}
    limiter = anyio.CapacityLimiter(max(1, options.concurrency))
    bind = getattr(harness.gate.backend, "bind_rollout", None)
    stopped: list[str] = []  # why the batch stopped early, when the server went away
    started = time.perf_counter()

    async def one(position: int, row: RowInput) -> None:
        async with limiter:
            rollout_id = rollout_id_of(row, run_id)
            if harness.gate.systemic_error is not None or stopped:
                result = RowResult(
                    index=row.index,
                    rollout_id=rollout_id,
                    status="SKIPPED",
                    error_message="not run: the batch stopped early",
                )
            else:
                if bind is not None:
                    bind(rollout_id, row.key, row.replies)
                try:
                    outcome = await harness.run(
                        row.messages,
                        rollout_id=rollout_id,
                        completion_params=options.completion_params,
                        metadata=row.metadata,
                        max_turns=options.max_turns,
                        max_tokens_total=options.max_tokens_total,
                        timeout_s=options.timeout_s,
                    )
                except ServerUnreachable as exc:  # gone for every row: stop, don't send the rest
                    stopped.append(str(exc))
                    result = RowResult(
                        index=row.index,
                        rollout_id=rollout_id,
                        status="REFUSED",
                        error_message=str(exc),
                    )
                except OsmosisError as exc:  # this row cannot run; the others still can
                    result = RowResult(
                        index=row.index,
                        rollout_id=rollout_id,
                        status="REFUSED",
                        error_message=str(exc),
                    )
                else:
                    result = result_from_outcome(row.index, outcome, gate_url=harness.gate.base_url)
                    trace = harness.trace_path(rollout_id)
                    result.trace = str(trace) if trace is not None else None
        result.metadata = row.metadata
        result.sample = row.sample
        results[position] = result
        if on_result is not None:
            on_result(result)

    with lighter_gc():
        async with anyio.create_task_group() as tasks:
            for position, row in enumerate(rows):
                tasks.start_soon(one, position, row)
    systemic = harness.gate.systemic_error
    reason = f"LLM backend ({systemic.kind}): {systemic}" if systemic else None
    return BatchReport(
        rows=[results[i] for i in range(len(rows))],
        wall_s=time.perf_counter() - started,
        stopped_early=reason or (stopped[0] if stopped else None),
    )


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[k]


def _component_means(rows: Sequence[RowResult]) -> dict[str, float]:
    """Each reward component's mean over the rollouts that gave it."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        for name, value in row.reward_components.items():
            sums.setdefault(name, []).append(value)
    return {name: round(sum(v) / len(v), 6) for name, v in sums.items()}


def _judge_part(rows: Sequence[RowResult]) -> dict[str, Any]:
    """The judge's share, apart from the policy's: its time and tokens (the ``judge_*``
    metrics a verdict leaves), and the rollouts a failed judge left without a reward."""
    from ..grading import judge_failed

    def total(name: str) -> float:
        return sum(float(r.metrics.get(name) or 0) for r in rows)

    return {
        "judge_errors": sum(1 for r in rows if judge_failed(r.error_message)),
        "judge_calls": int(total("judge_calls")),
        "judge_ms": round(total("judge_ms"), 3),
        "judge_prompt_tokens": int(total("judge_prompt_tokens")),
        "judge_response_tokens": int(total("judge_response_tokens")),
    }


def summarise(report: BatchReport) -> dict[str, Any]:
    """The batch summary: counts, findings by code, latency percentiles, tokens, throughput."""
    rows = report.rows
    ran = [r for r in rows if r.status != "SKIPPED"]
    latencies = [r.latency_ms for r in ran]
    findings: dict[str, int] = {}
    for r in rows:
        for f in r.findings:
            findings[f.code] = findings.get(f.code, 0) + 1
    rewards = [r.reward for r in rows if r.reward is not None]
    llm_errors: dict[str, int] = {}
    for r in rows:
        if r.llm_error is not None:
            llm_errors[r.llm_error] = llm_errors.get(r.llm_error, 0) + 1
    blocking = untrainable_codes(findings)
    return {
        "type": "summary",
        "version": 1,  # the shape's version (docs/json.md)
        "rows": len(rows),
        "passed": sum(1 for r in rows if r.passed),
        "failed": sum(1 for r in rows if not r.passed),
        "completed": sum(1 for r in rows if r.status == "COMPLETED"),
        "errors": sum(1 for r in rows if r.status in ("ERROR", "NO_RESULT", "REFUSED")),
        "skipped": len(rows) - len(ran),
        "findings": findings,
        "llm_errors": llm_errors,
        # The verdict: no finding that breaks a trajectory for training (evaluation.trainability),
        # and some trajectory at all (a run whose every rollout failed has none to train on).
        "trainable": not blocking and (not ran or any(r.status == "COMPLETED" for r in ran)),
        "untrainable_findings": blocking,
        "latency_ms_p50": round(_percentile(latencies, 0.50), 3),
        "latency_ms_p95": round(_percentile(latencies, 0.95), 3),
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "response_tokens": sum(r.response_tokens for r in rows),
        "tool_calls": sum(r.tool_calls for r in rows),
        "tool_calls_from_history": sum(r.tool_calls_from_history for r in rows),
        "tool_errors": sum(r.tool_error_count for r in rows),
        **_judge_part(rows),
        "mean_reward": round(sum(rewards) / len(rewards), 6) if rewards else None,
        "reward_components": _component_means(rows),
        "wall_s": round(report.wall_s, 3),
        "rollouts_per_s": (
            round((len(ran) - report.resumed) / report.wall_s, 3) if report.wall_s > 0 else 0.0
        ),
        "resumed": report.resumed,
        "stopped_early": report.stopped_early,
    }
