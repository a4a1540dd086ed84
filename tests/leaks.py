"""Where a secret could leak: the forms a key takes in text, and the checks that none is left."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from urllib.parse import quote, quote_plus

#: A key with every character that JSON, repr and URL encoding rewrite.
NASTY_KEY = 'tg-"quoted"\\back/slash%20&plus+\'tick-9876'


def key_forms(secret: str) -> set[str]:
    """How a key shows up in text: raw, JSON-escaped (once, twice), repr'd, URL-encoded,
    HTML-escaped, base64."""
    json_once = json.dumps(secret)[1:-1]
    return {
        secret,
        json_once,
        json.dumps(json_once)[1:-1],
        repr(secret)[1:-1],
        quote(secret, safe=""),
        quote_plus(secret),
        html.escape(secret),
        base64.b64encode(secret.encode()).decode(),
    }


def every_form_absent(text: str, secret: str) -> list[str]:
    """The forms of ``secret`` (see :func:`key_forms`) that ``text`` still contains."""
    return sorted(form for form in key_forms(secret) if form in text)


def written_text(root: Path) -> str:
    """Every file under ``root``, concatenated (what a user would grep for a leaked key)."""
    return "\n".join(
        p.read_text(encoding="utf-8", errors="replace") for p in root.rglob("*") if p.is_file()
    )
