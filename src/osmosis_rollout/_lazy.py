"""PEP 562 lazy exports for a package: names load from their home module on first use.

``osmosis_rollout.testing`` and ``.evaluation`` share it: ``osmosis test --jobs`` imports one of
their submodules before it starts its workers, and must not wait for the whole toolkit first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any], *, anchor: str | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``homes`` is imported from
    its module (relative to ``anchor``, default the package) on first use and kept in
    ``namespace``; any other public name is tried as a submodule, an attribute of the package
    once imported (as it was when packages imported their submodules eagerly)."""
    base = anchor or package

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            if name.isidentifier() and not name.startswith("_"):
                try:
                    return importlib.import_module(f".{name}", package)
                except ModuleNotFoundError as exc:
                    if exc.name != f"{package}.{name}":
                        raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, base), name)
        namespace[name] = value  # the next lookup is a plain module attribute
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *homes})

    return getattr_, dir_
