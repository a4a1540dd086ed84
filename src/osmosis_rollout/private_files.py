"""Files only their owner may read: outbox entries, debug traces and trajectories.

They hold a rollout's whole conversation (scrubbed of keys, but still the user's data), so they
are created ``0600`` whatever the umask, and a rewrite (a failed replay's attempt count) keeps
that mode: ``Path.write_text`` and ``open("a")`` create files ``0644`` under the usual umask.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

__all__ = ["PRIVATE_MODE", "open_private", "write_private"]

#: Read and write for the owner only.
PRIVATE_MODE = 0o600


def open_private(path: Path, *, append: bool = True) -> IO[str]:
    """``path`` opened for text writing (appending, or truncated), created ``0600``."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, PRIVATE_MODE)
    try:
        return os.fdopen(fd, "a" if append else "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a temporary file beside it, then a rename),
    the new file ``0600``."""
    tmp = path.with_name(f".tmp-{path.name}")
    with open_private(tmp, append=False) as fh:
        fh.write(text)
    os.chmod(tmp, PRIVATE_MODE)  # an existing temporary file kept its old mode
    tmp.replace(path)
