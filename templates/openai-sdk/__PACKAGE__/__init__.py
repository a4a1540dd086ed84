"""__PROJECT__: an agent loop for reinforcement-learning rollouts."""

from .agent import __CLASS__

__all__ = ["__CLASS__"]
