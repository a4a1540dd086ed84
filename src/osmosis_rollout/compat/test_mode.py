"""The legacy test-mode Python API (``osmosis_ai.rollout.test_mode``) over our test engine.

``DatasetReader`` reads the files ``osmosis test`` reads and gives the legacy row dicts;
``ExternalLLMClient`` is an OpenAI-compatible model (``OPENAI_BASE_URL``, OpenAI's by default)
with the legacy constructor; ``LocalTestRunner`` runs rows the way ``osmosis test`` does: each row
is a real rollout through our server app and the mock TrainGate (``testing.Harness`` driven by
``evaluation.runner.run_batch``), so the agent runs exactly as it is served and protocol
problems are caught. The legacy SDK sent nothing through a server; results keep the legacy shape.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DatasetError, LLMBackendError
from ..protocol import (
    CompletionsRequest,
    CompletionsResponse,
    Message,
    OpenAIFunctionToolSchema,
    RolloutMetrics,
    RolloutRequest,
    RolloutStatus,
)
from ..results import CompletionsResult, RolloutResult

__all__ = [
    "REQUIRED_COLUMNS",
    "DatasetParseError",
    "DatasetReader",
    "DatasetRow",
    "DatasetValidationError",
    "ExternalLLMClient",
    "LocalTestBatchResult",
    "LocalTestRunResult",
    "LocalTestRunner",
    "ProviderError",
    "dataset_row_to_request",
]

#: The legacy names for our errors: a file that cannot be read or a bad row is a ``DatasetError``,
#: a failed model call an ``LLMBackendError``.
DatasetParseError = DatasetError
DatasetValidationError = DatasetError
ProviderError = LLMBackendError

REQUIRED_COLUMNS = ["ground_truth", "user_prompt", "system_prompt"]
#: A legacy row: ``system_prompt``, ``user_prompt``, ``ground_truth`` and any other columns.
DatasetRow = dict[str, Any]


class DatasetReader:
    """The legacy reader: ``read(limit, offset)``, ``iter_rows(limit, offset)`` and ``len()``.

    Rows are checked as ``osmosis test`` checks them (``.jsonl``, ``.json``, ``.csv``,
    ``.parquet``; a ``messages`` column is accepted too); a bad row is a ``DatasetError``.
    """

    def __init__(self, file_path: str | os.PathLike[str]) -> None:
        self.file_path = Path(file_path)
        if not self.file_path.exists():
            raise FileNotFoundError(f"Dataset file not found: {file_path}")
        self._count: int | None = None

    def read(self, limit: int | None = None, offset: int = 0) -> list[DatasetRow]:
        """Rows ``offset`` (0-based) onwards, at most ``limit``."""
        from ..evaluation.datasets import load_dataset

        if offset >= len(self):
            return []
        rows = load_dataset(self.file_path, limit=limit, offset=offset)
        return [_legacy_row(row.messages, row.metadata) for row in rows]

    def iter_rows(self, limit: int | None = None, offset: int = 0) -> Iterator[DatasetRow]:
        """The same rows as :meth:`read`, one at a time."""
        yield from self.read(limit=limit, offset=offset)

    def __len__(self) -> int:
        if self._count is None:
            from ..evaluation.datasets import load_dataset

            self._count = len(load_dataset(self.file_path))
        return self._count


def _legacy_row(messages: list[Message], metadata: dict[str, Any]) -> DatasetRow:
    roles = [m.get("role") for m in messages]
    if roles in (["system", "user"], ["user"]):
        prompts = {f"{m['role']}_prompt": m.get("content") for m in messages}
        return {"system_prompt": "", **prompts, **metadata}
    return {"messages": messages, **metadata}


def dataset_row_to_request(
    row: DatasetRow,
    row_index: int,
    max_turns: int = 10,
    max_tokens_total: int = 4096,
    completion_params: dict[str, Any] | None = None,
) -> RolloutRequest:
    """The rollout request the legacy SDK built for a row (``ground_truth`` in ``metadata``)."""
    messages, metadata = _row_input(row, row_index)
    return RolloutRequest(
        rollout_id=f"test-{row_index}",
        server_url="http://test-mode.local",
        messages=messages,
        max_turns=max_turns,
        max_tokens_total=max_tokens_total,
        completion_params=completion_params or {},
        metadata=metadata,
    )


def _row_input(row: DatasetRow, row_index: int) -> tuple[list[Message], dict[str, Any]]:
    if "messages" in row:
        messages = list(row["messages"])
    else:
        messages = [{"role": "user", "content": row["user_prompt"]}]
        if row.get("system_prompt"):
            messages.insert(0, {"role": "system", "content": row["system_prompt"]})
    metadata = {"test_mode": True, "row_index": row_index}
    metadata.update(
        (k, v) for k, v in row.items() if k not in ("messages", "user_prompt", "system_prompt")
    )
    return messages, metadata


class ExternalLLMClient:
    """The legacy ``ExternalLLMClient(model, api_key=None, api_base=None)`` over an
    OpenAI-compatible endpoint: ``api_base``, else ``OPENAI_BASE_URL``, else OpenAI's; the key is
    ``api_key`` or ``OPENAI_API_KEY``. ``openai/gpt-4o`` is ``gpt-4o``; another provider's prefix is
    an error (the legacy SDK reached those through LiteLLM). It is also the LLM a
    :class:`LocalTestRunner` runs with.
    """

    def __init__(
        self, model: str = "gpt-4o", api_key: str | None = None, api_base: str | None = None
    ) -> None:
        from ..evaluation.model_names import openai_model
        from ..testing.openai_backend import OpenAICompatibleBackend

        environ = dict(os.environ)
        if api_key:
            environ["OPENAI_API_KEY"] = api_key
        self.model = openai_model(model)
        self._backend = OpenAICompatibleBackend.from_env(
            environ, base_url=api_base, model=self.model
        )
        self._tools: list[OpenAIFunctionToolSchema] | None = None
        self.reset_metrics()

    def __repr__(self) -> str:
        return f"ExternalLLMClient(model={self.model!r}, api_base={self._backend.base_url!r})"

    def set_tools(self, tools: list[Any]) -> None:
        """The tools sent with :meth:`chat_completions` calls (models or dicts)."""
        self._tools = [OpenAIFunctionToolSchema.model_validate(_dumped(t)) for t in tools] or None

    def clear_tools(self) -> None:
        self._tools = None

    def reset_metrics(self) -> None:
        self._llm_ms = 0.0
        self._calls = 0
        self._prompt_tokens = 0
        self._response_tokens = 0

    def get_metrics(self) -> RolloutMetrics:
        """LLM latency, calls and tokens since the last :meth:`reset_metrics`."""
        return RolloutMetrics(
            llm_latency_ms=round(self._llm_ms, 3),
            num_llm_calls=self._calls,
            prompt_tokens=self._prompt_tokens,
            response_tokens=self._response_tokens,
        )

    async def chat_completions(self, messages: list[Message], **kwargs: Any) -> CompletionsResult:
        """One completion of ``messages`` (``tools=`` and sampling keywords, the legacy way)."""
        from ..testing.records import RolloutRecord

        tools = kwargs.pop("tools", None)
        record = RolloutRecord("external-llm-client")
        if tools is not None:
            record.tools = [OpenAIFunctionToolSchema.model_validate(_dumped(t)) for t in tools]
        elif self._tools:
            record.tools = list(self._tools)
        request = CompletionsRequest(
            rollout_id=record.rollout_id, messages=list(messages), **kwargs
        )
        return CompletionsResult.from_response(await self.complete(request, record))

    async def complete(self, request: CompletionsRequest, record: Any) -> CompletionsResponse:
        """The mock TrainGate's backend side (``LLMBackend``): one turn, counted."""
        started = time.perf_counter()
        response = await self._backend.complete(request, record)
        self._llm_ms += (time.perf_counter() - started) * 1000
        self._calls += 1
        self._prompt_tokens += response.usage.prompt_tokens
        self._response_tokens += response.usage.completion_tokens
        return response

    async def close(self) -> None:
        await self._backend.aclose()

    async def __aenter__(self) -> ExternalLLMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _dumped(tool: Any) -> Any:
    return tool.model_dump(exclude_none=True) if hasattr(tool, "model_dump") else tool


@dataclass
class LocalTestRunResult:
    """One row's outcome (the legacy fields): ``success`` is COMPLETED with no protocol findings."""

    row_index: int
    success: bool
    result: RolloutResult | None = None
    error: str | None = None
    duration_ms: float = 0.0
    token_usage: dict[str, Any] = field(default_factory=dict)
    #: Our addition: the protocol problems found in this row's rollout.
    findings: list[Any] = field(default_factory=list)


@dataclass
class LocalTestBatchResult:
    """A batch's outcome (the legacy fields)."""

    results: list[LocalTestRunResult]
    total: int
    passed: int
    failed: int
    total_duration_ms: float
    total_tokens: int


class LocalTestRunner:
    """The legacy runner: ``run_single(row, row_index, ...)`` and ``run_batch(rows, ...)``, one row
    after another as the legacy SDK ran them. ``debug_dir`` keeps each rollout's trace
    (``debug=True`` alone writes none: pass the directory)."""

    def __init__(
        self,
        agent_loop: Any,
        llm_client: Any,
        debug: bool = False,
        debug_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.agent_loop = agent_loop
        self.llm_client = llm_client
        self.debug = debug
        self.debug_dir = Path(debug_dir) if debug_dir is not None else None

    async def run_single(
        self,
        row: DatasetRow,
        row_index: int,
        max_turns: int = 10,
        completion_params: dict[str, Any] | None = None,
    ) -> LocalTestRunResult:
        """One row, as a rollout through the server and the mock TrainGate."""
        batch = await self.run_batch([row], max_turns, completion_params, start_index=row_index)
        return batch.results[0]

    async def run_batch(
        self,
        rows: list[DatasetRow],
        max_turns: int = 10,
        completion_params: dict[str, Any] | None = None,
        on_progress: Callable[[int, int, LocalTestRunResult], None] | None = None,
        start_index: int = 0,
    ) -> LocalTestBatchResult:
        """Every row in order; ``on_progress(done, total, result)`` after each."""
        import tempfile

        from ..evaluation.runner import RowInput, RunOptions, run_batch
        from ..testing.harness import Harness

        inputs = []
        for position, row in enumerate(rows):
            messages, metadata = _row_input(row, start_index + position)
            inputs.append(
                RowInput(index=start_index + position + 1, messages=messages, metadata=metadata)
            )
        results: list[LocalTestRunResult] = []

        def done(row_result: Any) -> None:
            results.append(_legacy_result(row_result))
            if on_progress is not None:
                on_progress(len(results), len(inputs), results[-1])

        options = RunOptions(
            max_turns=max_turns, completion_params=dict(completion_params or {}), concurrency=1
        )
        started = time.perf_counter()
        # Undeliverable callbacks would go to an outbox: a temporary one, not the working dir.
        with tempfile.TemporaryDirectory(prefix="osmosis-test-mode-") as outbox:
            async with Harness(
                self.agent_loop,
                backend=self.llm_client,
                debug_dir=self.debug_dir,
                outbox_dir=outbox,
            ) as harness:
                await run_batch(harness, inputs, options, on_result=done)
        passed = sum(1 for r in results if r.success)
        return LocalTestBatchResult(
            results=results,
            total=len(results),
            passed=passed,
            failed=len(results) - passed,
            total_duration_ms=(time.perf_counter() - started) * 1000,
            total_tokens=sum(r.token_usage.get("total_tokens", 0) for r in results),
        )


def _legacy_result(row: Any) -> LocalTestRunResult:
    """A runner row as the legacy result, with the rollout's ``RolloutResult`` rebuilt."""
    result = None
    if row.status in ("COMPLETED", "ERROR"):
        result = RolloutResult(
            status=RolloutStatus(row.status),
            final_messages=row.final_messages,
            finish_reason=row.finish_reason,
            error_message=row.error_message,
            metrics=RolloutMetrics.model_validate(row.metrics) if row.metrics else None,
            reward=row.reward,
        )
    error = row.error_message
    if error is None and row.findings:
        error = "; ".join(f"{f.code}: {f.message}" for f in row.findings)
    return LocalTestRunResult(
        row_index=row.index - 1,
        success=row.passed,
        result=result,
        error=error,
        duration_ms=row.latency_ms,
        token_usage={
            "prompt_tokens": row.prompt_tokens,
            "completion_tokens": row.response_tokens,
            "total_tokens": row.prompt_tokens + row.response_tokens,
            "num_llm_calls": row.turns,
        },
        findings=list(row.findings),
    )
