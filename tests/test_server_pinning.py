"""A server without a key on a public interface (``--no-auth``, the platform's deployment): the
first accepted init pins the hosts later inits may name, cancels go by ids only, and the
screening and the destination policy still hold (docs/security.md). In process: nothing binds."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_rollout.config import ServerSettings
from osmosis_rollout.server.pinning import FirstInitPin, is_open, origin_of

from .serving import init_body, serving
from .support import load_asset

pytestmark = pytest.mark.anyio

agents = load_asset("srv_agents")
ELSEWHERE = "http://elsewhere.example:8080"


def _open(tmp_path: Path, **extra: object) -> ServerSettings:
    """The platform's deployment: a public interface, no key."""
    return ServerSettings.model_validate(
        {"host": "0.0.0.0", "outbox_dir": tmp_path / "outbox", "shutdown_grace_s": 0, **extra}
    )


async def test_the_first_accepted_init_pins_the_hosts_later_inits_may_name(
    tmp_path: Path,
) -> None:
    """After the controller's first init, an init naming another host is a 403 that names
    neither host; one naming the controller's host still runs."""
    async with serving(agents.ToolAgent(), tmp_path, settings=_open(tmp_path)) as s:
        first = await s.init(init_body("r-1"), key=None)
        stranger = await s.init(init_body("r-2", server_url=ELSEWHERE), key=None)
        again = await s.init(init_body("r-3"), key=None)
        await s.settle()

    assert first.status_code == 202
    assert stranger.status_code == 403
    detail = stranger.json()["detail"]
    assert detail.startswith("server_url names a host this server does not call")
    assert "elsewhere" not in stranger.text
    assert "traingate.test" not in stranger.text
    assert again.status_code == 202
    assert "r-2" not in s.gate.records or s.completions("r-2") == []


async def test_an_open_server_still_refuses_what_every_server_refuses(tmp_path: Path) -> None:
    """The pin comes on top: cloud metadata is refused even as the first init, and a web page
    (an Origin header) is refused before the body is read."""
    async with serving(agents.ToolAgent(), tmp_path, settings=_open(tmp_path)) as s:
        metadata = await s.init(init_body("m", server_url="http://169.254.169.254"), key=None)
        page = await s.init(init_body("p"), key=None, Origin="https://evil.example")
        first = await s.init(init_body("r-1"), key=None)  # the refused ones pinned nothing
        await s.settle()
    assert (metadata.status_code, page.status_code, first.status_code) == (422, 403, 202)


async def test_an_open_server_cancels_by_ids_only(tmp_path: Path) -> None:
    """One request must not end every rollout of a server anyone can reach."""
    async with serving(agents.ToolAgent(), tmp_path, settings=_open(tmp_path)) as s:
        everything = await s.http.post("/rollout/cancel", json={"all": True})
        prefixed = await s.http.post("/v1/rollout/cancel", json={"prefix": "r-"})
        by_id = await s.http.post("/rollout/cancel", json={"ids": ["r-9"]})
    assert everything.status_code == prefixed.status_code == 403
    assert "by ids only" in everything.json()["detail"]
    assert by_id.status_code == 200
    assert by_id.json() == {"dispositions": {"r-9": "not_found"}}


@pytest.mark.parametrize(
    ("settings", "cancel_all"),
    [
        ({"host": "127.0.0.1"}, 200),  # loopback: the machine is the boundary
        ({"host": "0.0.0.0", "api_key": "server-key-0123456789"}, 200),  # the key authenticates
        # The operator's allow-list replaces the pin; the server is still open to anyone.
        ({"host": "0.0.0.0", "traingate": ["traingate.test", "elsewhere.example:8080"]}, 403),
    ],
    ids=["loopback", "keyed", "traingate"],
)
async def test_nothing_is_pinned_with_a_key_on_loopback_or_with_an_allow_list(
    tmp_path: Path, settings: dict[str, object], cancel_all: int
) -> None:
    """Inits naming different hosts both run where the pin is not what protects the server."""
    chosen = ServerSettings.model_validate({"outbox_dir": tmp_path / "o", **settings})
    key = "server-key-0123456789" if chosen.api_key else None
    async with serving(agents.ToolAgent(), tmp_path, settings=chosen) as s:
        first = await s.init(init_body("r-1"), key=key)
        other = await s.init(init_body("r-2", server_url=ELSEWHERE), key=key)
        cancelled = await s.http.post(
            "/rollout/cancel",
            json={"all": True},
            headers={"Authorization": f"Bearer {key}"} if key else {},
        )
    assert (first.status_code, other.status_code) == (202, 202)
    assert cancelled.status_code == cancel_all


def test_a_first_init_that_was_not_accepted_gives_the_pin_back() -> None:
    """A refused or failed first init pins nothing; an init arriving while the first is being
    admitted is checked against it."""
    pin = FirstInitPin()
    refusal, claim = pin.hold([("server_url", "http://a.example")])
    assert refusal is None
    assert claim is not None
    during, _ = pin.hold([("server_url", "http://b.example")])
    assert during is not None
    pin.settle(claim, accepted=False)
    assert pin.origins is None
    refusal, claim = pin.hold([("chat_completions_url", "http://b.example/r/1")])
    pin.settle(claim, accepted=True)
    assert pin.origins == frozenset({"http://b.example:80"})
    assert pin.hold([("grader_callback_url", "HTTP://B.example:80/x")]) == (None, None)


def test_origins_make_the_port_explicit() -> None:
    """Spellings of one origin are one origin; another port is another origin."""
    assert origin_of("https://Gate.example/x") == "https://gate.example:443"
    assert origin_of("http://[::1]:8000/cb") == "http://[::1]:8000"
    assert origin_of("http://gate.example:8000") != origin_of("http://gate.example:8001")


def test_only_a_keyless_public_server_is_open() -> None:
    """The rule the pin and the cancel restriction follow."""
    assert is_open(ServerSettings(host="0.0.0.0"))
    assert not is_open(ServerSettings(host="127.0.0.1"))
    assert not is_open(ServerSettings(host="0.0.0.0", api_key="k" * 16))


def test_the_banner_says_the_server_is_open_and_pinned() -> None:
    """The operator sees what an open server trusts (the banner of `osmosis serve`)."""
    from rich.console import Console

    from osmosis_rollout.cli.serve import _print_banner

    console = Console(record=True, width=200)
    _print_banner(console, "agent.py:A", "a", ServerSettings(host="0.0.0.0"), generated=False)
    text = console.export_text()
    assert "auth          off on a public interface (--no-auth)" in text
    assert "cancels by ids only" in text
    assert "the hosts of the first accepted init only (pinned: no key, no --traingate)" in text
    listed = Console(record=True, width=200)
    allowed = ServerSettings(host="0.0.0.0", traingate=("tg.internal:443",))
    _print_banner(listed, "agent.py:A", "a", allowed, generated=False)
    assert "tg.internal:443 only (--traingate)" in listed.export_text()
