"""The legacy settings: the ``OSMOSIS_ROLLOUT_*`` environment variables and ``.env``, as the legacy
SDK read them.

The legacy SDK (pydantic-settings) read ``OSMOSIS_ROLLOUT_SERVER_*``, ``OSMOSIS_ROLLOUT_CLIENT_*``
and ``OSMOSIS_ROLLOUT_MAX_METADATA_SIZE_BYTES`` from the environment, then from ``.env`` in the
working directory (the environment wins). Those with a setting of ours are honoured, below our
own ``OSMOSIS_*`` variables; every other one set is named in a warning at start, with why it has
no effect, so no legacy setting is dropped silently.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

logger = logging.getLogger("osmosis_rollout.compat")

__all__ = ["LegacySettings", "client_setting", "legacy_settings", "unsaid"]

_PREFIX = "OSMOSIS_ROLLOUT_"
#: Our own variables that happen to start like the legacy SDK's (``rollout_timeout_s``).
_OURS = frozenset({"OSMOSIS_ROLLOUT_TIMEOUT_S"})

#: The legacy server variables with a setting of ours: (our field, our variable, parse).
_SERVER: dict[str, tuple[str, str, Callable[[str], Any]]] = {
    "OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS": (
        "max_concurrent",
        "OSMOSIS_MAX_CONCURRENT",
        int,
    ),
    "OSMOSIS_ROLLOUT_SERVER_RECORD_TTL_SECONDS": ("record_ttl_s", "OSMOSIS_RECORD_TTL_S", float),
    "OSMOSIS_ROLLOUT_MAX_METADATA_SIZE_BYTES": (
        "max_metadata_bytes",
        "OSMOSIS_MAX_METADATA_BYTES",
        int,
    ),
    # In the legacy deployment guide (docker-compose), though the legacy settings had no such field.
    "OSMOSIS_ROLLOUT_LOG_LEVEL": ("log_level", "OSMOSIS_LOG_LEVEL", str.lower),
}
#: The legacy client variables (``settings.client``), read by ``OsmosisLLMClient``.
_CLIENT: dict[str, Callable[[str], Any]] = {
    "timeout_seconds": float,
    "max_retries": int,
    "complete_rollout_retries": int,
    "retry_base_delay": float,
    "retry_max_delay": float,
}
#: Why the others do nothing here (by name, or by prefix ending in ``_``).
_WHY_NOT = {
    "OSMOSIS_ROLLOUT_SERVER_CLEANUP_INTERVAL_SECONDS": "finished records are dropped once their "
    "--record-ttl passes; there is no cleanup interval",
    "OSMOSIS_ROLLOUT_SERVER_REQUEST_TIMEOUT_SECONDS": "a rollout's time limit is --rollout-timeout "
    "(OSMOSIS_ROLLOUT_TIMEOUT_S)",
    "OSMOSIS_ROLLOUT_SERVER_REGISTRATION_": "osmosis-rollout does not register with the platform",
    "OSMOSIS_ROLLOUT_CLIENT_": "the server's calls to TrainGate follow protocol.md's timeouts and "
    "retries (OsmosisLLMClient still reads it)",
}


@dataclass
class LegacySettings:
    """What the legacy variables say: our settings they set, and a line for each one set."""

    values: dict[str, Any] = field(default_factory=dict)
    honoured: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def legacy_environ(environ: Mapping[str, str], cwd: Path | None = None) -> dict[str, str]:
    """Each ``OSMOSIS_ROLLOUT_*`` variable the legacy SDK saw: ``.env`` in ``cwd``, then the
    environment."""
    found: dict[str, str] = {}
    dotenv = (cwd or Path.cwd()) / ".env"
    if dotenv.is_file():
        for key, value in _read_dotenv(dotenv).items():
            if key.upper().startswith(_PREFIX) and value is not None:
                found[key.upper()] = value
    found.update((k.upper(), v) for k, v in environ.items() if k.upper().startswith(_PREFIX))
    return {k: v for k, v in found.items() if k not in _OURS and v != ""}


def _read_dotenv(path: Path) -> dict[str, str | None]:
    """``.env``'s variables, read by python-dotenv (uvicorn[standard] brings it), as the legacy
    SDK's pydantic-settings read them."""
    try:
        from dotenv import dotenv_values
    except ImportError:  # pragma: no cover - a core dependency brings it
        logger.warning("%s is not read: python-dotenv is not installed", path)
        return {}
    return dict(dotenv_values(path))


def legacy_settings(environ: Mapping[str, str], cwd: Path | None = None) -> LegacySettings:
    """Our server settings from the legacy variables, and the notes to print; a value that does not
    parse is a ``ConfigError`` naming its variable."""
    result = LegacySettings()
    for name, value in sorted(legacy_environ(environ, cwd).items()):
        if name in _SERVER:
            ours, our_variable, parse = _SERVER[name]
            result.values[ours] = _parsed(name, value, parse)
            result.honoured.append(f"{name} (legacy) is read as {ours} ({our_variable})")
            continue
        why = _WHY_NOT.get(name) or next(
            (
                text
                for prefix, text in _WHY_NOT.items()
                if prefix.endswith("_") and name.startswith(prefix)
            ),
            "osmosis-rollout has no such setting",
        )
        result.ignored.append(f"{name} (legacy) is set but has no effect: {why}")
    return result


#: The lines already said in this process: ``osmosis serve`` says them at start, and the
#: ``create_app`` of the agent module it imports then stays quiet.
_SAID: set[str] = set()


def unsaid(lines: list[str]) -> list[str]:
    """The lines not yet said in this process, now marked as said."""
    fresh = [line for line in lines if line not in _SAID]
    _SAID.update(fresh)
    return fresh


def client_setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The legacy ``settings.client.<name>`` from ``OSMOSIS_ROLLOUT_CLIENT_<NAME>`` (or ``.env``),
    parsed; None when not set."""
    variable = f"{_PREFIX}CLIENT_{name.upper()}"
    value = legacy_environ(os.environ if environ is None else environ).get(variable)
    if value is None:
        return None
    return _parsed(variable, value, _CLIENT[name])


def _parsed(name: str, value: str, parse: Callable[[str], Any]) -> Any:
    try:
        return parse(value.strip())
    except ValueError:
        kind = "a whole number" if parse is int else "a number"
        raise ConfigError(f"{name}={value!r} (the original SDK's setting) must be {kind}") from None
