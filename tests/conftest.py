"""Shared fixtures: agents from tests/assets, and a TrainGateClient wired to a MockTrainGate."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest

from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.testing import MockTrainGate


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio, the only loop the server supports."""
    return "asyncio"


async def _no_sleep(_: float) -> None:
    return None


@pytest.fixture
def fast_retry() -> RetryPolicy:
    """The protocol's retry counts, with tiny delays."""
    return RetryPolicy(retries=3, base_delay_s=0.001, max_delay_s=0.01)


@pytest.fixture
async def mock_client(
    fast_retry: RetryPolicy,
) -> AsyncIterator[tuple[MockTrainGate, TrainGateClient]]:
    """A MockTrainGate and a TrainGateClient that reaches it in-process."""
    gate = MockTrainGate()
    http = httpx2.AsyncClient(transport=gate.transport())
    client = TrainGateClient(http, retry=fast_retry, sleep=_no_sleep)
    try:
        yield gate, client
    finally:
        await http.aclose()
