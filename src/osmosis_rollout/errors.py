"""The exception tree of osmosis-rollout.

Every error the toolkit raises on purpose derives from ``OsmosisError``, so the CLI can catch
exactly that and turn it into a message and an exit code::

    OsmosisError
    ├── ConfigError               a setting, flag or file given by the user is wrong
    │   └── DatasetError          a dataset row or column is malformed (names the row)
    ├── AgentLoadError            "module:Attr" could not be imported or is not an agent
    ├── AgentDefinitionError      an agent's tools or answers break the agent API
    │   └── UnsatisfiableSchemaError  no value can be generated for a tool's JSON Schema
    ├── ToolError                 a tool call could not be parsed, validated or executed
    ├── TrainGateError            talking to TrainGate failed
    │   ├── TrainGateHTTPError    TrainGate answered with an error status (carries status, body)
    │   ├── TrainGateUnavailable  transport errors or timeouts, after every retry
    │   └── ProtocolError         TrainGate's reply does not follow the protocol
    └── LLMBackendError           the mock TrainGate's LLM backend failed (``kind``, ``systemic``)

Messages never contain secrets: error bodies are truncated and scrubbed by whoever builds them.
"""

from __future__ import annotations

__all__ = [
    "AgentDefinitionError",
    "AgentLoadError",
    "ConfigError",
    "DatasetError",
    "LLMBackendError",
    "OsmosisError",
    "ProtocolError",
    "ToolError",
    "TrainGateError",
    "TrainGateHTTPError",
    "TrainGateUnavailable",
    "UnsatisfiableSchemaError",
]


class OsmosisError(Exception):
    """Base of every error raised on purpose by osmosis-rollout; its text is shown to users."""


class ConfigError(OsmosisError):
    """A setting, command-line flag or input file is wrong; the message says how to fix it."""


class DatasetError(ConfigError):
    """A dataset could not be read, or one of its rows is malformed."""

    def __init__(self, message: str, *, row: int | None = None, column: str | None = None):
        where = []
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        prefix = f"{', '.join(where)}: " if where else ""
        super().__init__(f"{prefix}{message}")
        self.row = row
        self.column = column


class AgentLoadError(OsmosisError):
    """An agent target could not be imported, found, or is not a ``RolloutAgentLoop``.

    ``code`` names the failure kind (``FILE_NOT_FOUND``, ``IMPORT_FAILED``...; see
    ``docs/validate.md``) and ``location`` is ``file.py:LINE`` when one is known.
    """

    def __init__(
        self, message: str, *, code: str = "LOAD_FAILED", location: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.location = location


class AgentDefinitionError(OsmosisError):
    """An agent broke the agent API, for example by returning invalid tools."""


class UnsatisfiableSchemaError(AgentDefinitionError):
    """A JSON Schema admits no value the generator can build (or uses what it cannot resolve)."""


class ToolError(OsmosisError):
    """A tool call could not be parsed, validated against its schema, or executed."""

    def __init__(self, message: str, *, tool_name: str | None = None):
        super().__init__(message)
        self.tool_name = tool_name


class TrainGateError(OsmosisError):
    """Talking to TrainGate (or to an LLM backend standing in for it) failed."""


class TrainGateHTTPError(TrainGateError):
    """TrainGate answered with a non-success HTTP status after any retries.

    ``body`` is a short, printable excerpt of the response body (at most 500 characters).
    """

    def __init__(self, message: str, *, status_code: int, body: str = "", url: str = ""):
        super().__init__(message)
        self.status_code = status_code
        self.body = body
        self.url = url

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status_code={self.status_code}, url={self.url!r})"


class TrainGateUnavailable(TrainGateError):
    """TrainGate could not be reached, or timed out, on every attempt."""


class ProtocolError(TrainGateError):
    """A reply does not follow ``protocol.md`` (missing ``choices[0].message``, bad JSON...)."""


class LLMBackendError(OsmosisError):
    """An LLM backend answering for the mock TrainGate failed.

    ``kind`` is one of ``auth``, ``rate_limit``, ``context_length``, ``unreachable``,
    ``timeout``, ``not_found``, ``bad_response``, ``tool_schema`` or ``http``. ``systemic`` is
    True when every other row would fail the same way (bad key, server down, wrong URL or
    model), so a batch should stop early. Messages never contain the API key.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        systemic: bool = False,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.systemic = systemic
        self.status_code = status_code

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, systemic={self.systemic})"
