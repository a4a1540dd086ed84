"""Settings, resolved once: command line > environment (``OSMOSIS_*``) > ``[tool.osmosis]`` >
defaults.

``pyproject.toml`` may hold shared keys under ``[tool.osmosis]`` and per-command keys under
``[tool.osmosis.serve]`` / ``[tool.osmosis.test]``; the per-command table wins. Keys use
underscores or dashes (``max-concurrent`` = ``max_concurrent``). The environment is read only
through the mapping passed in, never at import time.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SerializationInfo,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
)

from .errors import ConfigError
from .protocol import DEFAULT_MAX_METADATA_BYTES
from .redaction import dump_secret

__all__ = ["ServerSettings", "check_state_url", "find_pyproject", "read_pyproject_table"]

LogLevel = Literal["critical", "error", "warning", "info", "debug"]

_STATE_SCHEMES = ("redis://", "rediss://", "unix://")


def check_state_url(url: str) -> str:
    """``url`` if it names a state backend we have, else a ``ValueError`` saying which do."""
    if url == "memory" or url.startswith(_STATE_SCHEMES):
        return url
    raise ValueError(
        "must be 'memory' or a Redis URL such as redis://localhost:6379/0 "
        "(rediss:// for TLS, unix:///path/redis.sock)"
    )


class ServerSettings(BaseModel):
    """Everything ``create_app`` and ``serve`` can be configured with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(9000, ge=0, le=65535)
    api_key: SecretStr | None = None
    max_concurrent: int = Field(100, ge=1)
    max_queued: int = Field(10_000, ge=0)
    #: The init bodies of rollouts waiting for a slot, summed: past it a new one that would
    #: wait is refused like a full queue (10,000 large inits would otherwise hold many GiB).
    max_queued_bytes: int = Field(1 << 30, ge=0)
    rollout_timeout_s: float = Field(3600.0, gt=0)
    record_ttl_s: float = Field(3600.0, gt=0)
    shutdown_grace_s: float = Field(30.0, ge=0)
    get_tools_timeout_s: float = Field(60.0, gt=0)
    max_metadata_bytes: int = Field(DEFAULT_MAX_METADATA_BYTES, ge=0)
    # Resource limits against a hostile peer (docs/security.md, "Resource limits").
    #: Open client connections at most (None: a quarter of the file limit, at most 4096).
    max_connections: int | None = Field(None, ge=1)
    #: A request's line and headers must arrive within this long of the connection's start
    #: (or of the previous response), and be at most ``max_header_bytes``.
    header_timeout_s: float = Field(10.0, gt=0)
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    #: An idle kept-alive connection is closed after this long.
    keep_alive_timeout_s: float = Field(5.0, gt=0)
    #: The largest TrainGate reply read (raw, and once decompressed).
    max_reply_bytes: int = Field(4 * 2**20, ge=1024)
    #: Past this many results (or bytes) in the file outbox, new inits get a 503.
    outbox_max_entries: int = Field(10_000, ge=1)
    outbox_max_bytes: int = Field(1024 * 2**20, ge=1024)
    debug_dir: Path | None = None
    outbox_dir: Path | None = None
    log_level: LogLevel = "info"
    #: Serve ``GET /metrics`` (Prometheus), behind the server key like every other route.
    metrics: bool = True
    #: Where rollout state lives: "memory" (this process) or a Redis URL shared by replicas.
    state: str = "memory"
    #: At most this long after a replica dies, a peer ends each of its rollouts with ERROR.
    lease_ttl_s: float = Field(30.0, gt=0)
    workers: int = Field(1, ge=1, le=512)
    #: The polling wire (docs/protocol-polling.md): how long a result poll waits for news, how
    #: long a rollout nobody polls lives (longer than the wait), and how long a finished result
    #: is kept unread.
    poll_wait_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    poll_lease_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    poll_retention_s: float = Field(900.0, gt=0, allow_inf_nan=False)
    #: The TrainGate hosts inits may name (HOST[:PORT], an address or a network); empty: the
    #: default destination rule (destinations.py, docs/security.md).
    traingate: tuple[str, ...] = ()
    #: Web page origins whose requests are served (``*``: any); other requests with an
    #: ``Origin`` header are refused with 403.
    allow_origin: tuple[str, ...] = ()
    #: Host names requests may name besides the server's own (``*``: any).
    allow_host: tuple[str, ...] = ()
    # The platform's launch contract (``launch_contract.py``, docs/platform.md): who started
    # us, and where its runner reads each rollout's files.
    #: Each rollout's files go under ``<artifact_root>/<rollout_id>/`` (``trajectory.json``).
    artifact_root: Path | None = None
    #: The id ``/health`` reports (body and ``x-osmosis-rollout-instance-id``); None: the replica.
    instance_id: str | None = Field(None, min_length=1, max_length=256)
    #: The rollout's name on the platform (``rollouts/<name>/``), shown in the banner and logs.
    server_name: str | None = Field(None, min_length=1, max_length=256)

    @field_validator("traingate", "allow_origin", "allow_host", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        # The environment gives one string: "a.example:8000, b.example" or space-separated.
        if isinstance(value, str):
            return tuple(part for part in value.replace(",", " ").split() if part)
        return value

    @field_validator("traingate")
    @classmethod
    def _check_traingate(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from .destinations import parse_allowed

        for item in value:
            parse_allowed(item)
        return value

    @field_validator("instance_id", "server_name")
    @classmethod
    def _printable_ascii(cls, value: str | None) -> str | None:
        # The instance id is sent as a header value, and both are written to log lines.
        if value is not None and not all(" " <= c <= "~" for c in value):
            raise ValueError("must be printable ASCII")
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _refuse_blank_key(cls, value: Any) -> Any:
        secret = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(secret, str) and not secret.strip():
            raise ValueError(
                "the server key is blank (an unset variable?); give a real key, or pass "
                "--no-auth to serve without one"
            )
        return value

    @field_validator("poll_lease_s")
    @classmethod
    def _lease_outlasts_wait(cls, value: float, info: ValidationInfo) -> float:
        wait = info.data.get("poll_wait_s")
        if wait is not None and value <= wait:
            raise ValueError("must exceed poll_wait_s (a controller renews its lease by polling)")
        return value

    @field_validator("state")
    @classmethod
    def _check_state(cls, value: str) -> str:
        return check_state_url(value.strip())

    @field_serializer("api_key")
    def _dump_api_key(self, value: SecretStr | None, info: SerializationInfo) -> str | None:
        # Hidden everywhere, except when handing settings to a reloader child process.
        return dump_secret(value, info)

    @classmethod
    def resolve(
        cls,
        cli: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        pyproject: Path | None = None,
        section: str = "serve",
        flags: Mapping[str, str] | None = None,
        ignore: frozenset[str] = frozenset(),
        fallback: Mapping[str, Any] | None = None,
    ) -> Self:
        """Merge the sources in precedence order; ``None`` CLI values mean "not given".

        ``flags`` maps field names to the command-line flags that set them, so that an error
        names every place the user may have set the value. ``ignore`` names settings a command
        does not use: they are not read from the environment or the file (``osmosis outbox``
        must not fail on a blank server key it never uses). ``fallback`` sits between
        ``[tool.osmosis]`` and the environment (the original SDK's ``OSMOSIS_ROLLOUT_*``
        variables, read by ``compat.settings``).
        """
        merged: dict[str, Any] = {}
        if pyproject is not None:
            merged.update(read_pyproject_table(pyproject, section, allowed=cls.model_fields))
        merged.update(fallback or {})
        merged.update(_from_environ(environ or {}, cls.model_fields))
        for name in ignore:
            merged.pop(name, None)
        merged.update({k: v for k, v in (cli or {}).items() if v is not None})
        try:
            return cls.model_validate(merged)
        except ValidationError as exc:
            problems = []
            for error in exc.errors(include_input=False, include_url=False, include_context=False):
                field = str(error["loc"][0]) if error["loc"] else ""
                problems.append(f"{_where(field, section, flags or {})}: {error['msg']}")
            raise ConfigError(f"invalid settings: {'; '.join(problems)}") from None


def _where(field: str, section: str, flags: Mapping[str, str]) -> str:
    """A setting and every place it can come from: ``port (--port, OSMOSIS_PORT or ...)``."""
    places = [flags[field]] if field in flags else []
    places += [f"OSMOSIS_{field.upper()}"]
    return f"{field} ({', '.join(places)} or [tool.osmosis.{section}])"


def _from_environ(environ: Mapping[str, str], fields: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in fields:
        value = environ.get(f"OSMOSIS_{name.upper()}")
        # An empty variable means "not set", except for the key: OSMOSIS_API_KEY="" is a
        # mistake (a blank secret), refused rather than read as "no auth".
        if value not in (None, "") or (name in _BLANK_IS_AN_ERROR and value is not None):
            found[name] = value
    return found


#: Settings whose empty environment variable is refused instead of ignored.
_BLANK_IS_AN_ERROR = frozenset({"api_key"})


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` (a file or directory), if any."""
    here = start.resolve()
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def read_pyproject_table(path: Path, section: str, *, allowed: Mapping[str, Any]) -> dict[str, Any]:
    """``[tool.osmosis]`` merged with ``[tool.osmosis.<section>]``, unknown keys rejected."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    tool = data.get("tool", {})
    table = tool.get("osmosis", {}) if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.osmosis] must be a table")
    merged: dict[str, Any] = {}
    sub_tables = {"serve", "test", "validate", "init"}
    shared = {k: v for k, v in table.items() if k not in sub_tables}
    specific = table.get(section) or {}
    if not isinstance(specific, dict):
        raise ConfigError(
            f"{path}: [tool.osmosis.{section}] must be a table of settings, "
            f"not {section} = {type(specific).__name__}"
        )
    for strict, source in ((False, shared), (True, specific)):
        for key, value in source.items():
            name = key.replace("-", "_")
            if name in allowed:
                merged[name] = value
            elif strict:
                raise ConfigError(
                    f"{path}: unknown setting {key!r} in [tool.osmosis.{section}]; "
                    f"known: {', '.join(sorted(allowed))}"
                )
    return merged
