"""A reply's body, bounded: read up to a limit, its ``Content-Encoding`` undone without
inflating past it. Shared by the carriers that read from a socket (``httpx2``, ``http1``), so a
gzip bomb or an endless body costs the same bounded memory on each (docs/security.md).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from .types import DecodeFailure

__all__ = ["decode_body", "read_capped", "size_text"]


async def read_capped(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The chunks joined, or ``DecodeFailure`` as soon as they pass ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise DecodeFailure(f"the response body is larger than {size_text(limit)}")
        parts.append(chunk)
    return b"".join(parts)


def size_text(size: int) -> str:
    """``4 MiB``, ``512 KiB``: a byte limit as people read it."""
    if size >= 2**20 and not size % 2**20:
        return f"{size // 2**20} MiB"
    if size >= 1024:
        return f"{size / 1024:g} KiB"
    return f"{size} bytes"


def decode_body(headers: Mapping[str, str], body: bytes, limit: int) -> bytes:
    """``body`` with its ``Content-Encoding`` undone (gzip, deflate; DecodeFailure otherwise),
    never inflated past ``limit`` bytes (a 64 KiB gzip bomb would be 64 MiB)."""
    coding = headers.get("content-encoding")
    if not coding or not body:
        return body
    for token in reversed(coding.split(",")):
        token = token.strip().lower()
        if token in ("", "identity"):
            continue
        if token in ("gzip", "x-gzip"):
            body = _inflate(body, zlib.MAX_WBITS | 16, limit)
        elif token == "deflate":
            try:
                body = _inflate(body, zlib.MAX_WBITS, limit)
            except DecodeFailure:  # some servers send raw deflate without the zlib wrapper
                body = _inflate(body, -zlib.MAX_WBITS, limit)
        else:
            raise DecodeFailure(f"unsupported Content-Encoding {token!r}")
    return body


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    inflater: Any = zlib.decompressobj(wbits)
    try:
        out: bytes = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise DecodeFailure(f"the response body is not valid compressed data ({exc})") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise DecodeFailure(f"the decompressed response is larger than {size_text(limit)}")
    if not inflater.eof:
        raise DecodeFailure("the compressed response body is truncated")
    return out
