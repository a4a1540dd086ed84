"""Active conformance probes: the defects of the original server, asked of the server under test.

The rows show what a server does with good input; a trainer also meets its answers to bad input
and to a resent init. Three defects of osmosis-ai's server (docs/protocol-v2.md, D3, D4, D6)
are such answers, so they are probed here with one hostile ``POST /rollout`` each, on v2 or the
polling wire (both start there), after the rows ran:

- a body missing ``initial_messages`` but carrying made-up keys: the answer (its first 64 KiB)
  must not hold them (``error_echoes_secrets``);
- a ``NaN`` and a negative ``agent_timeout_sec`` (the ``NaN`` as the bare JSON token Python's
  parser, and so osmosis-ai's, accepts): a client's mistake is a 4xx, never a 5xx
  (``bad_input_server_error``);
- a rollout run to its end, then its init sent again: accepted *and* run again (more chat calls
  or callbacks for the id) is ``duplicate_rollout_run_twice``; a 409, or the first answer
  again with nothing run, is right.

Any probe the server accepts is cancelled at once, so nothing it started keeps running. Each
finding is one run-level finding citing the line of the protocol page on its risk; ``--strict``
fails the run on them. Hostile input may be logged by the server as an error, so the probes run
by default only against a server launched for the run (``--conformance`` asks for them with
``--server``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from ..findings import BAD_INPUT_SERVER_ERROR, DUPLICATE_ROLLOUT_RUN_TWICE, ERROR_ECHOES_SECRETS
from ..testing.records import Finding, completion_from_message

if TYPE_CHECKING:
    import httpx2

    from ..protocol import CompletionsRequest, CompletionsResponse, RolloutRequest
    from ..testing.harness import Harness
    from ..testing.records import LLMBackend, RolloutRecord
    from ..testing.wire import Controller, GateState, MockWire
    from ..transport import Reply

__all__ = [
    "PROBED_WIRES",
    "READ_LIMIT",
    "WHY_DUPLICATE",
    "WHY_ECHO",
    "WHY_SERVER_ERROR",
    "Conformance",
    "probe_server",
]

#: The wires whose start route is probed (v1's init is not: its server is ours).
PROBED_WIRES = ("v2", "polling")
#: The most of an answer read: enough for any error body, bounded against an endless one.
READ_LIMIT = 64 * 1024
#: Where docs/protocol-v2.md explains each risk (checked by tests/test_conformance.py).
WHY_ECHO = "docs/protocol-v2.md:169"
WHY_SERVER_ERROR = "docs/protocol-v2.md:170"
WHY_DUPLICATE = "docs/protocol-v2.md:166"
#: The longest a probe rollout may take (agent and grader each), unless the run's own timeout
#: is shorter.
PROBE_TIMEOUT_S = 30.0
#: How long a repeated init's rerun is waited for at least, and at most (scaled between them by
#: how long the first run took to reach the model).
RERUN_WAIT_S = (2.0, 20.0)
_CALL_TIMEOUT_S = 30.0


@dataclass
class Conformance:
    """What the probes found, and what they cost the server."""

    findings: list[Finding] = field(default_factory=list)
    #: The HTTP requests sent to the server under test.
    requests: int = 0
    #: The probes run (0 when the wire has none).
    probes: int = 0
    #: Probes that could not judge, and why (a first rollout that never finished).
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The run's line about them."""
        found = ", ".join(f.code for f in self.findings) or "no finding"
        text = (
            f"conformance: {self.probes} probe(s) of POST /rollout sent {self.requests} "
            f"request(s) to the server: {found}"
        )
        return "; ".join([text, *self.notes])

    def as_dict(self, *, strict: bool) -> dict[str, Any]:
        """The summary's ``conformance`` part."""
        return {
            "probes": self.probes,
            "requests": self.requests,
            "findings": [f.code for f in self.findings],
            "notes": list(self.notes),
            "fails_run": strict and bool(self.findings),
        }


async def _bounded(
    http: httpx2.AsyncClient,
    method: str,
    url: str,
    content: bytes | None,
    headers: Mapping[str, str],
    *,
    limits: Any = _CALL_TIMEOUT_S,
) -> Reply:
    """One request, its answer read up to :data:`READ_LIMIT` bytes (the rest left unread)."""
    from ..transport import Reply

    chunks: list[bytes] = []
    size = 0
    async with http.stream(
        method, url, content=content, headers=dict(headers), timeout=limits
    ) as response:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= READ_LIMIT:
                break
        status, answer_headers = response.status_code, dict(response.headers)
    return Reply(status, answer_headers, b"".join(chunks)[:READ_LIMIT])


class _Link:
    """How the probes reach the server: every request counted and read bounded; also the
    ``PostTransport`` and ``ServerCalls`` a wire's controller drives a rollout with."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http
        self.requests = 0

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """One POST (a start or a cancel)."""
        self.requests += 1
        return await _bounded(self.http, "POST", url, content, headers)

    async def get(self, url: str, headers: Mapping[str, str]) -> Reply:
        """One GET (a status, or a polling wire's long poll, which may take the server's wait)."""
        import httpx2

        from ..testing.wire import GET_READ_S

        self.requests += 1
        timeout = httpx2.Timeout(10.0, read=GET_READ_S)
        return await _bounded(self.http, "GET", url, None, headers, limits=timeout)

    async def aclose(self) -> None:
        """The client is the harness's."""


class _ProbeBackend:
    """The gate's LLM while the probes run: each probe rollout's turns are answered ``ok``
    (an answer that ends a rollout at once) and counted; any other rollout's go to the run's
    backend, which never hears of the probes (no cassette or trajectory holds them)."""

    def __init__(self, inner: LLMBackend) -> None:
        self.inner = inner
        self.ids: set[str] = set()
        self.calls: dict[str, list[float]] = {}

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        rid = record.rollout_id
        if rid not in self.ids:
            return await self.inner.complete(request, record)
        self.calls.setdefault(rid, []).append(time.monotonic())
        return completion_from_message(request, {"content": "ok"}, turn=len(record.replies))

    def rollout_completed(self, record: RolloutRecord, response: Any) -> None:
        if record.rollout_id in self.ids:
            return
        observe = getattr(self.inner, "rollout_completed", None)
        if observe is not None:
            observe(record, response)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass(frozen=True)
class _Keys:
    llm: str
    callback: str | None


class _Prober:
    """One probe session: the wire's start body and registration, the link, the counts."""

    def __init__(
        self,
        harness: Harness,
        link: _Link,
        backend: _ProbeBackend,
        notes: list[str],
        timeout_s: float,
    ) -> None:
        from ..testing.wire import V2

        self.harness = harness
        self.gate: GateState = harness.gate
        self.wire: MockWire = harness.wire
        self.controller: Controller = harness.gate.controller(harness.wire)
        self.v2 = harness.wire is V2
        self.link = link
        self.backend = backend
        assert harness.server_url is not None
        self.url = harness.server_url
        self.key = harness.server_key
        self.notes = notes
        self.timeout_s = timeout_s

    def headers(self) -> dict[str, str]:
        from ..testing.wire import server_headers

        return server_headers(self.key)

    def request(self, kind: str) -> RolloutRequest:
        """A probe rollout's request, its id registered with the probe backend."""
        from ..protocol import RolloutRequest
        from ..testing.wire import MOCK_API_KEY

        rid = f"osmosis-conformance-{kind}-{uuid.uuid4().hex[:12]}"
        self.backend.ids.add(rid)
        return RolloutRequest(
            rollout_id=rid,
            server_url=self.gate.base_url,
            messages=[{"role": "user", "content": "Say ok."}],
            completion_params={},
            api_key=MOCK_API_KEY,
        )

    def body(self, request: RolloutRequest, keys: _Keys, timeout_s: float) -> dict[str, Any]:
        """The wire's start body for ``request`` (only the wire's fields, its keys ``keys``)."""
        if self.v2:
            from ..testing.wire.v2 import start_body

            assert keys.callback is not None
            return start_body(
                request,
                base_url=self.gate.base_url,
                llm_key=keys.llm,
                callback_key=keys.callback,
                agent_timeout_s=timeout_s,
                grader_timeout_s=timeout_s,
            )
        from ..testing.wire.polling import start_body as polling_body

        return polling_body(
            request,
            base_url=self.gate.base_url,
            llm_key=keys.llm,
            agent_timeout_s=timeout_s,
            grader_timeout_s=timeout_s,
        )

    def register(self, request: RolloutRequest, keys: _Keys) -> RolloutRecord:
        """Make the gate expect ``request``'s calls, should the server start it."""
        if self.v2:
            from ..testing.wire.v2 import V2Controller

            assert isinstance(self.controller, V2Controller)
            return self.controller.expect(
                request.rollout_id, api_key=keys.llm, callback_key=keys.callback, request=request
            )
        from ..testing.wire.polling import PollingController

        assert isinstance(self.controller, PollingController)
        return self.controller.expect(request.rollout_id, api_key=keys.llm, request=request)

    async def start(self, body: bytes) -> Reply | None:
        """``POST /rollout`` with ``body``; None when no answer came. Sent once more when the
        connection failed before an answer (a server that answered a 500 may close the
        connection the next request was about to reuse)."""
        import httpx2

        for _ in range(2):
            try:
                return await self.link.post(f"{self.url}/rollout", body, self.headers())
            except httpx2.TimeoutException:
                return None
            except (httpx2.TransportError, OSError):
                continue
        return None

    async def cancel(self, rollout_id: str) -> None:
        """Cancel what an accepted probe started (the answer does not matter)."""
        body = json.dumps({"ids": [rollout_id]}).encode()
        try:
            await self.link.post(f"{self.url}/rollout/cancel", body, self.headers())
        except Exception:  # a cleanup: the run's report does not depend on it
            return

    # -- the probes -----------------------------------------------------------------------

    async def echo(self) -> Finding | None:
        """A body missing ``initial_messages`` with canary keys: does the answer hold them?"""
        request = self.request("echo")
        canaries = {"llm_api_key": f"osmosis-canary-llm-{uuid.uuid4().hex}"}
        if self.v2:
            canaries["controller_api_key"] = f"osmosis-canary-callback-{uuid.uuid4().hex}"
        keys = _Keys(canaries["llm_api_key"], canaries.get("controller_api_key"))
        self.register(request, keys)
        body = self.body(request, keys, self.timeout_s)
        del body["initial_messages"]
        reply = await self.start(json.dumps(body).encode())
        if reply is None:
            return None
        if 200 <= reply.status_code < 300:
            await self.cancel(request.rollout_id)
        echoed = [name for name, value in canaries.items() if value.encode() in reply.content]
        if not echoed:
            return None
        return Finding(
            ERROR_ECHOES_SECRETS,
            f"POST /rollout without initial_messages was answered HTTP {reply.status_code} "
            f"with a body holding the {' and the '.join(echoed)} it carried: a controller "
            "logs the answers it gets, so the keys reach whoever reads its logs, who can then "
            f"spend the model{' and post callbacks' if len(echoed) > 1 else ''} ({WHY_ECHO})",
            details={"http": reply.status_code, "echoed": echoed},
        )

    async def timeouts(self) -> Finding | None:
        """A ``NaN`` and a negative ``agent_timeout_sec``: is either answered 5xx?"""
        from ..testing.wire import MOCK_API_KEY, MOCK_CALLBACK_KEY

        failed: list[tuple[str, int]] = []
        for shown, value in (("NaN", float("nan")), ("-1", -1.0)):
            request = self.request("timeout")
            keys = _Keys(MOCK_API_KEY, MOCK_CALLBACK_KEY if self.v2 else None)
            self.register(request, keys)
            body = self.body(request, keys, self.timeout_s)
            body["agent_timeout_sec"] = value
            reply = await self.start(json.dumps(body, allow_nan=True).encode())  # the NaN token
            if reply is None:
                continue
            if 200 <= reply.status_code < 300:
                await self.cancel(request.rollout_id)
            if reply.status_code >= 500:
                failed.append((shown, reply.status_code))
        if not failed:
            return None
        said = " and ".join(
            f"agent_timeout_sec {shown} was answered HTTP {code}" for shown, code in failed
        )
        return Finding(
            BAD_INPUT_SERVER_ERROR,
            f"POST /rollout with {said}: a client's mistake must be a 4xx naming the field; a "
            "5xx says the server failed, so a controller retries a body that can never "
            f"succeed ({WHY_SERVER_ERROR})",
            details={"answers": dict(failed)},
        )

    async def duplicate(self) -> Finding | None:
        """A rollout run to its end, then its init again: accepted and run a second time?"""
        from ..testing.wire import MOCK_API_KEY, MOCK_CALLBACK_KEY, ServerLink

        request = self.request("repeat")
        rid = request.rollout_id
        link = ServerLink(
            post=self.link, calls=self.link, base_url=self.url, key=self.key, slack_s=10.0
        )
        started = time.monotonic()
        record, reply = await self.controller.run(
            link, request, timeout_s=self.timeout_s, grader_timeout_s=self.timeout_s
        )
        if reply.status_code != 202 or not record.completions:
            self.notes.append(
                "the repeated-id probe's first rollout did not finish, so it was not judged"
            )
            return None
        keys = _Keys(MOCK_API_KEY, MOCK_CALLBACK_KEY if self.v2 else None)
        body = json.dumps(self.body(request, keys, self.timeout_s), separators=(",", ":"))
        chats_before = len(self.backend.calls.get(rid, []))
        callbacks_before = _callbacks(record)
        again = await self.start(body.encode())
        if again is None or not 200 <= again.status_code < 300:
            return None
        calls = self.backend.calls.get(rid, [])
        to_model = (calls[0] - started) if calls else 0.0
        wait_s = min(RERUN_WAIT_S[1], max(RERUN_WAIT_S[0], 4 * to_model))
        # a rerun shows as chat calls (both wires) and, on v2, two more callbacks: waited
        # for whole, so the rerun has ended before its rollout is cancelled
        await _until(
            lambda: (
                _callbacks(record) >= callbacks_before + 2
                or (not self.v2 and len(self.backend.calls.get(rid, [])) > chats_before)
            ),
            wait_s,
        )
        chats = len(self.backend.calls.get(rid, [])) - chats_before
        callbacks = _callbacks(record) - callbacks_before
        await self.cancel(rid)
        if not (chats or callbacks):
            return None
        return Finding(
            DUPLICATE_ROLLOUT_RUN_TWICE,
            f"POST /rollout repeating the rollout_id of a finished rollout was answered HTTP "
            f"{again.status_code} and the server ran it again ({chats} more chat call(s), "
            f"{callbacks} more callback(s)): a controller resends an init whose answer it "
            "lost, and gets the rollout run twice, the model paid twice and two results for "
            f"one id ({WHY_DUPLICATE})",
            details={"http": again.status_code, "chat_calls": chats, "callbacks": callbacks},
        )


async def _until(condition: Callable[[], bool], wait_s: float) -> None:
    """Return once ``condition()`` holds, or after ``wait_s`` (looked at every 50 ms: what it
    watches is the gate's records, which signal nothing)."""
    ticks = max(1, int(wait_s / 0.05))
    for _ in range(ticks):
        if condition():
            return
        await anyio.sleep(0.05)


def _callbacks(record: RolloutRecord) -> int:
    """The completion and grader callbacks a v2 rollout got (0 on the polling wire)."""
    exchange = record.v2
    if exchange is None:
        return 0
    return len(exchange.completions) + len(exchange.graders)


async def probe_server(
    harness: Harness,
    say: Callable[[str], None] | None = None,
    *,
    timeout_s: float = PROBE_TIMEOUT_S,
    rollouts_end: bool = True,
) -> Conformance:
    """Run the probes against ``harness``' server (a ``server_url`` harness, inside its
    ``async with``, after the rows): their findings and how many requests they sent.
    ``timeout_s`` bounds a probe rollout (at most :data:`PROBE_TIMEOUT_S`); ``rollouts_end``
    False (no row's rollout ended) skips the repeated-id probe, which needs one that does."""
    done = Conformance()
    http = harness.server_http
    if harness.wire.protocol not in PROBED_WIRES or http is None:
        return done
    gate = harness.gate
    backend = _ProbeBackend(gate.backend)
    link = _Link(http)
    prober = _Prober(harness, link, backend, done.notes, min(timeout_s, PROBE_TIMEOUT_S))
    probes = [prober.echo, prober.timeouts]
    if rollouts_end:
        probes.append(prober.duplicate)
    else:
        done.notes.append(
            "no row's rollout ended on this server, so a repeated rollout_id was not probed"
        )
    gate.backend = backend
    try:
        for probe in probes:
            done.probes += 1
            finding = await probe()
            if finding is not None:
                done.findings.append(finding)
    finally:
        # the probes' records stay: a rerun's late callbacks are still answered
        gate.backend = backend.inner
        done.requests = link.requests
    if say is not None:
        say(done.line())
    return done
