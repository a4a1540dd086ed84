"""``normal_server_url``: the one check a ``server_url`` passes before the server calls it."""

from __future__ import annotations

import pytest

from osmosis_rollout.server_url import normal_server_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://traingate.test", "http://traingate.test"),
        ("  https://traingate.test:8443/base/  ", "https://traingate.test:8443/base"),
        ("http://127.0.0.1:9000/", "http://127.0.0.1:9000"),
        ("http://[::1]:9000", "http://[::1]:9000"),
    ],
)
def test_an_accepted_url_is_stripped_of_spaces_and_trailing_slashes(
    url: str, expected: str
) -> None:
    """What passes comes back in the form the client appends its paths to."""
    assert normal_server_url(url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://traingate.test:99999", "server_url has an invalid port"),
        ("http://traingate.test:abc", "server_url has an invalid port"),
        ("ftp://traingate.test", "must be an http:// or https:// URL with a host"),
        ("http://", "must be an http:// or https:// URL with a host"),
        ("http://traingaté.test", "must be printable ASCII without spaces"),
        ("http://traingate .test", "must be printable ASCII without spaces"),
        ("http://train*gate.test", "host must be a DNS name or an IP address"),
    ],
)
def test_a_refused_url_says_why(url: str, reason: str) -> None:
    """Each refusal is a ``ValueError`` naming the rule (pydantic turns it into a 422)."""
    with pytest.raises(ValueError, match=reason):
        normal_server_url(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        # The shape: a "#" swallowed the /v1/... the client appends, a query chose
        # the internal service's action.
        ("http://127.0.0.1:9/internal/admin/reset?confirm=yes#", "without a query"),
        ("http://traingate.test/base#", "without a query"),
        ("http://traingate.test/base?", "without a query"),
        ("http://user:secret@traingate.test", "must not hold a user name or password"),
        ("http://user@traingate.test", "must not hold a user name or password"),
        ("http://2130706433", "not written as one"),
        ("http://0x7f.0.0.1:9000", "not written as one"),
        ("http://127.1", "not written as one"),
        ("http://0177.0.0.1", "not written as one"),
        ("http://traingate.1234", "not written as one"),
        (f"http://{'a' * 64}.test", "not a valid DNS name"),
        ("http://traingate..test", "not a valid DNS name"),
    ],
)
def test_a_url_that_could_redirect_the_server_is_refused(url: str, reason: str) -> None:
    """A hostile init must not pick the path, the query or the credentials the server sends,
    nor hide an address behind an unusual IPv4 spelling; a 64-character label is a clear
    refusal, not a raw ``UnicodeError`` later."""
    with pytest.raises(ValueError, match=reason):
        normal_server_url(url)


@pytest.mark.parametrize(
    "url", ["http://face.bad:8000", "http://10.0.0.7:8000", "http://[::ffff:10.0.0.7]"]
)
def test_ordinary_hosts_still_pass(url: str) -> None:
    """Names made of hex letters and usual addresses are not mistaken for odd spellings."""
    assert normal_server_url(url) == url


def test_redacted_url_hides_passwords_and_queries() -> None:
    """What ``osmosis outbox show`` prints of an entry kept before inits were checked."""
    from osmosis_rollout.server_url import destination, redacted_url

    url = "http://u:hunter2@tg.example:8000/base?token=abc#frag"
    assert redacted_url(url) == "http://u:***@tg.example:8000/base?***"
    assert redacted_url("http://tg.example/base") == "http://tg.example/base"
    assert destination(url) == "tg.example:8000"
    assert destination("http://[::1]:9/x") == "[::1]:9"
