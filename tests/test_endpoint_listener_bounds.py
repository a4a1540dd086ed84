"""The loopback listener's bounds (issue 38, item 3): any local process can connect to it, so
it is bounded as the main server is. The review's attack read bodies up to 64 MiB before the
token was checked (6 connections added 378 MiB), with no connection cap and no timeouts (idle
sockets held forever; at the file limit the main server stopped answering)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from osmosis_rollout.endpoint import listener as listener_module
from osmosis_rollout.endpoint.listener import LoopbackListener, listener

pytestmark = pytest.mark.anyio


@pytest.fixture
async def running() -> AsyncIterator[LoopbackListener]:
    loop_listener = listener()
    try:
        yield loop_listener
    finally:
        loop_listener.close()


async def _status(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), 5)
    return int(line.split()[1])


async def test_a_wrong_token_is_refused_before_the_body_is_read(
    running: LoopbackListener,
) -> None:
    """A 64 MiB ``Content-Length`` with a wrong token gets its 401 (or 404) from the head
    alone, without a byte of body sent: nothing is buffered for a caller without the token."""
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    head = (
        "POST /rollouts/nobody/v1/chat/completions HTTP/1.1\r\n"
        "host: 127.0.0.1\r\nauthorization: Bearer wrong\r\n"
        f"content-length: {64 * 1024 * 1024}\r\ncontent-type: application/json\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    assert await _status(reader) == 404
    writer.close()


async def test_an_idle_connection_is_closed_at_the_head_timeout(
    monkeypatch: pytest.MonkeyPatch, running: LoopbackListener
) -> None:
    """A connection that sends nothing (or a head a byte at a time) is closed at the bound."""
    monkeypatch.setattr(listener_module, "HEAD_TIMEOUT_S", 0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    writer.write(b"POST /rollouts/")  # a head that never ends
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the listener
    writer.close()


async def test_connections_beyond_the_cap_are_answered_503_and_closed(
    monkeypatch: pytest.MonkeyPatch, running: LoopbackListener
) -> None:
    """Past ``MAX_CONNECTIONS`` open connections a new one is answered 503 at once and closed,
    so idle sockets cannot use up the process's files."""
    monkeypatch.setattr(listener_module, "MAX_CONNECTIONS", 3)
    held = [await asyncio.open_connection("127.0.0.1", running.port) for _ in range(3)]
    await asyncio.sleep(0.1)  # the listener has taken all three
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    assert await _status(reader) == 503
    writer.close()
    for _, held_writer in held:
        held_writer.close()
