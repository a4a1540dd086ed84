"""The polling wire (``docs/protocol-polling.md``): osmosis-ai 0.3.3+'s ``RolloutClient``.

``POST /rollout`` (shared with v2: a body with a callback URL or a controller key is v2's,
``polling_body.is_v2_body``) answers ``202`` with a lease token, the result wait and the lease
timeout; ``GET /rollout/{id}/result`` with ``X-Osmosis-Rollout-Lease`` is a long poll that
renews the lease and answers the status or the finished result (``polling_results.py``);
``POST /rollout/cancel`` is v2's route, which serves both wires. A repeated id is a ``409``,
even with the same body: the lease token is handed out once. Admission full is ``429`` with
``Retry-After``; draining is ``503``.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .polling_body import PollingInit, PollingRollout, is_v2_body
from .polling_results import MAX_PARKED_POLLS, PollingResults
from .polling_target import PollingTarget

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from ...protocol import RolloutRequest
    from ..types import Answer, Edge

__all__ = ["LEASE_HEADER", "SHARED_STATE", "Polling"]

#: The header a result poll names its lease in.
LEASE_HEADER = "X-Osmosis-Rollout-Lease"
_JSON = "application/json"
_RETRY_AFTER = {"Retry-After": "5"}
_JSON_STR = TypeAdapter(str)
_REPEATED = json.dumps(
    {"detail": "rollout_id is already registered; a new rollout needs a new rollout_id"}
).encode()
#: Where the token goes in a 202 body until ``respond`` puts it in.
_NO_TOKEN = b"<lease token>"
_NO_LEASE = json.dumps({"detail": f"the {LEASE_HEADER} header is required"}).encode()
_UNAUTHORIZED = json.dumps({"detail": "Invalid or missing API key"}).encode()
#: Why a polling init is refused (a 422) under --workers without a shared state: a poll
#: reaches any worker, and each keeps its results in its own memory (protocol-polling.md).
SHARED_STATE = (
    "the polling wire needs a shared state with --workers (--state redis://...): each worker "
    "keeps its own results otherwise"
)


class Polling:
    """The polling wire (see the module docstring); one per app (it holds the results)."""

    protocol = "polling"
    start_path = "/rollout"

    def __init__(
        self,
        *,
        wait_s: float = 30.0,
        lease_s: float = 120.0,
        retention_s: float = 900.0,
        max_parked: int = MAX_PARKED_POLLS,
    ) -> None:
        self.results = PollingResults(
            wait_s=wait_s, lease_s=lease_s, retention_s=retention_s, max_parked=max_parked
        )
        self._shared_state = False

    def claims(self, body: bytes) -> bool:
        """Any ``POST /rollout`` body v2 does not claim."""
        return not is_v2_body(body)

    def parse(self, body: bytes, *, max_metadata_bytes: int) -> PollingRollout:
        """The body as a ``PollingRollout`` (raises ``ValidationError``: a 422)."""
        context: dict[str, Any] = {"max_metadata_bytes": max_metadata_bytes}
        if self._shared_state:
            context["refuse"] = SHARED_STATE
        init = PollingInit.model_validate_json(body, context=context)
        return PollingRollout.of(init)

    def target(self, request: RolloutRequest) -> PollingTarget:
        """The rollout's chat channel and its place in the results store."""
        assert isinstance(request, PollingRollout)  # parse made it
        return PollingTarget(
            request.rollout_id,
            self.results,
            chat_url=request.server_url,
            llm_key=request.api_key_value,
            label=request.label,
            graded=request.grade,
        )

    def target_of(
        self,
        rollout_id: str,
        server_url: str,
        api_key: str | None,
        route: dict[str, Any] | None = None,
    ) -> PollingTarget:
        """A target rebuilt from a lease (a replica ends a dead one's rollout): it stores the
        result under the same lease digest."""
        route = route or {}
        return PollingTarget(
            rollout_id,
            self.results,
            chat_url=server_url,
            label=route.get("label"),
            graded=bool(route.get("graded", True)),
            digest=bytes.fromhex(str(route.get("digest") or "")),
        )

    def accepted(self, rollout_id: str, tools_json: bytes) -> bytes:
        """The 202 body, issuing the rollout's lease, with ``_NO_TOKEN`` where the token goes:
        this body is also what the scheduler keeps for duplicates (in a shared state too), and
        the token must be in neither. ``respond`` puts it in, once. Empty for a repeated id."""
        registry = self.results.registry
        entry = registry.by_id.get(rollout_id) if registry is not None else None
        target = entry.target if entry is not None else None
        if not isinstance(target, PollingTarget) or target.lease.digest:
            return b""
        self.results.issue(target.lease, secrets.token_urlsafe(32))
        results = self.results
        return (
            b'{"rollout_id":'
            + _JSON_STR.dump_json(rollout_id)
            + b',"status":"queued","polling_lease_token":"'
            + _NO_TOKEN
            + b'","result_wait_timeout_sec":'
            + json.dumps(results.wait_s).encode()
            + b',"polling_lease_timeout_sec":'
            + json.dumps(results.lease_s).encode()
            + b"}"
        )

    def _with_token(self, body: bytes) -> bytes | None:
        """``body`` with its rollout's token, the first time it is answered; None after
        (a duplicate, here or from another replica's record: a 409)."""
        try:
            rollout_id = json.loads(body)["rollout_id"]
        except (ValueError, KeyError, TypeError):
            return None
        found = self.results.live(str(rollout_id))
        if found is None or found[1].token is None:
            return None
        token, found[1].token = found[1].token, None
        return body.replace(b'"' + _NO_TOKEN + b'"', b'"' + token.encode() + b'"', 1)

    def respond(self, answer: Answer) -> Response:
        """The answer in the SDK's terms: full is 429, any repeated id 409."""
        status, body = answer.status, answer.body
        if status == 202:
            sent = self._with_token(body) if body else None
            status, body = (202, sent) if sent is not None else (409, _REPEATED)
        if answer.reason == "busy":
            status = 429
        elif status == 409:
            status, body = 409, _REPEATED
        headers = _RETRY_AFTER if answer.retry_after else None
        return Response(body, status_code=status, media_type=_JSON, headers=headers)

    def routes(self, edge: Edge) -> list[BaseRoute]:
        """``GET /rollout/{id}/result``, and the cancel route v2 shares."""
        from .control import cancel_route

        server = edge.server
        self.results.bind(server.registry, server.state)
        # Workers without a shared state each keep their own results: a poll could miss.
        self._shared_state = server.settings.workers > 1 and not server.state.shared
        results = self.results

        async def result(request: Request) -> Response:
            if not edge.authorized(request):
                return Response(_UNAUTHORIZED, status_code=401, media_type=_JSON)
            token = request.headers.get(LEASE_HEADER)
            if not token:
                return Response(_NO_LEASE, status_code=422, media_type=_JSON)
            answer = await results.poll(request.path_params["rollout_id"], token)
            headers = {"Retry-After": "1"} if answer.status == 503 else None
            return Response(answer.body, answer.status, media_type=_JSON, headers=headers)

        return [
            Route("/rollout/{rollout_id}/result", result, methods=["GET"]),
            cancel_route(edge, self.protocol, "/rollout"),
        ]
