"""The v2 wire (``docs/protocol-v2.md``): ``POST /rollout``, answered ``202 {"rollout_id"}``.

The body (``protocol.V2Init``; the rollout it makes: ``v2_body.py``) names the rollout's chat
base URL with its LLM key, and its completion and grader callback URLs with the controller key;
the target (``v2_target.py``) sends the chat turns and the two callbacks. Beside the start
route: ``GET /rollout/{id}/status`` and ``POST /rollout/cancel`` (``control.py``). Admission
refusals are 429 with ``Retry-After`` (v1 says 503), and a reused rollout id with another body
is a 409 that says so in v2's terms (there is no idempotency key in v2: the id is the key).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter
from starlette.responses import Response

from ...protocol import V2InitReceived
from .polling_body import is_v2_body
from .v2_body import V2Rollout
from .v2_target import V2Target

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from ...protocol import RolloutRequest
    from ..types import Answer, Edge

__all__ = ["V2"]

_JSON = "application/json"
_RETRY_AFTER = {"Retry-After": "5"}
_JSON_STR = TypeAdapter(str)
_CONFLICT = json.dumps(
    {
        "detail": "rollout_id is already used by a different request body; a retry must resend "
        "the same body, a new rollout needs a new rollout_id"
    }
).encode()


class V2:
    """The v2 wire (see the module docstring)."""

    protocol = "v2"
    start_path = "/rollout"

    def claims(self, body: bytes) -> bool:
        """A body naming a callback URL or the controller key (``polling_body.is_v2_body``)."""
        return is_v2_body(body)

    def parse(self, body: bytes, *, max_metadata_bytes: int) -> V2Rollout:
        """The body as a ``V2Rollout`` (raises ``ValidationError``: a 422)."""
        init = V2InitReceived.model_validate_json(
            body, context={"max_metadata_bytes": max_metadata_bytes}
        )
        return V2Rollout.of(init)

    def target(self, request: RolloutRequest) -> V2Target:
        """The rollout's chat channel and callbacks; takes the controller key off the request."""
        assert isinstance(request, V2Rollout)  # parse made it
        return V2Target(
            request.rollout_id,
            request.completion_callback_url,
            request.take_controller_key(),
            grader_url=request.grader_callback_url,
            id_given=request.id_given,
            label=request.label,
            chat_url=request.server_url,
            llm_key=request.api_key_value,
        )

    def target_of(
        self,
        rollout_id: str,
        server_url: str,
        api_key: str | None,
        route: dict[str, Any] | None = None,
    ) -> V2Target:
        """A v2 target rebuilt from an outbox entry or a lease (its ``record()``)."""
        route = route or {}
        return V2Target(
            rollout_id,
            server_url,
            api_key,
            grader_url=route.get("grader_callback_url"),
            id_given=bool(route.get("id_given", True)),
            label=route.get("label"),
            bodies=route.get("bodies"),
            pending=route.get("pending"),
        )

    def accepted(self, rollout_id: str, tools_json: bytes) -> bytes:
        """``{"rollout_id": ...}``: the id, invented or not, so status and cancel can name it."""
        return b'{"rollout_id":' + _JSON_STR.dump_json(rollout_id) + b"}"

    def respond(self, answer: Answer) -> Response:
        """The answer in v2's terms: admission full is 429, a reused id 409 in v2's words."""
        status, body = answer.status, answer.body
        if answer.reason == "busy":
            status = 429
        elif status == 409:
            body = _CONFLICT
        headers = _RETRY_AFTER if answer.retry_after else None
        return Response(body, status_code=status, media_type=_JSON, headers=headers)

    def routes(self, edge: Edge) -> list[BaseRoute]:
        """``GET /rollout/{id}/status`` and ``POST /rollout/cancel``."""
        from .control import control_routes

        return control_routes(edge, self.protocol, "/rollout")
