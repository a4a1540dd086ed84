"""Where the server may send a rollout's chat turns and callbacks: the destination policy.

An init names ``server_url`` and the server then POSTs there with the init's bearer key, so
whoever can send an init chooses where the server's requests go. The policy decides which hosts
a request may reach, twice: on the URL's host when the init arrives (``check_url``: a name or an
IP literal, a 422 with the reason) and on every address the name resolves to, just before each
connection (``resolve``), so a name that later resolves to a metadata address is refused too.

With an allow-list (``--traingate HOST[:PORT] ...``, ``OSMOSIS_TRAINGATE``, ``[tool.osmosis]
traingate = [...]``) only the hosts listed are reached. Without one the default rule applies:
public and private addresses are allowed; loopback only on a server bound to loopback; never
link-local addresses (169.254.0.0/16, fe80::/10), cloud metadata names and addresses, the
unspecified address or multicast, unless an entry of the allow-list names them. IPv4 addresses
inside IPv6 (``::ffff:127.0.0.1``) are judged as the IPv4 address they carry.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio

__all__ = [
    "METADATA_HOSTS",
    "DestinationPolicy",
    "DestinationRefused",
    "check_destination",
    "parse_allowed",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Names of cloud metadata services (GCP, AWS, Azure, Oracle, Alibaba...): never reached
#: unless listed. Their addresses are link-local, or below.
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
#: Metadata addresses that are not link-local: AWS's IPv6 endpoint, Alibaba Cloud's.
_METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
_ALLOW_HINT = "if it really is your TrainGate, allow it with --traingate (or OSMOSIS_TRAINGATE)"


class DestinationRefused(ValueError):
    """A destination the policy refuses; the message says why and how to allow it."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """One allow-list entry: a host name, an address or a network, and maybe a port."""

    name: str | None
    network: Network | None
    port: int | None

    def covers_name(self, host: str, port: int) -> bool:
        return (
            self.name is not None and _port_ok(self.port, port) and _name_matches(self.name, host)
        )

    def covers_address(self, address: Address, port: int) -> bool:
        return self.network is not None and _port_ok(self.port, port) and address in self.network


def _port_ok(wanted: int | None, port: int) -> bool:
    return wanted is None or wanted == port


def _name_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def parse_allowed(value: str) -> _Entry:
    """One ``--traingate`` entry: ``HOST``, ``HOST:PORT``, ``[IPv6]:PORT``, an address or a
    network (``10.0.0.0/8``), or ``*.example.com``; a ``ValueError`` saying what is wrong."""
    text = value.strip().lower()
    port: int | None = None
    host = text
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{value!r} is not HOST[:PORT] (write IPv6 as [::1]:8000)")
        port = _port(rest[1:], value) if rest else None
    elif text.count(":") == 1:
        host, _, rest = text.partition(":")
        port = _port(rest, value)
    if not host:
        raise ValueError(f"{value!r} is not HOST[:PORT]: the host is missing")
    try:
        network = ipaddress.ip_network(host, strict=False)
    except ValueError:
        pass
    else:
        return _Entry(None, network, port)
    name = host.rstrip(".")
    if not all(label and len(label) <= 63 for label in name.removeprefix("*.").split(".")):
        raise ValueError(f"{value!r} is not HOST[:PORT] with a DNS name or an IP address")
    return _Entry(name, None, port)


def _port(text: str, value: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 65536):
        raise ValueError(f"{value!r} has an invalid port (1-65535)")
    return int(text)


def as_address(host: str) -> Address | None:
    """``host`` as an IP address (IPv4 inside IPv6 unwrapped), or None for a name."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if int(address) >> 32 == 0 and int(address) > 1:  # deprecated ::a.b.c.d
            return ipaddress.IPv4Address(int(address))
    return address


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    """Which hosts the server may call; see the module's docstring for the rule.

    ``allowed`` is the allow-list (empty: the default rule); ``loopback`` whether the default
    rule allows loopback (the server itself is bound to loopback).
    """

    allowed: tuple[_Entry, ...] = ()
    loopback: bool = True

    @classmethod
    def for_server(cls, bound_host: str, traingate: Iterable[str] = ()) -> DestinationPolicy:
        """The policy of a server bound to ``bound_host`` with the allow-list ``traingate``."""
        address = as_address(bound_host)
        loopback = bound_host == "localhost" or (address is not None and address.is_loopback)
        return cls(tuple(parse_allowed(item) for item in traingate), loopback)

    def check_url(self, url: str) -> None:
        """Refuse ``url`` (``DestinationRefused``) unless its host may be called."""
        parts = urlsplit(url)
        default = 443 if parts.scheme == "https" else 80
        self.check_host(parts.hostname or "", parts.port or default)

    def check_host(self, host: str, port: int) -> None:
        """Refuse ``host`` (a name or an IP literal, as written in a URL) unless allowed."""
        host = host.lower().rstrip(".")
        address = as_address(host)
        if address is not None:
            self.check_address(address, port, shown=host)
            return
        if self.allowed:
            if not any(entry.covers_name(host, port) for entry in self.allowed):
                raise DestinationRefused(
                    f"{host}:{port} is not in the TrainGate allow-list (--traingate)"
                )
            return
        if host in METADATA_HOSTS:
            raise DestinationRefused(f"{host} is a cloud metadata service; {_ALLOW_HINT}")
        if (host == "localhost" or host.endswith(".localhost")) and not self.loopback:
            raise DestinationRefused(
                f"{host} is this machine (loopback), refused on a server bound to a public "
                f"interface; {_ALLOW_HINT}"
            )

    def check_address(
        self, address: Address, port: int, *, shown: str | None = None, name: str | None = None
    ) -> None:
        """Refuse a resolved (or literal) ``address`` unless allowed; ``name`` is the host name
        it was resolved from, when it was."""
        address = as_address(str(address)) or address
        shown = shown or (f"{name} ({address})" if name else str(address))
        if any(entry.covers_address(address, port) for entry in self.allowed):
            return
        if name in METADATA_HOSTS and any(e.covers_name(name, port) for e in self.allowed):
            return  # a metadata service listed by name: its address is link-local
        if self.allowed and name is None:
            raise DestinationRefused(
                f"{shown}:{port} is not in the TrainGate allow-list (--traingate)"
            )
        why = self._refusal(address)
        if why is not None:
            raise DestinationRefused(f"{shown} is {why}; {_ALLOW_HINT}")

    def _refusal(self, address: Address) -> str | None:
        if address in _METADATA_ADDRESSES:
            return "a cloud metadata address"
        if address.is_link_local:
            return "link-local (cloud metadata services live there)"
        if address.is_unspecified:
            return "the unspecified address (it reaches this machine)"
        if address.is_multicast or (
            isinstance(address, ipaddress.IPv4Address) and address == _BROADCAST
        ):
            return "multicast or broadcast"
        if address.is_loopback and not self.loopback and not self.allowed:
            return "this machine (loopback), refused on a server bound to a public interface"
        return None

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses to connect to for ``host``, every one checked: the connect-time check.

        A name with any refused address is refused whole (a name that resolves to a public
        address and to a metadata address is not a TrainGate). ``OSError`` when it does not
        resolve.
        """
        self.check_host(host, port)
        literal = as_address(host.strip("[]"))
        if literal is not None:
            return [host.strip("[]")]
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        found: list[str] = []
        for _family, _type, _proto, _name, sockaddr in infos:
            text = str(sockaddr[0])
            self.check_address(ipaddress.ip_address(text.partition("%")[0]), port, name=host)
            if text not in found:
                found.append(text)
        return found


def check_destination(url: str, policy: DestinationPolicy | None) -> str | None:
    """Why ``url`` may not be called under ``policy`` (None: it may, or there is no policy).

    The one call a wire makes for each URL a start request names (v1: ``server_url``).
    """
    if policy is None:
        return None
    key = (policy, url)
    try:
        return _VERDICTS[key]
    except KeyError:
        pass
    try:
        policy.check_url(url)
    except DestinationRefused as exc:
        verdict: str | None = str(exc)
    else:
        verdict = None
    if len(_VERDICTS) >= _MAX_VERDICTS:
        _VERDICTS.clear()
    _VERDICTS[key] = verdict
    return verdict


#: ``check_destination``'s verdicts by policy and URL: the init-time check reads only the URL's
#: written host (no DNS; every connection is checked again, ``resolve``), so a verdict holds for
#: as long as the (frozen) policy lives. Bounded: it starts over at ``_MAX_VERDICTS``.
_VERDICTS: dict[tuple[DestinationPolicy, str], str | None] = {}
_MAX_VERDICTS = 1024
