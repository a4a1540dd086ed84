"""Which wire a rollout server speaks, from one ``GET /health``.

``osmosis test --server URL`` or ``--launch CMD`` without ``--protocol`` asks the server before
the first row. The probe is that one read: every Osmosis rollout server answers ``/health``, and
no server logs it as an error (``GET /platform/health`` or an empty ``POST /rollout`` would be
logged by the official one as a 404 and a 422). What each answers:

- ``lifecycle`` (``accepting_rollouts``, ``active_rollouts``): osmosis-ai 0.3.3 and later, the
  polling wire; our own server sends it too, beside ``agent_loop``;
- ``agent_loop`` (and ``active_rollouts``): an osmosis-rollout server, or a server of the
  original SDK: protocol v1, which every osmosis-rollout server speaks;
- ``{"status": "ok"}`` with no ``lifecycle``: osmosis-ai 0.3.0-0.3.2, the callback wire (v2).

An answer that is none of these keeps the default (v1) and says so. A run given ``--protocol``
still reads it once, and warns when it shows another wire (``wire_conflict``): forced onto the
wrong wire, an official server fails slowly (polling driven as v2 sends no callback, so each
row waits out its timeouts) or with a bare 422. It warns and does not refuse: a server with an
unusual ``/health`` may need the flag.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx2

__all__ = ["ProbedWire", "probe_wire", "wire_conflict", "wire_of_health"]


@dataclass(frozen=True)
class ProbedWire:
    """The wire a server speaks, and the one-line reason shown to the user."""

    protocol: str
    reason: str


def wire_of_health(status: int, body: bytes, *, polling: str = "polling") -> ProbedWire:
    """The wire a ``/health`` answer shows (``polling``: the polling wire's name)."""
    try:
        data: Any = json.loads(body) if body else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return ProbedWire("v1", f"/health answered {status} without a JSON object; using v1")
    if "agent_loop" in data:
        return ProbedWire("v1", "an osmosis-rollout server (/health names its agent_loop): v1")
    lifecycle = data.get("lifecycle")
    if isinstance(lifecycle, dict) and "accepting_rollouts" in lifecycle:
        return ProbedWire(
            polling, f"/health has a lifecycle (osmosis-ai 0.3.3 or later): {polling}"
        )
    if data.get("status") == "ok":
        return ProbedWire("v2", "/health answers status ok (osmosis-ai 0.3.0-0.3.2): v2")
    return ProbedWire("v1", "/health does not say which wire it speaks; using v1")


async def probe_wire(
    http: httpx2.AsyncClient, url: str, *, api_key: str | None = None, polling: str = "polling"
) -> ProbedWire:
    """One ``GET {url}/health``; a server that cannot be reached keeps the default (v1)."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = await http.get(f"{url.rstrip('/')}/health", headers=headers, timeout=10)
    except httpx2.HTTPError as exc:
        return ProbedWire("v1", f"/health could not be read ({type(exc).__name__}); using v1")
    return wire_of_health(reply.status_code, reply.content[:65536], polling=polling)


def wire_conflict(given: str, probed: ProbedWire, *, polling: str = "polling") -> str | None:
    """The warning for ``--protocol given`` when ``/health`` shows another wire; ``None`` when
    it agrees or does not tell (our own server speaks every wire, an unknown answer none)."""
    shown = {
        "v2": "the v2 wire (osmosis-ai 0.3.0-0.3.2)",
        polling: f"the {polling} wire (osmosis-ai 0.3.3 or later)",
    }
    if probed.protocol not in shown or given == probed.protocol:
        return None
    likely = {
        "v1": "its v1 init will likely be refused with HTTP 404",
        "v2": "rollouts will likely never end (it sends no callback)",
        polling: "its starts will likely be refused with HTTP 422",
    }.get(given, "rollouts will likely fail")
    return (
        f"--protocol {given} given, but /health shows {shown[probed.protocol]}: {likely}; "
        f"drop --protocol to use {probed.protocol}"
    )
