"""``OsmosisLLMClient``: the legacy per-rollout client, a view over our ``TrainGateClient``.

One instance talks to one TrainGate for one rollout: chat turns and the completion callback,
with our retries, ``Retry-After`` handling and secret-safe errors. Inside a served agent use
``ctx.chat`` (or ``ctx.llm``) instead; this class is for code that drives TrainGate itself.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any

import httpx2

from ..client import RetryPolicy, TrainGateClient
from ..destinations import DestinationPolicy
from ..protocol import (
    CompletionsRequest,
    Message,
    RolloutMetrics,
    RolloutResponse,
    RolloutStatus,
)
from ..results import CompletionsResult

__all__ = ["OsmosisLLMClient"]

_DEFAULT_TIMEOUT_S = 300.0
_DEFAULT_RETRIES = 3
_DEFAULT_COMPLETE_RETRIES = 2


def _client_setting(settings: Any, name: str) -> Any:
    """A value from the legacy ``RolloutSettings().client`` (duck-typed); without settings, the
    legacy SDK's ``OSMOSIS_ROLLOUT_CLIENT_<NAME>`` variable (or ``.env``), as the legacy defaults
    came from it."""
    if settings is None:
        from .settings import client_setting

        return client_setting(name)
    return getattr(getattr(settings, "client", None), name, None)


class OsmosisLLMClient:
    """Chat turns and the completion callback of one rollout (the legacy constructor and methods).

    ``timeout_seconds`` of 0 or None means the default (300 s); retries of None mean the
    defaults (3 for chat turns, 2 for the callback). The HTTP client opens on first use.
    """

    def __init__(
        self,
        server_url: str,
        rollout_id: str,
        api_key: str | None = None,
        timeout_seconds: float | None = None,
        max_retries: int | None = None,
        complete_rollout_retries: int | None = None,
        settings: Any = None,
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self.rollout_id = rollout_id
        self.api_key = api_key
        self.timeout_seconds = float(
            timeout_seconds or _client_setting(settings, "timeout_seconds") or _DEFAULT_TIMEOUT_S
        )
        self.max_retries = _pick(
            max_retries, _client_setting(settings, "max_retries"), _DEFAULT_RETRIES
        )
        self.complete_rollout_retries = _pick(
            complete_rollout_retries,
            _client_setting(settings, "complete_rollout_retries"),
            _DEFAULT_COMPLETE_RETRIES,
        )
        self._backoff = (
            float(_client_setting(settings, "retry_base_delay") or 1.0),
            float(_client_setting(settings, "retry_max_delay") or 30.0),
        )
        self._client: httpx2.AsyncClient | None = None
        self._lock = asyncio.Lock()
        self._turns = 0
        self._llm_ms = 0.0
        self._calls = 0
        self._prompt_tokens = 0
        self._response_tokens = 0

    def __repr__(self) -> str:
        return f"OsmosisLLMClient(server_url={self.server_url!r}, rollout_id={self.rollout_id!r})"

    async def _get_client(self) -> httpx2.AsyncClient:
        async with self._lock:
            if self._client is None:
                self._client = httpx2.AsyncClient(
                    timeout=httpx2.Timeout(self.timeout_seconds, connect=10.0),
                    limits=httpx2.Limits(max_connections=100, max_keepalive_connections=20),
                )
            return self._client

    async def _traingate(self, retries: int) -> TrainGateClient:
        base, ceiling = self._backoff
        policy = RetryPolicy(
            retries=retries,
            attempt_timeout_s=self.timeout_seconds,
            base_delay_s=base,
            max_delay_s=ceiling,
        )
        # The server's destination policy (docs/security.md): never a cloud metadata service
        # or a link-local address, whatever server_url says.
        return TrainGateClient(
            await self._get_client(), retry=policy, destinations=DestinationPolicy()
        )

    async def chat_completions(
        self,
        messages: list[Message],
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 512,
        stop: str | list[str] | None = None,
        logprobs: bool = True,
        **kwargs: Any,
    ) -> CompletionsResult:
        """One LLM turn; raises our ``TrainGateError`` subclasses (catchable as the legacy SDK's
        ``OsmosisServerError``, ``OsmosisValidationError``, ``OsmosisTransportError``,
        ``OsmosisTimeoutError``)."""
        from .context import known_params

        body = CompletionsRequest(
            rollout_id=self.rollout_id,
            messages=list(messages),
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            stop=stop,  # a str becomes [str]
            logprobs=logprobs,
            **known_params(kwargs, "OsmosisLLMClient.chat_completions"),
        )
        self._turns += 1
        client = await self._traingate(self.max_retries)
        started = time.perf_counter()
        response = await client.chat_completions(
            self.server_url,
            body,
            api_key=self.api_key,
            request_id=f"{self.rollout_id}:{self._turns}",
        )
        self._llm_ms += (time.perf_counter() - started) * 1000
        self._calls += 1
        self._prompt_tokens += response.usage.prompt_tokens
        self._response_tokens += response.usage.completion_tokens
        return CompletionsResult.from_response(response)

    async def complete_rollout(
        self,
        status: str | RolloutStatus,
        final_messages: list[Message],
        finish_reason: str | None = "stop",
        error_message: str | None = None,
        metrics: RolloutMetrics | None = None,
        reward: float | None = None,
    ) -> None:
        """Send the completion callback (this client's own metrics when none are given)."""
        response = RolloutResponse(
            rollout_id=self.rollout_id,
            status=RolloutStatus(status),
            final_messages=list(final_messages),
            finish_reason=finish_reason,
            error_message=error_message,
            metrics=metrics if metrics is not None else self.get_metrics(),
            reward=reward,
        )
        client = await self._traingate(self.complete_rollout_retries)
        await client.complete_rollout(self.server_url, response, api_key=self.api_key)

    def get_metrics(self) -> RolloutMetrics:
        """LLM latency, call count and tokens of the successful turns so far."""
        return RolloutMetrics(
            llm_latency_ms=round(self._llm_ms, 3),
            num_llm_calls=self._calls,
            prompt_tokens=self._prompt_tokens,
            response_tokens=self._response_tokens,
        )

    async def close(self) -> None:
        """Close the HTTP client (safe to call twice, or before any call)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> OsmosisLLMClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _pick(value: int | None, configured: Any, default: int) -> int:
    if value is not None:
        return value
    return int(configured) if configured is not None else default
