"""The v1 wire (docs/protocol.md): ``POST /v1/rollout/init``, answered ``202`` with
``{"rollout_id", "tools"}``; the agent's chat turns go to ``{server_url}/v1/chat/completions``
and the result to ``{server_url}/v1/rollout/completed``, both with the rollout's ``api_key``.

The URLs themselves are built by ``TrainGateClient`` (``chat_completions``,
``complete_rollout``); this module binds them to one rollout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter
from starlette.responses import Response

from ...grading import graded
from ...protocol import RolloutRequest, RolloutResponse, RolloutStatus
from ..types import Terminal, terminal

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from ...client import RolloutChannel, TrainGateClient
    from ...grading import Grade
    from ..types import Answer, Edge, Progress

__all__ = ["V1", "V1Callback"]

_JSON = "application/json"
_RETRY_AFTER = {"Retry-After": "5"}
_JSON_STR = TypeAdapter(str)


class V1Callback:
    """A v1 rollout's target: chat turns and one completion callback to its ``server_url``."""

    __slots__ = ("api_key", "rollout_id", "server_url")
    protocol = "v1"

    def __init__(self, rollout_id: str, server_url: str, api_key: str | None) -> None:
        self.rollout_id = rollout_id
        self.server_url = server_url
        self.api_key = api_key

    def channel(self, client: TrainGateClient) -> RolloutChannel:
        """The rollout's ``/v1/chat/completions`` channel."""
        from ...client import RolloutChannel

        return RolloutChannel(client, self.server_url, self.api_key)

    def settle(
        self, response: RolloutResponse, grade: Grade | None, category: str | None = None
    ) -> tuple[RolloutResponse, Terminal]:
        """A grade's reward replaces the agent's; a failed grade ends the rollout ``ERROR``."""
        if grade is not None:
            if grade.error is None:
                response = graded(response, grade)
            else:
                response = response.model_copy(
                    update={
                        "status": RolloutStatus.ERROR,
                        "finish_reason": "cancelled" if grade.cancelled else "error",
                        "error_message": grade.error,
                        "reward": None,
                    }
                )
        return response, terminal_of(response)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The one key v1 has: chat turns and the callback share it."""
        return (self.api_key,) if self.api_key else ()

    def record(self) -> dict[str, Any] | None:
        """Nothing beyond the URL and the key."""
        return None

    async def deliver(
        self,
        client: TrainGateClient,
        response: RolloutResponse,
        progress: Progress | None = None,
    ) -> None:
        """POST ``/v1/rollout/completed`` (retried by the client; raises when not taken)."""
        await client.complete_rollout(self.server_url, response, api_key=self.api_key)


def terminal_of(response: RolloutResponse) -> Terminal:
    """What status routes report for a v1 result."""
    if response.status is RolloutStatus.COMPLETED:
        return terminal("success", response.reward)
    status = "cancelled" if response.finish_reason == "cancelled" else "failure"
    return terminal(status, None, response.error_message)


class V1:
    """The v1 wire (see the module docstring)."""

    protocol = "v1"
    start_path = "/v1/rollout/init"

    def claims(self, body: bytes) -> bool:
        """Every body of its start route (no other wire shares it)."""
        return True

    def parse(self, body: bytes, *, max_metadata_bytes: int) -> RolloutRequest:
        """The init body as a ``RolloutRequest`` (raises ``ValidationError``)."""
        return RolloutRequest.model_validate_json(
            body, context={"max_metadata_bytes": max_metadata_bytes}
        )

    def target(self, request: RolloutRequest) -> V1Callback:
        """The init's ``server_url`` and ``api_key``."""
        return V1Callback(request.rollout_id, request.server_url, request.api_key_value)

    def target_of(
        self,
        rollout_id: str,
        server_url: str,
        api_key: str | None,
        route: dict[str, Any] | None = None,
    ) -> V1Callback:
        """A v1 callback rebuilt from the outbox or a lease."""
        return V1Callback(rollout_id, server_url, api_key)

    def accepted(self, rollout_id: str, tools_json: bytes) -> bytes:
        """The 202 body ``{"rollout_id": ..., "tools": [...]}``, built the same way for the first
        answer and for every duplicate (from a finished record's shared tools JSON)."""
        return (
            b'{"rollout_id":' + _JSON_STR.dump_json(rollout_id) + b',"tools":' + tools_json + b"}"
        )

    def respond(self, answer: Answer) -> Response:
        """The answer as JSON, with ``Retry-After`` when it asks for a retry."""
        headers = _RETRY_AFTER if answer.retry_after else None
        return Response(answer.body, status_code=answer.status, media_type=_JSON, headers=headers)

    def routes(self, edge: Edge) -> list[BaseRoute]:
        """This project's extension (docs/protocol.md): ``GET /v1/rollout/{id}/status`` and
        ``POST /v1/rollout/cancel``, shaped as v2's, over v1 rollouts."""
        from .control import control_routes

        return control_routes(edge, self.protocol, "/v1/rollout")
