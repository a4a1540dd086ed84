"""``DestinationPolicy``: which hosts a rollout's chat turns and callbacks may reach, on the URL
an init names and on every address a connection resolves to (real sockets on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from osmosis_rollout.destinations import DestinationPolicy, DestinationRefused, parse_allowed
from osmosis_rollout.transport import InvalidTarget
from osmosis_rollout.transport.http1 import Http1Transport

from .support import serve_in_thread

pytestmark = pytest.mark.anyio

LOCAL = DestinationPolicy.for_server("127.0.0.1")
PUBLIC = DestinationPolicy.for_server("0.0.0.0")


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://169.254.170.2",
        "http://metadata.google.internal",
        "http://METADATA.google.internal.",
        "http://[fe80::1]:80",
        "http://[::ffff:169.254.169.254]",
        "http://[fd00:ec2::254]",
        "http://100.100.100.200",
        "http://0.0.0.0:9000",
        "http://[::]:9000",
        "http://224.0.0.1",
        "http://255.255.255.255",
    ],
)
@pytest.mark.parametrize("policy", [LOCAL, PUBLIC], ids=["loopback-server", "public-server"])
def test_link_local_and_metadata_destinations_are_refused_by_default(
    url: str, policy: DestinationPolicy
) -> None:
    """Cloud metadata (by name or address, IPv4 inside IPv6 too), the unspecified address and
    multicast are never reached without an allow-list entry; the reason says how to allow."""
    with pytest.raises(DestinationRefused, match="--traingate"):
        policy.check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000",
        "http://[::1]:9000",
        "http://[::ffff:127.0.0.1]:9000",
        "http://localhost:9000",
        "http://tg.localhost",
    ],
)
def test_loopback_is_reached_only_from_a_loopback_server(url: str) -> None:
    """A server bound to 127.0.0.1 may call a TrainGate on this machine (``osmosis test
    --server``); one on a public interface may not be pointed at this machine's services."""
    LOCAL.check_url(url)
    with pytest.raises(DestinationRefused, match="loopback"):
        PUBLIC.check_url(url)


@pytest.mark.parametrize(
    "url", ["http://10.0.0.7:8000", "https://traingate.example", "http://8.8.8.8", "http://tg"]
)
def test_private_and_public_destinations_pass_the_default_rule(url: str) -> None:
    """The default rule refuses only what is never a TrainGate."""
    LOCAL.check_url(url)
    PUBLIC.check_url(url)


def test_an_allow_list_admits_only_its_hosts_and_ports() -> None:
    """Names (and ``*.`` suffixes), addresses and networks, each with an optional port; an
    explicit entry allows even a metadata address."""
    policy = DestinationPolicy.for_server(
        "0.0.0.0",
        ["tg.internal:8000", "*.gates.example", "10.1.0.0/16", "[::1]:9001", "169.254.169.254"],
    )

    for url in [
        "http://tg.internal:8000",
        "https://a.gates.example",
        "http://10.1.2.3:5",
        "http://[::1]:9001",
        "http://169.254.169.254",
    ]:
        policy.check_url(url)
    for url in [
        "http://tg.internal:8001",
        "http://gates.example",
        "http://10.2.0.1",
        "http://[::1]:9002",
        "http://other.example",
        "http://127.0.0.1:8000",
    ]:
        with pytest.raises(DestinationRefused, match="allow-list"):
            policy.check_url(url)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("tg.internal:0", "invalid port"),
        ("tg.internal:http", "invalid port"),
        ("[::1", "not HOST"),
        (":8000", "the host is missing"),
        ("bad..name", "DNS name"),
    ],
)
def test_a_malformed_allow_list_entry_says_what_is_wrong(entry: str, message: str) -> None:
    """``--traingate`` values are checked at start (the settings' validator calls this)."""
    with pytest.raises(ValueError, match=message):
        parse_allowed(entry)


# -- after name resolution, at connect time -------------------------------------------------


def _echo() -> Starlette:
    async def completed(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "got": json.loads(await request.body())})

    return Starlette(routes=[Route("/v1/rollout/completed", completed, methods=["POST"])])


@pytest.fixture
def gate_port() -> Iterator[int]:
    """A real HTTP server on 127.0.0.1; its port."""
    with serve_in_thread(_echo()) as url:
        yield int(url.rsplit(":", 1)[1])


class Rebinding:
    """A resolver that answers ``addresses`` in turn for one name (what a DNS rebinding
    attacker's name server does with a TTL of 0); other names resolve as usual."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, *addresses: str) -> None:
        self.real = loop.getaddrinfo
        self.name = name
        self.addresses = list(addresses)
        self.asked = 0

    async def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name != self.name:
            return await self.real(host, port, *args, **kwargs)
        address = self.addresses[min(self.asked, len(self.addresses) - 1)]
        self.asked += 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]


async def test_a_name_rebound_to_a_metadata_address_is_refused_at_connect(gate_port: int) -> None:
    """The init's name resolved to 127.0.0.1 when it was first called; a new connection after
    the name moved to 169.254.169.254 is refused before any byte is sent, as an error that is
    not retried."""
    loop = asyncio.get_running_loop()
    resolver = Rebinding(loop, "tg.rebind.test", "127.0.0.1", "169.254.169.254")
    loop.getaddrinfo = resolver  # type: ignore[method-assign]
    url = f"http://tg.rebind.test:{gate_port}/v1/rollout/completed"
    headers = {"Content-Type": "application/json"}
    try:
        first = Http1Transport(destinations=LOCAL)
        reply = await first.post(url, b'{"n": 1}', headers)
        await first.aclose()
        second = Http1Transport(destinations=LOCAL)
        with pytest.raises(InvalidTarget, match=r"destination refused: .*169\.254\.169\.254"):
            await second.post(url, b'{"n": 2}', headers)
        await second.aclose()
    finally:
        del loop.getaddrinfo

    assert reply.status_code == 200
    assert reply.json()["got"] == {"n": 1}
    assert resolver.asked == 2


async def test_a_name_that_resolves_to_loopback_is_refused_from_a_public_server(
    gate_port: int,
) -> None:
    """``localhost`` spelled as any name: the resolved address is what counts."""
    loop = asyncio.get_running_loop()
    loop.getaddrinfo = Rebinding(loop, "innocent.test", "127.0.0.1")  # type: ignore[method-assign]
    transport = Http1Transport(destinations=PUBLIC)
    try:
        with pytest.raises(InvalidTarget, match="loopback"):
            await transport.post(
                f"http://innocent.test:{gate_port}/v1/rollout/completed", b"{}", {}
            )
    finally:
        del loop.getaddrinfo
        await transport.aclose()


async def test_an_allowed_name_is_called_at_the_address_that_was_checked(gate_port: int) -> None:
    """The connection goes to the address the policy checked, not to a second lookup."""
    loop = asyncio.get_running_loop()
    resolver = Rebinding(loop, "tg.internal", "127.0.0.1", "169.254.169.254")
    loop.getaddrinfo = resolver  # type: ignore[method-assign]
    policy = DestinationPolicy.for_server("0.0.0.0", ["tg.internal"])
    transport = Http1Transport(destinations=policy)
    try:
        reply = await transport.post(
            f"http://tg.internal:{gate_port}/v1/rollout/completed", b'{"a": 1}', {}
        )
    finally:
        del loop.getaddrinfo
        await transport.aclose()

    assert reply.status_code == 200
    assert resolver.asked == 1


async def test_the_httpx2_path_checks_the_address_it_connects_to(gate_port: int) -> None:
    """The fallback carrier (trio, ``OSMOSIS_HTTP_CLIENT=httpx2``) wraps httpx2's network
    backend the same way: the first connection goes to the checked address, a connection after
    the name moved to a metadata address is refused and not retried."""
    from osmosis_rollout.client import RetryPolicy, default_http_client
    from osmosis_rollout.transport import Httpx2Transport, guard_connections

    loop = asyncio.get_running_loop()
    resolver = Rebinding(loop, "tg.rebind.test", "127.0.0.1", "169.254.169.254")
    loop.getaddrinfo = resolver  # type: ignore[method-assign]
    url = f"http://tg.rebind.test:{gate_port}/v1/rollout/completed"
    try:
        http = default_http_client(RetryPolicy(), 10)
        assert guard_connections(http, LOCAL)
        first = Httpx2Transport(http, owned=True, destinations=LOCAL, resolve=False)
        reply = await first.post(url, b'{"n": 1}', {})
        await first.aclose()
        http = default_http_client(RetryPolicy(), 10)
        assert guard_connections(http, LOCAL)
        second = Httpx2Transport(http, owned=True, destinations=LOCAL, resolve=False)
        with pytest.raises(InvalidTarget, match=r"destination refused: .*169\.254\.169\.254"):
            await second.post(url, b'{"n": 2}', {})
        await second.aclose()
    finally:
        del loop.getaddrinfo

    assert reply.status_code == 200
    assert resolver.asked == 2
