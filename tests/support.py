"""Helpers shared by tests: loading the small agents kept in tests/assets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ASSETS = Path(__file__).parent / "assets"


def load_asset(name: str) -> ModuleType:
    """Import tests/assets/<name>.py as a module (a fresh copy each time)."""
    path = ASSETS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"assets_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
