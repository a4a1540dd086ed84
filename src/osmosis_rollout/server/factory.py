"""The app factory behind ``osmosis serve --reload``: uvicorn's reloader re-imports the agent
in a child process, so the target and settings travel through the environment."""

from __future__ import annotations

import os

from starlette.applications import Starlette

from ..config import ServerSettings
from ..loader import load_agent
from ..project import find_project
from .app import create_app

__all__ = ["SETTINGS_ENV", "TARGET_ENV", "app_from_environment"]

TARGET_ENV = "OSMOSIS_SERVE_TARGET"
SETTINGS_ENV = "OSMOSIS_SERVE_SETTINGS_JSON"


def app_from_environment() -> Starlette:
    """Build the app from ``OSMOSIS_SERVE_TARGET`` and ``OSMOSIS_SERVE_SETTINGS_JSON``."""
    settings = ServerSettings.model_validate_json(os.environ.get(SETTINGS_ENV, "{}"))
    project = find_project()
    if project is not None:
        project.put_root_on_path()  # as the parent did: module targets import from the root
    return create_app(load_agent(os.environ[TARGET_ENV]), settings=settings)
