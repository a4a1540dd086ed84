"""The original SDK's ``osmosis_ai.rollout.validator`` names: ``validate_agent_loop`` (the
core's sync validator, ``validator/sync.py``: the SDK's codes beside ours) and the SDK's
``ValidationError`` constructor for a ``Problem``.
"""

from __future__ import annotations

from typing import Any

from ..errors import AgentLoopValidationError
from ..validator.result import Problem, ValidationResult
from ..validator.sync import LEGACY_CODES, validate_agent_loop, validation_request

__all__ = [
    "V1_CODES",
    "AgentLoopValidationError",
    "ValidationError",
    "ValidationResult",
    "validate_agent_loop",
    "validation_request",
]

#: The compat spelling of ``validator.sync.LEGACY_CODES``: every code the SDK's validator reports.
V1_CODES = LEGACY_CODES


class ValidationError(Problem):
    """The SDK's ``ValidationError(code, message, field=None, details=None)``: a ``Problem``
    found by the dynamic checks, an error unless it is put in a result's ``warnings``."""

    def __init__(
        self,
        code: str,
        message: str,
        field: str | None = None,
        details: dict[str, Any] | None = None,
        **data: Any,
    ) -> None:
        data.setdefault("severity", "error")
        data.setdefault("check", "dynamic")
        super().__init__(code=code, message=message, location=field, details=details, **data)
