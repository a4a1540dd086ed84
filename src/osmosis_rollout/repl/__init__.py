"""``osmosis test --interactive``: a step-through debugger for agent rollouts.

``run_repl`` is the entry point; ``stepper`` pauses the mock TrainGate's LLM turns, ``commands``
parses what the user types, ``views`` renders, ``terminal`` prompts and watches keys, ``rollout``
runs one rollout beside the prompt loop, and ``session`` runs that loop. Internal: its interface
is ``osmosis test --interactive``.
"""

from .session import run_repl

__all__ = ["run_repl"]
