"""The outbox: completion callbacks that could not be delivered, kept on disk so none is lost.

One JSON file per undelivered callback, ``<rollout id>.<UTC time>.<random>.json``:
``{"server_url", "error", "written_at", "response"}``. The per-rollout
``api_key`` is never written, in any form (raw, JSON-, repr- or URL-escaped), wherever the agent
or TrainGate put it; whoever replays a file supplies it again.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from pathlib import Path

from ..protocol import RolloutResponse, wire
from ..redaction import scrub_data
from ..tracing import safe_trace_name

__all__ = ["DEFAULT_OUTBOX_DIR", "write_outbox"]

DEFAULT_OUTBOX_DIR = Path(".osmosis") / "outbox"


def write_outbox(
    directory: Path,
    server_url: str,
    response: RolloutResponse,
    error: str,
    secret: str | None = None,
) -> Path:
    """Atomically write one undelivered callback, ``secret`` scrubbed; returns the file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    # Unique per write: a rollout id reused later must not overwrite an undelivered result.
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    stem = safe_trace_name(response.rollout_id).removesuffix(".jsonl")
    target = directory / f"{stem}.{stamp}.{secrets.token_hex(3)}.json"
    record = scrub_data(
        {
            "server_url": server_url,
            "error": error,
            "written_at": time.time(),
            "response": wire(response),
        },
        secret,
    )
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, ensure_ascii=False, indent=1)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
