"""``osmosis validate``'s engine: static (AST), dynamic and dry-run checks of an agent.

It never prints; ``render.validation_report`` draws a ``ValidationResult`` and ``cli/validate.py``
picks the exit code. Every problem code is documented in ``docs/validate.md``. v1's sync
``validate_agent_loop`` is ``osmosis_rollout.compat``'s.
"""

from .pipeline import validate_agent_loop_async
from .result import Problem, ValidationResult

__all__ = ["Problem", "ValidationResult", "validate_agent_loop_async"]
