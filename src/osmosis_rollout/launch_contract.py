"""The Osmosis platform's launch contract: the ``_OSMOSIS_ROLLOUT_*`` variables it starts a
rollout server with (docs/platform.md).

The platform, and the official SDK's local eval runner, start ``rollouts/<name>/main.py`` with:

- ``_OSMOSIS_ROLLOUT_PORT``: the port its controller will call;
- ``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``: where its runner reads each rollout's files
  (``<root>/<rollout_id>/trajectory.json``);
- ``_OSMOSIS_ROLLOUT_INSTANCE_ID``: the marker ``/health`` must echo, so that the runner knows
  the server answering is the one it started (not a stale one on the same port);
- ``_OSMOSIS_ROLLOUT_NAME``: the rollout's name.

They sit between ``OSMOSIS_*`` and ``[tool.osmosis]`` in the settings' precedence: the
platform's run beats a project's file, a setting the user gave (a flag, ``serve(port=...)``, an
``OSMOSIS_*`` variable) beats the platform, and :func:`port_conflict` says when that leaves the
server on a port the controller will not call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .config import ServerSettings
from .errors import ConfigError

__all__ = [
    "ARTIFACT_ROOT",
    "INSTANCE_ID",
    "NAME",
    "PORT",
    "apply_launch",
    "launch_settings",
    "port_conflict",
]

PORT = "_OSMOSIS_ROLLOUT_PORT"
ARTIFACT_ROOT = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"
INSTANCE_ID = "_OSMOSIS_ROLLOUT_INSTANCE_ID"
NAME = "_OSMOSIS_ROLLOUT_NAME"

#: Each variable and the setting it fills.
_FIELDS = {
    PORT: "port",
    ARTIFACT_ROOT: "artifact_root",
    INSTANCE_ID: "instance_id",
    NAME: "server_name",
}


def launch_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings the platform's variables in ``environ`` set, checked; a bad value is a
    ``ConfigError`` naming its variable. An empty variable counts as unset."""
    found: dict[str, Any] = {}
    for variable, field in _FIELDS.items():
        raw = environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            checked = ServerSettings.model_validate({field: raw})
        except ValidationError as exc:
            message = exc.errors(include_input=False, include_url=False)[0]["msg"]
            raise ConfigError(
                f"{variable}={_shown(raw)} is not usable ({message}); the platform sets it "
                "when it starts the server: unset it to run without the platform"
            ) from None
        found[field] = getattr(checked, field)
    return found


def _shown(value: str) -> str:
    """A variable's value for an error line: quoted, control characters escaped, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def port_conflict(port: int, environ: Mapping[str, str]) -> str | None:
    """The warning to print when the server listens on another port than the platform's."""
    raw = environ.get(PORT, "").strip()
    if not raw or not raw.isdigit() or int(raw) == port or int(raw) == 0:
        return None
    return (
        f"{PORT} is {raw} but the server was given port {port} (--port, port=, OSMOSIS_PORT); "
        f"it listens on {port}, where the platform's controller will not call it"
    )


def apply_launch(settings: ServerSettings, environ: Mapping[str, str]) -> ServerSettings:
    """``settings`` with the platform's values filled in where none was given (``serve()``'s
    rule; the CLI merges them while resolving, see ``cli/serve.py``)."""
    update = {
        field: value
        for field, value in launch_settings(environ).items()
        if field not in settings.model_fields_set
    }
    return settings.model_copy(update=update) if update else settings
