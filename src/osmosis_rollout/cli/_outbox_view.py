"""How ``osmosis outbox list|show`` put an entry into words: one line each, or all of it.

An entry's ``attempts`` counts delivery rounds after the server's own (replays, redeliveries),
while its error names the POSTs of the last round ("after 4 attempt(s)"); the tries shown add
the two, so the number beside the error never contradicts it.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..server.state import StateBackend

_POSTS = re.compile(r" after (\d+) attempts?(?:\(s\))?")
#: What TrainGate was called at (``show`` has it): the error's kind is what matters here.
_CALLED = re.compile(r"(could not reach|POST) \S+(: | returned )")
_URL = re.compile(r"\b(https?|rediss?)://([^/\s]+)\S*")
_GAP = "  "


def store_name(backend: StateBackend) -> str:
    """The outbox's real home: files on this host's disk, or a Redis stream."""
    from ..server.state.memory import MemoryState
    from ..server.state.redis import RedisState

    if isinstance(backend, MemoryState):
        return f"the file outbox in {backend.outbox_dir}"
    if isinstance(backend, RedisState):
        return f"the Redis stream {backend.prefix}:outbox at {backend.describe()}"
    return f"the outbox of {backend.describe()}"


def short_id(row: dict[str, Any]) -> str:
    """The id to show and type: a file's name without its rollout id and ``.json`` (the stamp
    and random part that tell its writes apart); a stream entry's id as it is."""
    entry_id: str = row["id"]
    if not entry_id.endswith(".json"):
        return entry_id
    parts = entry_id.removesuffix(".json").split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else entry_id


def matches(row: dict[str, Any], wanted: set[str]) -> bool:
    """Whether ``row`` is named by any of ``wanted``: its id, short id or rollout id."""
    return bool({row["id"], short_id(row), row["rollout_id"]} & wanted)


def tries(row: dict[str, Any]) -> tuple[str, str]:
    """(the count, what it means): the last round's POSTs plus one for each earlier round.

    Earlier rounds' own POST counts are not kept, so after a replay the count is a floor."""
    match = _POSTS.search(row["error"])
    last = int(match.group(1)) if match else 1
    rounds = int(row["attempts"])
    if rounds == 0:
        return str(last), f"{last} POST(s) by the server, none since"
    return (
        f"{last + rounds}+",
        f"at least {last + rounds}: {rounds} round(s) since the server's, the last "
        f"with {last} POST(s)",
    )


def short_error(error: str) -> str:
    """The error without what ``show`` can say: no try count or TrainGate URL, other URLs cut
    to their host."""
    text = _CALLED.sub("", _POSTS.sub("", error), count=1)
    text = _URL.sub(lambda m: m.group(2), text)
    return " ".join(text.split())


def age(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _parts(row: dict[str, Any]) -> str:
    """For a protocol v2 entry, which of its callbacks are still due: ``[v2: grader] ``."""
    if row.get("protocol", "v1") == "v1":
        return ""
    return f"[{row['protocol']}: {' + '.join(row.get('pending') or [])}] "


def lines(rows: list[dict[str, Any]], width: int, now: float | None = None) -> list[str]:
    """A header and one line per entry, each at most ``width`` wide (the error is cut with an
    ellipsis to fit; a long rollout id too); the short ids stay whole, as ``show`` and
    ``replay`` take them."""
    now = time.time() if now is None else now
    cells = []
    for row in rows:
        rollout = row["rollout_id"]
        if len(rollout) > 14:
            rollout = rollout[:13] + "…"
        written = row["written_at"]
        cells.append(
            (
                short_id(row),
                rollout,
                age(now - written) if written else "?",
                tries(row)[0],
                _parts(row) + short_error(row["error"]),
            )
        )
    header = ("ID", "ROLLOUT", "AGE", "TRIES", "ERROR")
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header[:4])]
    out = []
    for values in (header, *cells):
        fixed = _GAP.join(v.ljust(w) for v, w in zip(values[:4], widths, strict=True))
        room = max(12, width - len(fixed) - len(_GAP))
        error = values[4] if len(values[4]) <= room else values[4][: room - 1] + "…"
        out.append(f"{fixed}{_GAP}{error}".rstrip())
    return out


def detail(row: dict[str, Any], now: float | None = None) -> list[tuple[str, str]]:
    """Every field of one entry (never the key), the error whole."""
    now = time.time() if now is None else now
    written = row["written_at"]
    when = "unknown"
    if written:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(written))
        when = f"{stamp} UTC ({age(now - written)} ago)"
    if row["next_at"] is None:
        next_try = "on replay (osmosis outbox replay)"
    else:
        next_try = f"in {max(0.0, row['next_at'] - now):.0f} s, by a replica"
    count, meaning = tries(row)
    return [
        ("id", row["id"]),
        ("rollout", row["rollout_id"]),
        ("result", f"{row['status'] or '?'}/{row['finish_reason'] or '?'}"),
        ("traingate", row["server_url"]),
        ("written", when),
        ("tries", f"{count} ({meaning})"),
        ("next try", next_try),
        ("kept at", row["location"]),
        ("error", row["error"]),
    ]
