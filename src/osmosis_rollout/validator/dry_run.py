"""The dry run: one real rollout through ``create_app`` and the mock TrainGate, offline.

It proves what static and dynamic checks can only suspect: that ``run`` ends within the limit,
sends exactly one result, keeps the history append-only and calls only declared tools. The
server's own log lines (an agent's traceback, say) are captured here instead of printed, and a
crash is located at the agent's own ``file:line``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..agent import RolloutAgentLoop
from ..findings import NO_COMPLETION, FindingKind, kind_of
from ..loader import error_location, frame_location
from ..protocol import RolloutStatus
from ..testing.records import LLMBackend
from ..testing.wire import WIRES, MockWire
from .result import Problem

if TYPE_CHECKING:
    from ..testing.harness import RolloutOutcome

__all__ = ["DRY_RUN_PROMPT", "dry_run", "problems_from_outcome"]

DRY_RUN_PROMPT = (
    "This is a dry run by `osmosis validate`. What is 3 + 4? Use a tool if you have one."
)

#: A finding the table does not know (a custom backend's) is a protocol problem like the rest.
_UNLISTED = ("DRY_RUN_PROTOCOL", "see docs/validate.md")


async def dry_run(
    agent: RolloutAgentLoop,
    *,
    timeout_s: float,
    location: str | None,
    backend: LLMBackend | None = None,
    protocol: MockWire | str = WIRES[0],
) -> list[Problem]:
    """Run one rollout of ``agent`` with the built-in mock LLM and report what went wrong
    (over ``protocol``, v1 or v2: the same checks, and v2's own findings)."""
    from ..testing.harness import Harness

    if backend is None:
        from ..testing.backends import MockLLMBackend

        backend = MockLLMBackend(seed=0)
    with _captured_logs() as records:
        async with Harness(
            agent,
            backend=backend,
            rollout_timeout_s=timeout_s,
            protocol=protocol,
            v2_slack_s=5.0,  # the server is ours, in this process: its callbacks come at once
        ) as harness:
            outcome = await harness.run(
                [{"role": "user", "content": DRY_RUN_PROMPT}],
                rollout_id="osmosis-validate-dry-run",
                timeout_s=timeout_s + max(1.0, timeout_s / 10),
            )
    crash_at = _crash_location(records)
    return problems_from_outcome(
        outcome, timeout_s=timeout_s, location=location, crash_location=crash_at
    )


def problems_from_outcome(
    outcome: RolloutOutcome,
    *,
    timeout_s: float,
    location: str | None,
    crash_location: str | None = None,
) -> list[Problem]:
    """Turn what the mock TrainGate saw into problems (pure, so it is easy to test)."""

    def problem(code: str, message: str, where: str | None = location) -> Problem:
        return Problem(
            code=code, severity="error", check="dry_run", location=where, message=message
        )

    if not outcome.accepted:
        return [
            problem(
                "DRY_RUN_INIT_FAILED",
                f"the server refused the rollout: {outcome.init_error}",
                "get_tools()",
            )
        ]
    problems: list[Problem] = []
    for finding in outcome.findings:
        if finding.code == NO_COMPLETION:
            continue  # reported below from the missing result
        code, fix = _problem_of(finding.code)
        problems.append(problem(code, f"{finding.message} ({finding.code}); {fix}"))
    result = outcome.result
    if result is None:
        problems.append(
            problem(
                "DRY_RUN_TIMEOUT",
                f"no result arrived within {timeout_s:g} s; make sure run() returns, and "
                "raise --timeout if the agent is just slow",
            )
        )
    elif result.status is RolloutStatus.ERROR:
        code, message = _classify_error(result.finish_reason, result.error_message or "", timeout_s)
        where = crash_location or location if code == "DRY_RUN_ERROR" else location
        problems.append(problem(code, message, where))
    elif result.reward is not None and not math.isfinite(result.reward):
        problems.append(
            problem("DRY_RUN_REWARD_INVALID", f"reward is {result.reward!r}; use a finite number")
        )
    if result is not None and result.metrics is not None:
        problems.extend(_schema_refusals(result.metrics.model_extra or {}, problem))
    return problems


def _schema_refusals(extra: dict[str, Any], problem: Callable[..., Problem]) -> list[Problem]:
    """``TOOL_SCHEMA_MISMATCH`` for each tool whose function refused calls its declared schema
    allows (``tool_schema_errors``): found running, where the dynamic checks saw no toolbox
    (one built in ``run``, say)."""
    counts = extra.get("tool_schema_errors")
    if not isinstance(counts, dict):
        return []
    return [
        problem(
            "TOOL_SCHEMA_MISMATCH",
            f"tool {name!r}: its function refused {count} call(s) of the dry run whose "
            "arguments match the schema get_tools() declares for it, so every such call fails "
            "with 'invalid arguments': the schema and the function disagree on its parameters; "
            "return toolbox.schemas from get_tools() (or make the function take the declared "
            "parameters)",
            "get_tools()",
        )
        for name, count in counts.items()
        if isinstance(count, int) and count > 0
    ]


def _problem_of(code: str) -> tuple[str, str]:
    """(problem code, fix) for a finding, from the findings table: a finding with a problem code
    of its own gives its fix; the rest are ``DRY_RUN_PROTOCOL``, pointing to their page."""
    try:
        kind: FindingKind = kind_of(code)
    except KeyError:
        return _UNLISTED
    if kind.problem is None:
        return _UNLISTED
    if kind.problem == "DRY_RUN_PROTOCOL":
        return kind.problem, f"see {kind.doc}"
    return kind.problem, kind.fix


def _classify_error(finish_reason: str | None, message: str, timeout_s: float) -> tuple[str, str]:
    """(code, message) for an ``ERROR`` result, from how ``run_rollout`` words its causes."""
    if finish_reason == "timeout":
        if (tool := _CUT_TOOL.search(message)) is not None:
            return (
                "DRY_RUN_TIMEOUT",
                f"run() did not finish within {timeout_s:g} s: {tool.group(0)}; check that tool "
                "for a call that never returns, and give the Toolbox a timeout_s (or raise "
                "--timeout if the tool is just slow)",
            )
        return (
            "DRY_RUN_TIMEOUT",
            f"run() did not finish within {timeout_s:g} s; check for a loop that never ends or "
            "an await that never returns (or raise --timeout if the agent is just slow)",
        )
    if message.startswith("reward must be"):
        return "DRY_RUN_REWARD_INVALID", f"{message}; compute a finite float (or pass no reward)"
    if message.startswith("run() returned"):
        return "DRY_RUN_NO_RESULT", message
    return "DRY_RUN_ERROR", f"the rollout ended with status ERROR: {message}"


#: How ``run_rollout`` names the tool call its deadline cut.
_CUT_TOOL = re.compile(r"tool \S+ had been running for [\d.]+ s of it$")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _crash_location(records: list[logging.LogRecord]) -> str | None:
    """``file:line`` of the innermost user frame of the first logged agent traceback."""
    for record in records:
        if record.exc_info and record.exc_info[2] is not None:
            return error_location(record.exc_info[2])
        frames = [(file, int(line)) for file, line in _FRAME.findall(record.getMessage())]
        where = frame_location(frames)
        if where is not None:
            return where
    return None


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _captured_logs() -> Iterator[list[logging.LogRecord]]:
    """Keep the package's log records (the validator never prints); yields them."""
    logger = logging.getLogger("osmosis_rollout")
    handler = _Collect()
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
