"""Shared test settings."""

from __future__ import annotations

import pytest

from __PACKAGE__.bwrap import sandbox_problem


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio, the event loop the rollout server uses."""
    return "asyncio"


@pytest.fixture
def sandbox() -> None:
    """Skip, saying why, where model code cannot run confined (bubblewrap missing or blocked)."""
    problem = sandbox_problem()
    if problem is not None:
        pytest.skip(f"the sandbox cannot run here: {problem}")
