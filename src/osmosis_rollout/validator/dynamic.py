"""Dynamic checks on a loaded agent: its ``name``, ``run`` and the tools ``get_tools`` returns.

The tools are judged by ``tools.checks``, as the server judges them, with every problem of every
tool reported (the server raises the first) and the advice the server does not enforce: each
``parameters`` against the JSON Schema metaschema, which TrainGate and the model rely on. A
declared tool that a ``Toolbox`` of the agent runs (an attribute of the agent or its class, or a
global of its module, holding a tool of that name) is also held against the function:
``TOOL_SCHEMA_MISMATCH`` when they name other parameters (``tools.agreement``).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import sys
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any

import anyio

from ..agent import RolloutAgentLoop
from ..loader import error_location
from ..protocol import OpenAIFunctionToolSchema, RolloutRequest
from ..tools.agreement import disagreements, find_spec
from ..tools.checks import tool_problems
from ..tools.toolbox import Toolbox
from .result import Problem, Severity

__all__ = [
    "check_agreement",
    "check_instance",
    "check_tool_list",
    "check_tools",
    "sample_request",
]


def _problem(
    code: str, location: str | None, message: str, severity: Severity = "error"
) -> Problem:
    return Problem(
        code=code, severity=severity, check="dynamic", location=location, message=message
    )


def sample_request() -> RolloutRequest:
    """The request ``get_tools`` is called with: what a typical TrainGate init carries."""
    return RolloutRequest(
        rollout_id="osmosis-validate",
        server_url="http://traingate.invalid",
        messages=[{"role": "user", "content": "What is 3 + 4?"}],
        completion_params={"temperature": 1.0, "max_tokens": 512},
    )


def check_instance(agent: RolloutAgentLoop, location: str | None) -> list[Problem]:
    """``name`` is a non-blank string and ``run`` is a coroutine function."""
    problems: list[Problem] = []
    name = getattr(agent, "name", None)
    if not isinstance(name, str) or not name.strip():
        problems.append(
            _problem(
                "NAME_INVALID",
                location,
                f"agent.name is {name!r}; it must be a non-empty string such as "
                f'"{type(agent).__name__.lower()}"',
            )
        )
    if not inspect.iscoroutinefunction(getattr(agent, "run", None)):
        problems.append(
            _problem(
                "RUN_NOT_ASYNC",
                location,
                "agent.run is not a coroutine function: write `async def run(self, ctx)`",
            )
        )
    return problems


async def check_tools(
    agent: RolloutAgentLoop, request: RolloutRequest, *, timeout_s: float
) -> tuple[list[Problem], int | None]:
    """Call ``get_tools`` (sync or async) and check what it returns; (problems, tool count)."""
    raw: Any = None
    try:
        # move_on_after, not fail_after: a TimeoutError that get_tools itself raises (a slow
        # tool registry, say) is a failure to report as such, not our deadline.
        with anyio.move_on_after(timeout_s) as deadline:
            raw = agent.get_tools(request)
            if inspect.isawaitable(raw):
                raw = await raw
    except Exception as exc:
        return [
            _problem(
                "GET_TOOLS_FAILED",
                error_location(exc.__traceback__) or "get_tools()",
                f"get_tools() raised {type(exc).__name__}: {exc}; the server answers 500 to "
                "every init while this happens",
            )
        ], None
    if deadline.cancelled_caught:
        return [
            _problem(
                "GET_TOOLS_TIMEOUT",
                "get_tools()",
                f"get_tools() did not return within {timeout_s:g} s; TrainGate waits for it "
                "before every rollout, so keep it fast (load tool definitions once, in __init__)",
            )
        ], None
    if raw is None:
        return [
            _problem(
                "GET_TOOLS_RETURNED_NONE",
                "get_tools()",
                "get_tools() returned None; return [] when the agent has no tools",
                "warning",
            )
        ], 0
    if not isinstance(raw, list | tuple):
        return [
            _problem(
                "GET_TOOLS_NOT_LIST",
                "get_tools()",
                f"get_tools() returned {type(raw).__name__}; it must return a list of tools",
            )
        ], None
    problems = check_tool_list(raw) + check_agreement(agent, raw) + check_async_tools(agent)
    return problems, len(raw)


def check_tool_list(raw: Sequence[Any]) -> list[Problem]:
    """Every problem of every tool in ``raw``, located as ``tools[i].function...``
    (``tools.checks.tool_problems``, as ``Problem``s)."""
    return [
        _problem(p.code, p.location, p.message, p.severity) for p in tool_problems(raw).problems
    ]


def check_agreement(agent: RolloutAgentLoop, raw: Sequence[Any]) -> list[Problem]:
    """``TOOL_SCHEMA_MISMATCH`` for each parameter on which a declared tool and the function
    of a ``Toolbox`` the agent holds under the same name disagree (``tools.agreement``)."""
    toolboxes = list(_toolboxes(agent))
    if not toolboxes:
        return []
    problems: list[Problem] = []
    for i, item in enumerate(raw):
        try:
            tool = OpenAIFunctionToolSchema.model_validate(item)
        except Exception:  # reported by the tool checks
            continue
        spec = find_spec(toolboxes, tool.function.name)
        if spec is None:
            continue
        for found in disagreements(tool, spec):
            problems.append(
                _problem(
                    "TOOL_SCHEMA_MISMATCH",
                    f"tools[{i}].function.parameters{found.path}",
                    found.message,
                    found.severity,
                )
            )
    return problems


def check_async_tools(agent: RolloutAgentLoop) -> list[Problem]:
    """``BLOCKING_CALL`` for a blocking call in an ``async def`` tool of a ``Toolbox`` the
    agent holds, wherever the tool is defined (a template's ``tools.py``, not the agent's file,
    which the static checks read): a sync tool runs in a thread, an async one on the loop."""
    from .ast_helpers import _import_map
    from .static import blocking_calls

    problems: list[Problem] = []
    seen: set[int] = set()
    for toolbox in _toolboxes(agent):
        for spec in toolbox._specs.values():
            fn = inspect.unwrap(spec.fn)
            if not spec.is_async or id(fn) in seen:
                continue
            seen.add(id(fn))
            try:
                module = inspect.getmodule(fn)
                imports = _import_map(ast.parse(inspect.getsource(module))) if module else {}
                lines, first = inspect.getsourcelines(fn)
                tree = ast.parse(textwrap.dedent("".join(lines)))
            except (OSError, TypeError, SyntaxError):  # no source to read (built, C, a REPL)
                continue
            node = next((n for n in tree.body if isinstance(n, ast.AsyncFunctionDef)), None)
            if node is None:
                continue
            where = os.path.basename(inspect.getsourcefile(fn) or "?")
            for call, qualified, what in blocking_calls(node, imports):
                problems.append(
                    _problem(
                        "BLOCKING_CALL",
                        f"{where}:{first + call.lineno - 1} (tool {spec.name!r})",
                        f"{qualified}() in the async tool {spec.name!r} blocks the event loop "
                        f"and stalls every other rollout on this server; {what}, or make the "
                        "tool a plain def (a Toolbox runs those in threads)",
                        "warning",
                    )
                )
    return problems


#: At most this many items of one list, tuple or dict are looked at (a module may hold data).
_MAX_ITEMS = 1000


def _toolboxes(agent: RolloutAgentLoop) -> Iterator[Toolbox]:
    """The toolboxes an agent can reach by name: its attributes, its class's (and bases'),
    its module's globals; one level into lists, tuples and dicts. Each once, in that order."""
    seen: set[int] = set()
    places: list[Any] = [getattr(agent, "__dict__", {})]
    places.extend(vars(cls) for cls in type(agent).__mro__ if cls not in (object, RolloutAgentLoop))
    module = sys.modules.get(type(agent).__module__)
    if module is not None:
        places.append(vars(module))
    for place in places:
        for value in list(place.values()):
            inner = value.values() if isinstance(value, dict) else value
            items = inner if isinstance(value, list | tuple | dict) else (value,)
            for item in itertools.islice(items, _MAX_ITEMS):
                if isinstance(item, Toolbox) and id(item) not in seen:
                    seen.add(id(item))
                    yield item
