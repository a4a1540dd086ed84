"""The exception tree of osmosis-rollout.

Every error the toolkit raises on purpose derives from ``OsmosisError``, so the CLI can catch
exactly that and turn it into a message and an exit code::

    OsmosisError (= the legacy OsmosisRolloutError)
    ├── ConfigError               a setting, flag or file given by the user is wrong
    │   ├── DatasetError          a dataset row or column is malformed (names the row)
    │   ├── LaunchError           ``osmosis test --launch CMD`` gave no server answering /health
    │   └── ServeError            the legacy serve_agent_loop was given settings it cannot use
    ├── AgentLoadError            "module:Attr" could not be imported or is not an agent
    ├── AgentDefinitionError      an agent's tools or answers break the agent API
    │   ├── UnsatisfiableSchemaError  no value can be generated for a tool's JSON Schema
    │   └── AgentLoopValidationError  validate_agent_loop(...).raise_if_invalid()
    ├── AgentLoopNotFoundError    legacy registry: no agent loop registered under that name
    ├── ToolExecutionError        the legacy tool error (message, tool_call_id, tool_name)
    │   ├── ToolError             a tool call could not be parsed, validated or executed
    │   └── ToolArgumentError     legacy: a tool call's arguments are not a JSON object
    ├── TrainGateError            talking to TrainGate failed
    │   ├── TrainGateHTTPError    TrainGate answered with an error status (carries status, body)
    │   │   ├── TrainGateServerError    5xx after retries       (also OsmosisServerError)
    │   │   └── TrainGateRejectedError  4xx, not retried         (also OsmosisValidationError)
    │   ├── TrainGateUnavailable  transport errors, after every retry (also OsmosisTransportError)
    │   │   └── TrainGateTimeout  the last attempt timed out     (also OsmosisTimeoutError)
    │   └── ProtocolError         TrainGate's reply does not follow the protocol
    ├── LLMBackendError           the mock TrainGate's LLM backend failed (``kind``, ``systemic``)
    └── JudgeError                a judge model gave no verdict (``kind``: why)

The legacy names (``OsmosisServerError``, ``OsmosisValidationError``, ``OsmosisTransportError``,
``OsmosisTimeoutError``) are bases of ours, so agents written for the original SDK catch our
errors with the ``except`` clauses they already have. Messages never contain secrets: error
bodies are truncated and scrubbed by whoever builds them.

Protocol v2 sorts the errors of agent and grader code into four categories, and ours adds a
fifth, ``judge_error`` (``error_category``): it lives here, beside the tree it sorts.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentDefinitionError",
    "AgentLoadError",
    "AgentLoopNotFoundError",
    "AgentLoopValidationError",
    "ConfigError",
    "DatasetError",
    "JudgeError",
    "LLMBackendError",
    "LaunchError",
    "OsmosisError",
    "OsmosisRolloutError",
    "OsmosisServerError",
    "OsmosisTimeoutError",
    "OsmosisTransportError",
    "OsmosisValidationError",
    "ProtocolError",
    "ServeError",
    "ToolArgumentError",
    "ToolError",
    "ToolExecutionError",
    "TrainGateError",
    "TrainGateHTTPError",
    "TrainGateRejectedError",
    "TrainGateServerError",
    "TrainGateTimeout",
    "TrainGateUnavailable",
    "UnsatisfiableSchemaError",
    "error_category",
    "http_error",
]


class OsmosisError(Exception):
    """Base of every error raised on purpose by osmosis-rollout; its text is shown to users."""


#: The legacy base exception: the same class, so ``except OsmosisRolloutError`` catches all of ours.
OsmosisRolloutError = OsmosisError


# -- the legacy transport-level names: bases of our TrainGate errors -------------------------------


class OsmosisTransportError(OsmosisError):
    """Legacy name: the request was not sent or no answer came (connection, DNS, reset)."""


class OsmosisTimeoutError(OsmosisError):
    """Legacy name: a call to TrainGate timed out."""


class OsmosisServerError(OsmosisError):
    """Legacy name: TrainGate answered 5xx after every retry; ``status_code`` says which."""

    def __init__(self, message: str, status_code: int = 0) -> None:
        super().__init__(message)
        self.status_code = status_code


class OsmosisValidationError(OsmosisError):
    """Legacy name: TrainGate refused the request with a 4xx (not retried, except 429 by us)."""

    def __init__(self, message: str, status_code: int = 0) -> None:
        super().__init__(message)
        self.status_code = status_code


class ConfigError(OsmosisError):
    """A setting, command-line flag or input file is wrong; the message says how to fix it."""


class LaunchError(ConfigError):
    """The server that ``osmosis test --launch CMD`` started exited, or never answered
    ``GET /health``; the message names the command, its exit code and its last lines."""


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


class ServeError(ConfigError):
    """The legacy ``serve_agent_loop`` was given a combination of settings it cannot serve."""


class AgentDefinitionError(OsmosisError):
    """An agent broke the agent API, for example by returning invalid tools."""


class UnsatisfiableSchemaError(AgentDefinitionError):
    """A JSON Schema admits no value the generator can build (or uses what it cannot resolve)."""


class AgentLoopValidationError(AgentDefinitionError):
    """``ValidationResult.raise_if_invalid()`` found errors; ``errors`` lists them."""

    def __init__(self, message: str, errors: list[Any] | None = None) -> None:
        super().__init__(message)
        self.errors = list(errors or [])


class AgentLoopNotFoundError(OsmosisError):
    """The legacy registry: no agent loop is registered under ``name``; ``available`` lists those
    that are."""

    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f"Agent loop '{name}' not found. Available: {available}")
        self.name = name
        self.available = available


class ToolExecutionError(OsmosisError):
    """From the legacy SDK: a failed tool call, with its call id and the tool's name when known."""

    def __init__(self, message: str, tool_call_id: str = "", tool_name: str | None = "") -> None:
        super().__init__(message)
        self.tool_call_id = tool_call_id
        self.tool_name = tool_name


class ToolArgumentError(ToolExecutionError):
    """From the legacy SDK: a tool call's ``arguments`` are not valid JSON or not a JSON object."""


class ToolError(ToolExecutionError):
    """A tool call could not be parsed, validated against its schema, or executed."""

    def __init__(self, message: str, *, tool_name: str | None = None):
        super().__init__(message, tool_name=tool_name)


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


class TrainGateServerError(TrainGateHTTPError, OsmosisServerError):
    """TrainGate answered 5xx on every attempt."""


class TrainGateRejectedError(TrainGateHTTPError, OsmosisValidationError):
    """TrainGate refused the call with a 4xx (429 only after its retries)."""


def http_error(
    message: str, *, status_code: int, body: str = "", url: str = ""
) -> TrainGateHTTPError:
    """The ``TrainGateHTTPError`` subclass for ``status_code``: server error or rejection."""
    cls = TrainGateServerError if status_code >= 500 else TrainGateRejectedError
    return cls(message, status_code=status_code, body=body, url=url)


class TrainGateUnavailable(TrainGateError, OsmosisTransportError):
    """TrainGate could not be reached, or timed out, on every attempt."""


class TrainGateTimeout(TrainGateUnavailable, OsmosisTimeoutError):
    """The last attempt to reach TrainGate timed out."""


class ProtocolError(TrainGateError):
    """A reply does not follow ``protocol.md`` (missing ``choices[0].message``, bad JSON...)."""


class LLMBackendError(OsmosisError):
    """An LLM backend answering for the mock TrainGate failed.

    ``kind`` is one of ``auth``, ``rate_limit``, ``context_length``, ``unreachable``,
    ``timeout``, ``not_found``, ``bad_response``, ``tool_schema``, ``needs_jinja``,
    ``unparsable_reply`` or ``http``. ``systemic`` is
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


class JudgeError(OsmosisError):
    """A judge model gave no usable verdict: it timed out, answered with an HTTP error, or its
    reply was still not a verdict after one repair attempt. Never a score: the grader phase ends
    as an error (category ``judge_error``). ``kind`` is ``timeout``, ``http``, ``verdict``, or
    ``replay`` (a replayed run whose cassette holds no reply for the request).
    Messages never contain the judge's key."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def error_category(exc: BaseException) -> str:
    """Protocol v2's ``err_category`` for an exception from agent or grader code.

    ``http_error`` is a chat call that failed (TrainGate refused it, was unreachable or sent a
    reply that is not a completion); ``timeout`` any ``TimeoutError``; ``validation_error``
    ``ValueError``, ``TypeError`` and ``AssertionError``; ``judge_error`` a judge model that
    gave no verdict (:class:`JudgeError`, ours: a failed judge is neither the agent's fault nor
    a reward); ``agent_error`` anything else.
    """
    if isinstance(exc, JudgeError):
        return "judge_error"
    if isinstance(exc, TrainGateError):
        return "http_error"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ValueError | TypeError | AssertionError) and not isinstance(
        exc, OsmosisError
    ):
        return "validation_error"
    return "agent_error"
