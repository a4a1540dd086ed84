"""The rollout server: ``create_app`` (Starlette) and ``serve`` (uvicorn, graceful drain).

Public API: the names of ``__all__``. The submodules (the edge, the scheduler, ``wire/``,
``state/``...) are internal: docs/architecture.md describes them for contributors.
"""

from .app import create_app
from .core import RolloutServer
from .serve import bind_socket, serve

__all__ = ["RolloutServer", "bind_socket", "create_app", "serve"]
