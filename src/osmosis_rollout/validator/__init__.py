"""``osmosis validate``'s engine: static (AST), dynamic and dry-run checks of an agent.

It never prints; ``render.validation_report`` draws a ``ValidationResult`` and ``cli/validate.py``
picks the exit code. Every problem code is documented in ``docs/validate.md``.
``validate_agent_loop_async`` is the engine; ``validate_agent_loop`` is v1's sync spelling
(``compat.validation``).
"""

from typing import Any

from .pipeline import validate_agent_loop_async
from .result import Problem, ValidationResult

__all__ = [
    "AgentLoopValidationError",
    "Problem",
    "ValidationError",
    "ValidationResult",
    "validate_agent_loop",
    "validate_agent_loop_async",
]

#: v1's names (``osmosis_ai.rollout.validator``), from the compat view, which imports this
#: package: so they are looked up on first use.
_V1_NAMES = frozenset({"AgentLoopValidationError", "ValidationError", "validate_agent_loop"})


def __getattr__(name: str) -> Any:
    if name in _V1_NAMES:
        from ..compat import validation

        return getattr(validation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
