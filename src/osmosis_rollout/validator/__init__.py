"""``osmosis validate``'s engine: static (AST), dynamic and dry-run checks of an agent.

It never prints; ``render.validation_report`` draws a ``ValidationResult`` and ``cli/validate.py``
picks the exit code. Every problem code is documented in ``docs/validate.md``. Public API (also
importable from ``osmosis_rollout``): ``validate_agent_loop_async`` (every check, the dry run
included), ``validate_agent_loop`` (the seed's sync spelling, no dry run, the original SDK's
codes beside ours), ``Problem``, ``ValidationResult``; the submodules are internal.
"""

from .pipeline import validate_agent_loop_async
from .result import Problem, ValidationResult
from .sync import validate_agent_loop

__all__ = ["Problem", "ValidationResult", "validate_agent_loop", "validate_agent_loop_async"]
