"""__PROJECT__: an agent loop for reinforcement-learning rollouts, rewarded by a judge."""

from .agent import __CLASS__

__all__ = ["__CLASS__"]
