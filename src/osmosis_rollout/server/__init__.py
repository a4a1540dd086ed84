"""The rollout server: ``create_app`` (Starlette) and ``serve`` (uvicorn, graceful drain)."""

from .app import create_app
from .core import RolloutServer
from .serve import bind_socket, serve

__all__ = ["RolloutServer", "bind_socket", "create_app", "serve"]
