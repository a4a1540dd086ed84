"""Prometheus metrics of one rollout server, served as ``GET /metrics`` (text exposition format).

Each server has a ``CollectorRegistry`` of its own, so two apps in one process (tests, the mock
harness) never share counters. Events (rollouts started and ended, refusals, callbacks, turns,
tool calls) are counted as they happen; levels (in flight, queued, outbox size, retries made by
the TrainGate client) are read from the server's state at scrape time. In flight and queued are
this process's; the outbox is the state's (shared between replicas with ``--state redis://``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ..client import ClientStats
from .registry import RolloutRegistry

__all__ = ["CONTENT_TYPE", "ServerMetrics", "refusal_cause"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Seconds: from a fast local tool to a long LLM turn.
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Refusal causes by status; 503 is split by what the server was doing (see ``refusal_cause``).
_CAUSES = {
    400: "bad_request",
    401: "unauthorized",
    408: "body_timeout",
    409: "conflict",
    413: "too_large",
    422: "invalid",
    429: "queue_full",  # protocol v2's word for v1's 503
    500: "get_tools_failed",
}


def refusal_cause(status: int, *, draining: bool, running: bool) -> str:
    """The ``cause`` label of an init answered with ``status`` (not 202)."""
    if status == 503:
        if draining:
            return "draining"
        return "queue_full" if running else "not_running"
    return _CAUSES.get(status, f"http_{status}")


class ServerMetrics:
    """The counters, gauges and histograms of one server, and its ``/metrics`` body."""

    def __init__(
        self,
        registry: RolloutRegistry,
        *,
        client_stats: Callable[[], ClientStats | None],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.started = Counter(
            "osmosis_rollouts_started", "Rollouts whose agent started running.", registry=r
        )
        self.completed = Counter(
            "osmosis_rollouts_completed",
            "Rollouts that ended COMPLETED, by finish reason.",
            ["finish_reason"],
            registry=r,
        )
        self.errored = Counter(
            "osmosis_rollouts_errored",
            "Rollouts that ended ERROR, by finish reason (error, timeout, cancelled...).",
            ["finish_reason"],
            registry=r,
        )
        self.rejected = Counter(
            "osmosis_rollouts_rejected",
            "Inits answered with an error instead of 202, by cause.",
            ["cause"],
            registry=r,
        )
        self.callbacks = Counter(
            "osmosis_callbacks",
            "Completion callbacks handled: delivered to TrainGate, or written to the outbox.",
            ["outcome"],
            registry=r,
        )
        self.llm_seconds = Histogram(
            "osmosis_llm_turn_seconds",
            "Time of one LLM turn (chat call to TrainGate), retries included.",
            buckets=_BUCKETS,
            registry=r,
        )
        self.tool_seconds = Histogram(
            "osmosis_tool_call_seconds",
            "Time of one tool call, as recorded on the rollout's context.",
            buckets=_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "osmosis_tokens",
            "Tokens of LLM turns, by kind (prompt, completion).",
            ["kind"],
            registry=r,
        )
        # Looked up once: `labels()` costs a lock and a dict lookup, twice every turn.
        self._prompt_tokens = self.tokens.labels(kind="prompt")
        self._completion_tokens = self.tokens.labels(kind="completion")
        in_flight = Gauge(
            "osmosis_rollouts_in_flight",
            "Rollouts running or delivering their callback.",
            registry=r,
        )
        in_flight.set_function(lambda: registry.active)
        queued = Gauge(
            "osmosis_rollouts_queued", "Accepted rollouts waiting for a slot.", registry=r
        )
        queued.set_function(lambda: registry.queued)
        self.outbox_size = Gauge(
            "osmosis_outbox_size",
            "Undelivered callbacks in the outbox (counted when scraped).",
            registry=r,
        )
        r.register(_ClientCollector(client_stats))

    # -- what the server and the rollouts report ----------------------------------------------

    def rollout_ended(self, status: str, finish_reason: str | None) -> None:
        """Count one rollout's end (``status`` COMPLETED or ERROR)."""
        counter = self.completed if status == "COMPLETED" else self.errored
        counter.labels(finish_reason=finish_reason or "none").inc()

    def turn(self, latency_s: float, prompt_tokens: int, completion_tokens: int) -> None:
        """One LLM turn (the context's observer hook)."""
        self.llm_seconds.observe(latency_s)
        self._prompt_tokens.inc(prompt_tokens)
        self._completion_tokens.inc(completion_tokens)

    def tool(self, latency_s: float) -> None:
        """One tool call (the context's observer hook)."""
        self.tool_seconds.observe(latency_s)

    def exposition(self) -> bytes:
        """The ``/metrics`` body."""
        return generate_latest(self.registry)


class _ClientCollector(Collector):
    """Retries counted by the TrainGate client, read when scraped."""

    def __init__(self, stats: Callable[[], ClientStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        retries = CounterMetricFamily(
            "osmosis_traingate_retries",
            "Retried calls to TrainGate, by call (chat turn or completion callback).",
            labels=["call"],
        )
        callback = stats.callback_retries if stats is not None else 0
        total = stats.retries if stats is not None else 0
        retries.add_metric(["chat"], total - callback)
        retries.add_metric(["callback"], callback)
        yield retries
