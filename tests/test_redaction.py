"""``redaction``: the HTML-escaped and base64 forms of a key, and passwords in URLs."""

from __future__ import annotations

import base64
import html

import pytest

from osmosis_rollout.redaction import REDACTED, redact_url, scrub, secret_forms

KEY = 'sk-"7f3a"<b>&\'9/+key'


@pytest.mark.parametrize(
    "text",
    [
        f"<td>{html.escape(KEY)}</td>",
        f"<td>{html.escape(KEY).replace('&#x27;', '&#39;')}</td>",
        f"<pre>{html.escape(KEY, quote=False)}</pre>",
        f"data: {base64.b64encode(KEY.encode()).decode()}",
        f"data: {base64.urlsafe_b64encode(KEY.encode()).decode()}",
    ],
)
def test_html_escaped_and_base64_forms_of_the_key_are_scrubbed(text: str) -> None:
    """A key shown in an HTML page or carried in base64 is scrubbed like its raw form."""
    cleaned = scrub(text, KEY)
    assert REDACTED in cleaned
    assert not [form for form in secret_forms(KEY) if form in cleaned]


@pytest.mark.parametrize("prefix", ["", "u:", "us:", "use:"])
@pytest.mark.parametrize("suffix", ["", "x", "xy", "xyz"])
def test_the_key_inside_a_longer_base64_text_is_scrubbed(prefix: str, suffix: str) -> None:
    """``Authorization: Basic base64(user:key)``: the key's part of the encoding goes, at any
    alignment, and what is left says at most a byte or two of it."""
    secret = "sk-abcdefgh1234567890"
    encoded = base64.b64encode(f"{prefix}{secret}{suffix}".encode()).decode()
    cleaned = scrub(f"Authorization: Basic {encoded}", secret)
    assert REDACTED in cleaned
    kept = cleaned.removeprefix("Authorization: Basic ").replace(REDACTED, "")
    assert len(kept) <= 16, cleaned  # the prefix's and suffix's own characters, about


def test_a_short_key_has_no_base64_core_that_would_match_other_text() -> None:
    """Below six bytes only the whole encodings are forms: a two-character core would eat
    unrelated base64."""
    assert base64.b64encode(b"abc").decode() not in {f for f in secret_forms("abcd") if len(f) < 4}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:hunter2@h:8/x?q=1", "http://user:***@h:8/x?q=1"),
        ("https://hunter2@h/x", "https://***@h/x"),
        ("http://a:b@c@h/x", "http://a:***@h/x"),
        ("http://h/x", "http://h/x"),
        ("http://[::1/x@y", "***@y"),  # unparseable: everything before the last @ goes
    ],
)
def test_a_password_in_a_url_is_replaced_by_stars(url: str, shown: str) -> None:
    """Wherever a URL is written, its userinfo's secret part is ``***``."""
    assert redact_url(url) == shown
