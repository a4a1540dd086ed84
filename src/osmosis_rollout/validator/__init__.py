"""``osmosis validate``'s engine: static (AST), dynamic and dry-run checks of an agent.

It never prints; ``render.validation_report`` draws a ``ValidationResult`` and ``cli/validate.py``
picks the exit code. Every problem code is documented in ``docs/validate.md``.
``validate_agent_loop_async`` is the engine; ``validate_agent_loop`` is v1's sync spelling
(``compat.validation``).
"""

from typing import Any

from .pipeline import validate_agent_loop_async
from .result import Problem, ValidationResult

__all__ = ["Problem", "ValidationResult", "validate_agent_loop", "validate_agent_loop_async"]


def __getattr__(name: str) -> Any:
    if name == "validate_agent_loop":  # lazily: the compat view imports this package
        from ..compat.validation import validate_agent_loop

        return validate_agent_loop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
