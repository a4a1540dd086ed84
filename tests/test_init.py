"""The public surface: ``osmosis_rollout`` and ``osmosis_rollout.compat`` each define their
names in one table; ``__all__`` and the TYPE_CHECKING imports follow it, and every name loads."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import osmosis_rollout
import osmosis_rollout.compat

PACKAGES = [osmosis_rollout, osmosis_rollout.compat]


def _type_checking_imports(package: ModuleType) -> dict[str, str]:
    """``name -> module`` (relative to ``osmosis_rollout``) of the ``if TYPE_CHECKING:`` block."""
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text())
    base = package.__name__.split(".")
    found: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            assert isinstance(statement, ast.ImportFrom)
            assert statement.level
            parts = base[: len(base) - statement.level + 1] + (statement.module or "").split(".")
            for alias in statement.names:
                found[alias.asname or alias.name] = ".".join(parts[1:])
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_table_all_and_type_checking_imports_agree(package: ModuleType) -> None:
    """One table: ``__all__`` is its names (plus ``__version__`` at the top) and the
    TYPE_CHECKING block imports exactly those names from the same modules."""
    table: dict[str, str] = package._EXPORTS
    extra = {"__version__"} if package is osmosis_rollout else set()
    assert sorted(package.__all__) == package.__all__
    assert set(package.__all__) == set(table) | extra
    assert _type_checking_imports(package) == table


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_name_loads_from_its_home(package: ModuleType) -> None:
    """Each name is the object its home module defines (no stale entry in the table)."""
    for name, module in package._EXPORTS.items():
        home = importlib.import_module(f"osmosis_rollout.{module}")
        assert getattr(package, name) is getattr(home, name), name


def test_the_top_level_is_what_an_agent_author_needs() -> None:
    """About 30 names, none of them the legacy SDK's: those come from ``osmosis_rollout.compat``."""
    assert 25 <= len(osmosis_rollout._EXPORTS) <= 35
    assert not any(module.startswith("compat") for module in osmosis_rollout._EXPORTS.values())
    assert set(osmosis_rollout._EXPORTS).isdisjoint(osmosis_rollout._MOVED)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("create_app", "osmosis_rollout.compat (the legacy one), or use osmosis_rollout.server"),
        ("OsmosisLLMClient", "import it from osmosis_rollout.compat"),
        ("TrainGateClient", "import it from osmosis_rollout.client"),
    ],
)
def test_a_name_that_moved_says_where_it_lives(name: str, hint: str) -> None:
    """``osmosis_rollout.create_app`` (the legacy positional wrapper) does not silently become ours:
    it is gone, and the error names both homes."""
    with pytest.raises(AttributeError, match="has no attribute") as caught:
        getattr(osmosis_rollout, name)
    assert hint in str(caught.value)


def test_v1_names_load_from_compat_in_one_import() -> None:
    """A legacy project's ``from osmosis_ai.rollout import ...`` becomes one line from compat."""
    from osmosis_rollout import agent, results
    from osmosis_rollout.compat import (
        RolloutAgentLoop,
        RolloutContext,
        RolloutResult,
        context,
        create_app,
        server,
        validate_agent_loop,
        validation,
    )

    assert issubclass(RolloutAgentLoop, agent.RolloutAgentLoop)
    assert RolloutAgentLoop.context_class is RolloutContext is context.RolloutContext
    assert RolloutResult is results.RolloutResult
    assert (create_app, validate_agent_loop) == (server.create_app, validation.validate_agent_loop)


def test_importing_the_package_stays_cheap() -> None:
    """Nothing heavy is imported with the package or compat (``osmosis --help`` stays fast)."""
    code = (
        "import sys, osmosis_rollout, osmosis_rollout.compat; "
        "print(sorted(m for m in ('pydantic', 'starlette', 'httpx2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_seeds_sync_validator_imports_from_the_top_level() -> None:
    """The seed's ``validate_agent_loop(agent)`` is the core's sync validator, beside
    ``validate_agent_loop_async``: called from plain code, it reports the seed's checks (a
    ``name``, an async ``run``, the tools) with the original SDK's codes, as compat's does."""
    import inspect

    from osmosis_rollout import (
        RolloutAgentLoop,
        RolloutContext,
        RolloutRequest,
        RolloutResult,
        ValidationResult,
        validate_agent_loop,
        validate_agent_loop_async,
    )
    from osmosis_rollout.compat import validate_agent_loop as compat_validate_agent_loop

    class Agent(RolloutAgentLoop):
        name = "echo"

        def get_tools(self, request: RolloutRequest) -> list[dict[str, object]]:
            return []

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete(list(ctx.request.messages))

    class SyncRun(Agent):
        def run(self, ctx: RolloutContext) -> RolloutResult:  # type: ignore[override]
            return ctx.complete(list(ctx.request.messages))

    assert validate_agent_loop is compat_validate_agent_loop
    assert not inspect.iscoroutinefunction(validate_agent_loop)
    assert inspect.iscoroutinefunction(validate_agent_loop_async)
    good = validate_agent_loop(Agent())
    assert isinstance(good, ValidationResult)
    assert (bool(good), good.agent_name, good.tool_count) == (True, "echo", 0)
    bad = validate_agent_loop(SyncRun())
    assert not bad.valid
    assert "RUN_NOT_ASYNC" in [problem.code for problem in bad.errors]
