"""Status and cancel routes, for v2 (spec 3.2, 3.3, 14.5) and as v1's documented extension.

``GET <prefix>/{rollout_id}/status`` answers ``{"rollout_id", "status", "reward",
"err_message"}``: ``queued``, ``running``, ``grading`` in flight, then ``success``, ``failure``
or ``cancelled`` (known before the callbacks are sent) for the record TTL, ``unknown``
otherwise. ``POST <prefix>/cancel`` takes exactly one of ``ids``, ``prefix``, ``all`` and answers
each rollout's disposition. A cancelled rollout still ends in its callbacks (v1: ``ERROR`` with
finish reason ``cancelled``; v2: completion ``cancelled``, grader ``failure``). Each wire sees
only its own rollouts. With a shared state, a rollout another replica runs is answered from the
store and its cancel is passed on to that replica (``RolloutServer.cancel_remote``). The cancel
route of a start route two wires share (v2 and polling: ``/rollout``) serves both wires'
rollouts; a polling rollout has no status route (its result route is ``polling.py``'s).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...protocol import CancelBodyReceived, StatusAnswer
from ..registry import CANCELLED_BY_TRAINER, Phase, RolloutEntry, cancel_entry
from ..types import Edge, Terminal

if TYPE_CHECKING:
    from ..core import RolloutServer

__all__ = [
    "CANCELLED_BY_TRAINER",
    "cancel_route",
    "control_routes",
    "disposition",
    "status_of",
    "status_route",
]

_JSON = "application/json"
_ONE_SELECTOR = {"detail": "pass exactly one selector: ids, prefix, or all"}
_IDS_ONLY = {
    "detail": "this server runs without a key on a public interface (--no-auth): it cancels "
    "rollouts by ids only, not by prefix or all"
}
_IN_FLIGHT = {
    Phase.PENDING: "queued",
    Phase.QUEUED: "queued",
    Phase.RUNNING: "running",
    Phase.GRADING: "grading",
    Phase.DELIVERING: "grading",
}


def _json(status: int, body: Any) -> Response:
    return Response(json.dumps(body), status_code=status, media_type=_JSON)


def status_body(rollout_id: str, status: str, terminal: Terminal | None = None) -> dict[str, Any]:
    """A status answer (``protocol.StatusAnswer``); ``reward`` only for a success,
    ``err_message`` only otherwise."""
    if terminal is None:
        answer = StatusAnswer(rollout_id=rollout_id, status=status)
    elif terminal.status == "success":
        answer = StatusAnswer(rollout_id=rollout_id, status="success", reward=terminal.reward)
    else:
        answer = StatusAnswer(
            rollout_id=rollout_id,
            status=terminal.status,
            err_message=terminal.err_message,
        )
    return answer.model_dump()


def status_of(entry: RolloutEntry) -> dict[str, Any]:
    """A live rollout's status: its terminal once known (before its callbacks go), else its
    phase."""
    if entry.terminal is not None:
        return status_body(entry.rollout_id, "", entry.terminal)
    return status_body(entry.rollout_id, _IN_FLIGHT.get(entry.phase, "unknown"))


def disposition(entry: RolloutEntry) -> str:
    """What a trainer's cancel does to ``entry``, doing it."""
    return cancel_entry(entry, CANCELLED_BY_TRAINER)


def control_routes(edge: Edge, protocol: str, prefix: str) -> list[BaseRoute]:
    """The two routes of ``protocol`` under ``prefix``, behind the server key."""
    return [cancel_route(edge, protocol, prefix), status_route(edge, protocol, prefix)]


def _live(edge: Edge, rollout_id: str, protocols: frozenset[str]) -> RolloutEntry | None:
    server: RolloutServer = edge.server
    entry = server.registry.by_id.get(rollout_id)
    if entry is None or entry.target is None or entry.target.protocol not in protocols:
        return None
    return entry


def status_route(edge: Edge, protocol: str, prefix: str) -> BaseRoute:
    """``GET <prefix>/{rollout_id}/status`` for ``protocol``'s rollouts."""
    server: RolloutServer = edge.server
    protocols = frozenset({protocol})

    async def status(request: Request) -> Response:
        if not edge.authorized(request):
            return _json(401, {"detail": "Invalid or missing API key"})
        rollout_id = request.path_params["rollout_id"]
        entry = _live(edge, rollout_id, protocols)
        if entry is not None:
            return _json(200, status_of(entry))
        record = server.registry.finished(rollout_id)
        if record is not None and record.protocol == protocol:
            return _json(200, status_body(rollout_id, "unknown", record.terminal))
        shared = await server.shared_status(rollout_id, protocol)
        if shared is not None:  # the same model: what another replica wrote answers alike
            return _json(200, StatusAnswer.model_validate(shared).model_dump())
        return _json(200, status_body(rollout_id, "unknown"))

    # A path converter: a v1 rollout id may hold "/" (v2's may not).
    return Route(f"{prefix}/{{rollout_id:path}}/status", status, methods=["GET"])


def cancel_route(edge: Edge, protocol: str, prefix: str) -> BaseRoute:
    """``POST <prefix>/cancel``: cancels the rollouts of every wire that shares ``protocol``'s
    start route (v2 and polling share ``/rollout``: one cancel route serves both)."""
    server: RolloutServer = edge.server
    protocols = edge.sharing(protocol)

    async def cancel(request: Request) -> Response:
        if not edge.authorized(request):
            return _json(401, {"detail": "Invalid or missing API key"})
        body = await edge.read_body(request)
        if isinstance(body, Response):
            return body
        try:
            selector = CancelBodyReceived.model_validate_json(body)
        except ValidationError as exc:
            return _json(422, edge.validation_body(exc))
        if selector.selectors() != 1:
            return _json(422, _ONE_SELECTOR)
        if edge.open and selector.ids is None:
            # Anyone may reach an open server: one request must not end every rollout.
            return _json(403, _IDS_ONLY)
        dispositions: dict[str, str] = {}
        if selector.ids is not None:
            for rollout_id in selector.ids:
                entry = _live(edge, rollout_id, protocols)
                if entry is not None:
                    dispositions[rollout_id] = disposition(entry)
                    continue
                dispositions[rollout_id] = "not_found"
                for each in sorted(protocols):  # another replica's, of any wire sharing the route
                    done = await server.cancel_remote(rollout_id, each)
                    if done != "not_found":
                        dispositions[rollout_id] = done
                        break
        else:
            wanted = selector.prefix or ""
            for entry in list(server.registry.by_id.values()):
                if entry.target is None or entry.target.protocol not in protocols:
                    continue
                if selector.all or entry.rollout_id.startswith(wanted):
                    done = disposition(entry)
                    if done != "not_found":
                        dispositions[entry.rollout_id] = done
            for each in sorted(protocols):
                for rollout_id, done in (await server.cancel_remote_matching(wanted, each)).items():
                    dispositions.setdefault(rollout_id, done)
        return _json(200, {"dispositions": dispositions})

    return Route(f"{prefix}/cancel", cancel, methods=["POST"])
