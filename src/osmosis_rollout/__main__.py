"""``python -m osmosis_rollout``: the same as the ``osmosis`` command."""

from .cli import main

if __name__ == "__main__":
    main()
