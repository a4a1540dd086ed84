"""``osmosis view``: a local web page over results files and trace folders.

``build_index`` finds the rollouts (cheaply: offsets and summaries, not whole files),
``create_view_app`` serves them; ``cli/view.py`` binds it to 127.0.0.1. Public API: the names
of ``__all__`` (docs/trajectories.md reads ATIF folders with ``build_index``); the submodules are
internal.
"""

from .app import STATIC_DIR, create_view_app
from .index import RolloutIndex, RolloutSummary, build_index

__all__ = ["STATIC_DIR", "RolloutIndex", "RolloutSummary", "build_index", "create_view_app"]
