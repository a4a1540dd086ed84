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
