"""What a rollout's context opens for agents not written against ``ctx.chat``: the rollout's
OpenAI-compatible endpoint, in process (``ctx.openai_client()``) or over loopback
(``ctx.openai_base_url`` and ``ctx.openai_api_key``, for a harness in another process).

``RolloutContext`` holds one ``OpenAIDoor`` (made on first use) and delegates to it; the door
knows the context only as an ``EndpointContext`` (``session.py``), so ``agent.py`` imports the
endpoint and the endpoint imports nothing of ``agent``. Nothing here runs until an agent asks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .listener import Grant
    from .session import EndpointContext, RolloutEndpoint
    from .tool_history import ObservedCall

__all__ = ["OpenAIDoor"]


class OpenAIDoor:
    """One rollout's ``openai_client()``, ``openai_base_url`` and ``openai_api_key``."""

    __slots__ = ("_client", "_ctx", "_endpoint", "_grant", "_observe_tools")

    def __init__(
        self,
        ctx: EndpointContext,
        *,
        observe_tools: Callable[[Sequence[ObservedCall]], None] | None = None,
    ) -> None:
        self._ctx = ctx
        self._observe_tools = observe_tools
        self._endpoint: RolloutEndpoint | None = None
        self._grant: Grant | None = None
        self._client: Any = None

    def endpoint(self) -> RolloutEndpoint:
        """This rollout's endpoint, made on first use."""
        if self._endpoint is None:
            from .session import RolloutEndpoint

            self._endpoint = RolloutEndpoint(self._ctx, observe_tools=self._observe_tools)
        return self._endpoint

    def grant(self) -> Grant:
        """This rollout's loopback grant (its base URL and token), made on first use."""
        if self._grant is None:
            endpoint = self.endpoint()
            if endpoint.closed:
                raise RuntimeError("this rollout has ended: its endpoint is closed")
            from .listener import listener

            self._grant = listener().grant(endpoint)
        return self._grant

    def client(self, **options: Any) -> Any:
        """An ``openai.AsyncOpenAI`` over the endpoint in process; without ``options`` the same
        client each time (building one costs about a millisecond)."""
        from .inprocess import openai_client

        if options:
            return openai_client(self.endpoint(), **options)
        if self._client is None:
            self._client = openai_client(self.endpoint())
        return self._client

    def close(self) -> None:
        """The rollout ended: refuse further calls and void the loopback grant."""
        if self._endpoint is not None:
            self._endpoint.closed = True
        if self._grant is not None:
            self._grant.revoke()

    def add_findings(self, extra: dict[str, Any]) -> None:
        """Add the endpoint's findings to the metrics the completion callback carries."""
        if self._endpoint is not None and self._endpoint.findings:
            extra["endpoint_findings"] = list(self._endpoint.findings)
