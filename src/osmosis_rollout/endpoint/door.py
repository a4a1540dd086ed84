"""What ``RolloutContext`` gains for agents not written against ``ctx.chat``: the rollout's
OpenAI-compatible endpoint, in process (``ctx.openai_client()``) or over loopback
(``ctx.openai_base_url`` and ``ctx.openai_api_key``, for a harness in another process).

A mixin, so ``agent.py`` stays the core context; nothing here runs until an agent asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..agent import RolloutContext
    from .listener import Grant
    from .session import RolloutEndpoint

__all__ = ["OpenAIEndpointDoor"]


class OpenAIEndpointDoor:
    """``ctx.openai_client()``, ``ctx.openai_base_url``, ``ctx.openai_api_key``."""

    _openai_endpoint: RolloutEndpoint | None = None
    _openai_grant: Grant | None = None
    _openai_client: Any = None

    def _endpoint(self) -> RolloutEndpoint:
        """This rollout's endpoint, made on first use."""
        if self._openai_endpoint is None:
            from .session import RolloutEndpoint

            ctx: RolloutContext = self  # type: ignore[assignment]
            self._openai_endpoint = RolloutEndpoint(ctx)
        return self._openai_endpoint

    def _grant(self) -> Grant:
        if self._openai_grant is None:
            endpoint = self._endpoint()
            if endpoint.closed:
                raise RuntimeError("this rollout has ended: its endpoint is closed")
            from .listener import listener

            self._openai_grant = listener().grant(endpoint)
        return self._openai_grant

    @property
    def openai_base_url(self) -> str:
        """The rollout's OpenAI base URL on 127.0.0.1 (``.../v1``), for a harness in another
        process: ``OPENAI_BASE_URL``. It answers only while the rollout runs."""
        return self._grant().base_url

    @property
    def openai_api_key(self) -> str:
        """The bearer token of :attr:`openai_base_url` (``OPENAI_API_KEY``): this rollout's
        only, void once it ends. Not TrainGate's key."""
        return self._grant().token

    def openai_client(self, **options: Any) -> Any:
        """An ``openai.AsyncOpenAI`` whose every call is one turn of this rollout, in process
        (no socket); needs ``pip install 'osmosis-rollout[openai]'``. Without ``options`` the
        same client each time (building one costs about a millisecond)."""
        from .inprocess import openai_client

        ctx: RolloutContext = self  # type: ignore[assignment]
        if options:
            return openai_client(ctx, **options)
        if self._openai_client is None:
            self._openai_client = openai_client(ctx)
        return self._openai_client

    def _close_endpoint(self) -> None:
        """The rollout ended: refuse further calls and void the loopback grant."""
        if self._openai_endpoint is not None:
            self._openai_endpoint.closed = True
        if self._openai_grant is not None:
            self._openai_grant.revoke()

    def _endpoint_metrics(self, extra: dict[str, Any]) -> None:
        """Add the endpoint's findings to the metrics the completion callback carries."""
        if self._openai_endpoint is not None and self._openai_endpoint.findings:
            extra["endpoint_findings"] = list(self._openai_endpoint.findings)
