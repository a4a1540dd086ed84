"""The in-process door to a rollout's endpoint: an ``openai.AsyncOpenAI`` with no socket.

``ctx.openai_client()`` hands the agent a real ``openai`` client whose HTTP transport calls the
rollout's :class:`~.session.RolloutEndpoint` directly: the client builds and parses its bodies
as usual, nothing is listened on, and no token is needed because nothing outside can reach it.
"""

from __future__ import annotations

from typing import Any

import httpx2

from .session import RolloutEndpoint
from .translate import error_body

__all__ = ["IN_PROCESS_BASE_URL", "InProcessTransport", "openai_client"]

#: The base URL the in-process client is given: a reserved name (RFC 6761) that never resolves.
IN_PROCESS_BASE_URL = "http://rollout.invalid/v1"


class InProcessTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport that answers ``POST <base>/chat/completions`` from one
    rollout's endpoint; any other path is a 404 in OpenAI's error shape."""

    def __init__(self, endpoint: RolloutEndpoint) -> None:
        self.endpoint = endpoint

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path.rstrip("/")
        if request.method == "POST" and path.endswith("/chat/completions"):
            reply = await self.endpoint.handle(await request.aread())
            return httpx2.Response(
                reply.status,
                headers={"content-type": reply.content_type},
                content=reply.body,
                request=request,
            )
        message = (
            f"{request.method} {path} is not served: this endpoint answers "
            "POST /v1/chat/completions only (the Responses API is not supported)"
        )
        return httpx2.Response(
            404,
            headers={"content-type": "application/json"},
            content=error_body(message, "not_found_error"),
            request=request,
        )


def openai_client(endpoint: RolloutEndpoint, **options: Any) -> Any:
    """An ``openai.AsyncOpenAI`` whose calls are ``endpoint``'s rollout's turns
    (``ctx.openai_client()``).

    ``options`` go to the client (``timeout``...); retries are off by default, since the
    rollout's own channel to TrainGate already retries what can be retried."""
    try:
        import openai
    except ImportError:
        raise ImportError(
            "ctx.openai_client() needs the openai package: pip install 'osmosis-rollout[openai]'"
        ) from None
    options.setdefault("max_retries", 0)
    http = httpx2.AsyncClient(transport=InProcessTransport(endpoint), timeout=None)
    return openai.AsyncOpenAI(
        base_url=IN_PROCESS_BASE_URL, api_key="in-process", http_client=http, **options
    )
