"""``validate_agent_loop_async``: static, then dynamic, then dry-run checks, into one result.

Each stage runs only when the previous one leaves something to check: a file that does not parse
is not imported, and an agent whose tools are broken is not dry-run (the server would refuse it).
Loading failures become problems too, so one call always returns one ``ValidationResult``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ..agent import RolloutAgentLoop
from ..errors import AgentLoadError
from ..loader import agent_from_object, class_location, find_source, load_target, parse_target
from ..protocol import RolloutRequest
from ..testing.wire import WIRES, MockWire
from .dry_run import dry_run as run_dry_run
from .dynamic import check_instance, check_tools, sample_request
from .result import Check, Problem, ValidationResult
from .static import StaticReport, check_source

__all__ = ["validate_agent_loop_async"]

Target = str | RolloutAgentLoop | type[RolloutAgentLoop]
_STOP_STATIC = frozenset({"SYNTAX_ERROR", "AGENT_NOT_FOUND", "SOURCE_UNREADABLE"})


async def validate_agent_loop_async(
    target_or_agent: Target,
    *,
    dry_run: bool = True,
    timeout_s: float = 30.0,
    request: RolloutRequest | None = None,
    protocol: MockWire | str = WIRES[0],
) -> ValidationResult:
    """Check an agent (``"file.py:Attr"``, ``"pkg.mod:Attr"``, a class or an instance).

    Never raises for problems in the agent and never prints: everything found is a ``Problem``
    in the returned ``ValidationResult``. ``request`` is what ``get_tools`` is called with (a
    typical init by default). From sync code, ``validate_agent_loop(agent)`` is the seed's
    spelling (``validator/sync.py``: no dry run, the original SDK's problem codes beside ours).
    ``protocol`` is the wire of the dry run (``testing.wire.WIRES``: the wire or its name).
    """
    validation = _Validation(target_or_agent, dry_run=dry_run, timeout_s=timeout_s)
    validation.protocol = protocol
    validation.request = request or sample_request()
    return await validation.run()


class _Validation:
    def __init__(self, target: Target, *, dry_run: bool, timeout_s: float) -> None:
        self.target = target
        self.dry_run = dry_run
        self.timeout_s = timeout_s
        self.request = sample_request()
        self.protocol: MockWire | str = WIRES[0]
        label = target if isinstance(target, str) else _label(target)
        self.result = ValidationResult(target=label)
        self.static = StaticReport()

    def add(self, problem: Problem) -> None:
        """Add a problem unless an earlier check already said the same thing."""
        for seen in self.result.problems:
            same_code = seen.code == problem.code and seen.check != problem.check
            # A later check failing where a static error already points (distinct static
            # errors at one spot, e.g. a class missing both `name` and `run`, all stay).
            same_spot = (
                problem.check != "static"
                and problem.severity == "error"
                and seen.severity == "error"
                and seen.check == "static"
                and problem.location is not None
                and seen.location == problem.location
            )
            # A class the static checks already faulted fails to be created at import.
            class_failed = (
                problem.check != "static"
                and seen.check == "static"
                and seen.severity == "error"
                and problem.location is not None
                and problem.location == self.static.class_location
            )
            if same_code or same_spot or class_failed:
                return
        self.result.problems.append(problem)

    def ran(self, check: Check) -> None:
        if check not in self.result.checks_run:
            self.result.checks_run.append(check)

    def load_problem(self, exc: AgentLoadError, check: Check) -> None:
        self.add(
            Problem(
                code=exc.code,
                severity="error",
                check=check,
                location=exc.location,
                message=str(exc),
            )
        )

    async def run(self) -> ValidationResult:
        obj = await self.load()
        if obj is None:
            return self.result
        self.ran("dynamic")
        try:
            agent = agent_from_object(obj, self.class_name)
        except AgentLoadError as exc:
            self.load_problem(exc, "dynamic")
            return self.result
        where = self.static.class_location or class_location(type(agent))
        for problem in check_instance(agent, where):
            self.add(problem)
        if isinstance(agent.name, str):
            self.result.agent_name = agent.name
        problems, count = await check_tools(agent, self.request, timeout_s=self.timeout_s)
        self.result.tools = count
        for problem in problems:
            self.add(problem)
        if self.dry_run and self.result.valid:
            self.ran("dry_run")
            run_at = self.static.run_location or where
            found = await run_dry_run(
                agent, timeout_s=self.timeout_s, location=run_at, protocol=self.protocol
            )
            for problem in found:
                self.add(problem)
        return self.result

    async def load(self) -> Any:
        """Static checks, then the import; the loaded object, or None when that failed."""
        target = self.target
        if not isinstance(target, str):
            self.class_name = _label(target).rpartition(":")[2]
            cls = target if isinstance(target, type) else type(target)
            source = _source_of(cls)
            if source is not None and cls.__qualname__ == cls.__name__:
                self.static_checks(source, cls.__name__)
            return target
        try:
            module_or_path, attr = parse_target(target)
        except AgentLoadError as exc:
            self.ran("static")
            self.load_problem(exc, "static")
            return None
        self.class_name = attr
        source = find_source(module_or_path)
        if source is not None and "." not in attr:
            self.static_checks(source, attr)
            if any(p.code in _STOP_STATIC for p in self.result.problems):
                return None
        self.ran("dynamic")
        try:
            loaded = load_target(target)
        except AgentLoadError as exc:
            self.load_problem(exc, "dynamic")
            return None
        return loaded.obj

    def static_checks(self, source: Path, class_name: str) -> None:
        self.ran("static")
        self.static = check_source(source, class_name)
        for problem in self.static.problems:
            self.add(problem)


def _label(obj: RolloutAgentLoop | type[RolloutAgentLoop]) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _source_of(cls: type) -> Path | None:
    try:
        file = inspect.getsourcefile(cls)
    except TypeError:
        return None
    return Path(file) if file and file.endswith(".py") else None
