"""Shared test settings."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio, the event loop the rollout server uses."""
    return "asyncio"
