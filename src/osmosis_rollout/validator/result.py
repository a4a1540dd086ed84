"""``ValidationResult`` and ``Problem``: what ``validate`` found, in a stable JSON shape.

The shape is documented in ``docs/validate.md``; add fields, never rename or remove them, and
bump ``version`` if a change could break a reader.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from ..errors import AgentLoopValidationError

__all__ = ["PROBLEM_CODES", "Check", "Problem", "Severity", "ValidationResult"]

Severity = Literal["error", "warning"]
Check = Literal["static", "dynamic", "dry_run"]

#: Every code a problem can carry; each one is documented in docs/validate.md. The dry run's
#: code for each finding is the findings table's ``problem`` (``osmosis_rollout.findings``).
PROBLEM_CODES = frozenset(
    {
        "AGENT_ABSTRACT",
        "AGENT_NOT_FOUND",
        "BLOCKING_CALL",
        "DRY_RUN_DUPLICATE_RESULT",
        "DRY_RUN_ERROR",
        "DRY_RUN_HISTORY_REWRITTEN",
        "DRY_RUN_INIT_FAILED",
        "DRY_RUN_NO_RESULT",
        "DRY_RUN_PROTOCOL",
        "DRY_RUN_REWARD_INVALID",
        "DRY_RUN_TIMEOUT",
        "DRY_RUN_UNKNOWN_TOOL",
        "FILE_NOT_FOUND",
        "GET_TOOLS_FAILED",
        "GET_TOOLS_MISSING",
        "GET_TOOLS_NOT_LIST",
        "GET_TOOLS_RETURNED_NONE",
        "GET_TOOLS_SIGNATURE",
        "GET_TOOLS_TIMEOUT",
        "HISTORY_REBUILT",
        "IMPORT_FAILED",
        "INIT_FAILED",
        "MODULE_NOT_FOUND",
        "MODULE_RAISED",
        "NAME_INVALID",
        "NAME_MISSING",
        "NOT_A_SUBCLASS",
        "NO_RESULT_RETURNED",
        "RUN_MISSING",
        "RUN_NOT_ASYNC",
        "RUN_SIGNATURE",
        "SOURCE_UNREADABLE",
        "SYNTAX_ERROR",
        "TARGET_INVALID",
        "TOOL_DESCRIPTION_MISSING",
        "TOOL_INVALID",
        "TOOL_NAME_DUPLICATE",
        "TOOL_NAME_INVALID",
        "TOOL_NOT_SERIALIZABLE",
        "TOOL_PARAMETERS_NOT_OBJECT",
        "TOOL_SCHEMA_INVALID",
        "TOOL_SCHEMA_MISMATCH",
    }
)


class Problem(BaseModel):
    """One thing that would make the agent fail or produce bad training data."""

    model_config = ConfigDict(frozen=True)

    code: str
    severity: Severity
    check: Check
    location: str | None = None
    message: str
    #: Extra facts for the legacy Python API (``osmosis_code``, ``exception_type``...); not in JSON.
    details: dict[str, Any] | None = Field(default=None, exclude=True)

    @property
    def field(self) -> str | None:
        """The legacy name for ``location``."""
        return self.location

    def __str__(self) -> str:
        where = f" {self.location}:" if self.location else ""
        return f"[{self.code}]{where} {self.message}"


class ValidationResult(BaseModel):
    """Everything ``validate_agent_loop_async`` (or the sync ``validate_agent_loop``) found;
    ``valid`` means "no errors" (warnings allowed)."""

    version: Literal[1] = 1
    target: str = ""
    agent_name: str | None = None
    tools: int | None = None
    checks_run: list[Check] = Field(default_factory=list)
    problems: list[Problem] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_legacy(cls, data: Any) -> Any:
        """Also accept the legacy constructor: ``ValidationResult(valid=..., errors=[...],
        warnings=[...], agent_name=..., tool_count=...)``; ``valid`` is always computed."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        data.pop("valid", None)
        if "tool_count" in data:
            data.setdefault("tools", data.pop("tool_count"))
        problems = list(data.get("problems") or [])
        for key, severity in (("errors", "error"), ("warnings", "warning")):
            for item in data.pop(key, None) or []:
                problem = item if isinstance(item, Problem) else Problem.model_validate(item)
                problems.append(problem.model_copy(update={"severity": severity}))
        data["problems"] = problems
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def valid(self) -> bool:
        """True when no problem is an error."""
        return not self.errors

    @property
    def errors(self) -> list[Problem]:
        """The problems that make the agent unusable."""
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        """The problems that are likely bugs but do not stop the agent."""
        return [p for p in self.problems if p.severity == "warning"]

    def codes(self) -> list[str]:
        """The problem codes in order, handy in tests and scripts."""
        return [p.code for p in self.problems]

    def passed(self, *, strict: bool = False) -> bool:
        """Valid, and with ``strict`` also free of warnings."""
        return self.valid and not (strict and self.warnings)

    # -- the legacy spelling -----------------------------------------------------------------------

    @property
    def tool_count(self) -> int:
        """How many tools ``get_tools`` returned (0 when it could not be called)."""
        return self.tools or 0

    def __bool__(self) -> bool:
        return self.valid

    def raise_if_invalid(self) -> None:
        """Raise ``AgentLoopValidationError`` listing every error, if there is one."""
        errors = self.errors
        if errors:
            lines = "".join(f"\n  - {problem}" for problem in errors)
            raise AgentLoopValidationError(
                f"Agent loop validation failed with {len(errors)} error(s):{lines}", errors=errors
            )
