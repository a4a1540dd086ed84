"""Every message that crosses a wire, as pydantic models: the canonical wire format.

This is the only module that knows JSON field names. It follows ``protocol.md``: what we accept
from TrainGate is validated strictly (with errors that never echo input values), what
OpenAI-compatible servers return is read leniently (unknown fields are ignored), and everything we
send drops ``null`` fields (use :func:`wire`).

Protocol v2's bodies (``protocol-v2.md``, the end of this module) are each one model that both
sides use: the server builds its callbacks and status answers with them and reads the init and
the cancel with them; the mock TrainGate builds the init and the cancel and reads the rest. They
refuse unknown fields (``extra="forbid"``), so a field one side adds and the other does not
declare fails at once. Only a server reading an init or a cancel ignores unknown fields (the
spec says a server does): :class:`V2InitReceived`, :class:`CancelBodyReceived`, the same fields.
The polling wire's bodies (``protocol-polling.md``) follow the same rule: :class:`PollingInit`
(read by a server as :class:`PollingInitReceived`), :class:`PollingAccepted`,
:class:`PollingResult`.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any, ClassVar, Literal, Self

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
    model_validator,
)

from .redaction import REVEAL_SECRETS, ApiKey, dump_secret
from .sampling import EXTENSION_FIELD, SamplingParams, check_completion_params
from .server_url import check_called_url, normal_server_url

__all__ = [
    "DEFAULT_MAX_METADATA_BYTES",
    "DISPOSITIONS",
    "EXTENSION_FIELD",
    "POLLING_STATUS_RANK",
    "TERMINAL_STATUSES",
    "CancelAnswer",
    "CancelBody",
    "CancelBodyReceived",
    "ChatMessage",
    "CompletionCallback",
    "CompletionChoice",
    "CompletionUsage",
    "CompletionsRequest",
    "CompletionsResponse",
    "GraderCallback",
    "HealthResponse",
    "InitResponse",
    "Message",
    "OpenAIFunctionCall",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "OpenAIToolCall",
    "PollingAccepted",
    "PollingInit",
    "PollingInitReceived",
    "PollingResult",
    "PollingStatus",
    "RolloutMetrics",
    "RolloutRequest",
    "RolloutResponse",
    "RolloutStatus",
    "Sample",
    "SamplingParams",
    "StatusAnswer",
    "V2Init",
    "V2InitReceived",
    "check_completion_params",
    "check_metadata",
    "check_one_segment",
    "check_rollout_id",
    "check_secret",
    "describe_validation_error",
    "wire",
    "wire_json",
]

#: An OpenAI-style chat message, kept as a plain dict so agents can build and append freely.
Message = dict[str, Any]

DEFAULT_MAX_METADATA_BYTES = 1024 * 1024
MAX_ROLLOUT_ID_LENGTH = 256


def check_rollout_id(value: str) -> str:
    """A rollout id has a non-blank character (its length is a ``Field`` constraint)."""
    if not value.strip():
        raise ValueError(
            "rollout_id cannot be empty or whitespace: send a non-empty id, not only whitespace"
        )
    return value


def wire(model: BaseModel) -> dict[str, Any]:
    """Dump a model as JSON-ready data for sending: nulls dropped, secrets revealed."""
    return model.model_dump(
        mode="json", exclude_none=True, by_alias=True, context={REVEAL_SECRETS: True}
    )


def wire_json(model: BaseModel) -> bytes:
    """Like :func:`wire`, encoded straight to JSON bytes (the fast path for HTTP bodies)."""
    return model.__pydantic_serializer__.to_json(
        model, exclude_none=True, by_alias=True, context={REVEAL_SECRETS: True}
    )


def describe_validation_error(exc: ValidationError, *, limit: int = 3) -> str:
    """Summarise a ValidationError as ``loc: msg; ...`` without echoing any input value."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False, include_context=False)[:limit]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


class _Lenient(BaseModel):
    """Base for what others send us: unknown fields are ignored, as protocol.md asks."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------


class OpenAIFunctionSchema(BaseModel):
    """A function's name, description and full JSON Schema ``parameters`` (kept verbatim)."""

    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    @field_validator("parameters", mode="before")
    @classmethod
    def _parameters_as_schema(cls, value: Any) -> Any:
        # A model (the legacy typed OpenAIFunctionParametersSchema, say) becomes its JSON Schema.
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", exclude_none=True)
        return value


class OpenAIFunctionToolSchema(BaseModel):
    """An OpenAI function tool: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: OpenAIFunctionSchema

    @property
    def name(self) -> str:
        """The function's name, the key tool calls refer to."""
        return self.function.name


class OpenAIFunctionCall(_Lenient):
    """The function part of a tool call; ``arguments`` is a JSON string (objects tolerated)."""

    name: str
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_as_json_text(cls, value: Any) -> Any:
        if value is None:
            return "{}"
        if isinstance(value, dict | list):
            return json.dumps(value)
        return value


class OpenAIToolCall(_Lenient):
    """One tool call requested by the model."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCall


# --------------------------------------------------------------------------------------------
# 1. POST /v1/rollout/init
# --------------------------------------------------------------------------------------------


class RolloutRequest(_Lenient):
    """TrainGate's request to start one rollout.

    The metadata size limit defaults to ``default_max_metadata_bytes`` (1 MiB); pass
    ``context={"max_metadata_bytes": n}`` to ``model_validate`` to change it. ``api_key`` is a
    secret: it shows as ``**********`` in ``repr`` and in every dump except :func:`wire`.
    """

    rollout_id: str = Field(max_length=MAX_ROLLOUT_ID_LENGTH)
    server_url: str
    # fail_fast: a body of a million bad messages is one error, not a million (memory).
    messages: list[Message] = Field(fail_fast=True)
    completion_params: dict[str, Any]
    tool_server_url: str | None = None
    max_turns: int = 10
    max_tokens_total: int = 8192
    metadata: dict[str, Any] = Field(default_factory=dict)
    api_key: ApiKey | None = None
    idempotency_key: str | None = None

    #: The metadata limit when no validation context sets one (the server always sets its own).
    default_max_metadata_bytes: ClassVar[int] = DEFAULT_MAX_METADATA_BYTES

    @field_validator("rollout_id")
    @classmethod
    def _check_rollout_id(cls, value: str) -> str:
        return check_rollout_id(value)

    @field_validator("server_url")
    @classmethod
    def _check_server_url(cls, value: str) -> str:
        return normal_server_url(value)

    @field_validator("api_key", mode="before")
    @classmethod
    def _unwrap_secret(cls, value: Any) -> Any:
        return value.get_secret_value() if isinstance(value, SecretStr) else value

    @field_validator("api_key")
    @classmethod
    def _check_api_key(cls, value: SecretStr | None) -> SecretStr | None:
        # It becomes an HTTP header: printable ASCII only, or every callback would fail later.
        if value is not None and not all(" " < c <= "~" for c in value.get_secret_value()):
            raise ValueError("api_key must be printable ASCII without spaces")
        return value

    @field_validator("completion_params")
    @classmethod
    def _check_completion_params(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Checked now, so a bad sampling parameter is a 422 at init, not a failure at every turn.
        return check_completion_params(value)

    @field_validator("max_turns", "max_tokens_total")
    @classmethod
    def _check_positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    @field_validator("idempotency_key")
    @classmethod
    def _check_idempotency_key(cls, value: str | None) -> str | None:
        if value is not None and not (1 <= len(value) <= MAX_ROLLOUT_ID_LENGTH):
            raise ValueError(f"idempotency_key must be 1-{MAX_ROLLOUT_ID_LENGTH} characters")
        return value

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        limit = cls.default_max_metadata_bytes
        if isinstance(info.context, dict):
            limit = int(info.context.get("max_metadata_bytes", limit))
        try:
            size = len(json.dumps(value, allow_nan=False, separators=(",", ":")).encode())
        except (TypeError, ValueError):
            raise ValueError("metadata must be JSON-serialisable") from None
        if size > limit:
            raise ValueError(
                f"metadata is {size} bytes serialised, which exceeds maximum; the limit is {limit}"
            )
        return value

    @field_serializer("api_key")
    def _dump_api_key(self, value: SecretStr | None, info: SerializationInfo) -> str | None:
        return dump_secret(value, info)

    @property
    def dedup_key(self) -> str:
        """The idempotency key: ``idempotency_key`` when given, else ``rollout_id``."""
        return self.idempotency_key or self.rollout_id

    @property
    def api_key_value(self) -> str | None:
        """The bearer secret for the two callbacks, or None."""
        return self.api_key.get_secret_value() if self.api_key is not None else None


class InitResponse(BaseModel):
    """The 202 body of ``/v1/rollout/init``: the rollout id and the agent's tools."""

    rollout_id: str
    tools: list[OpenAIFunctionToolSchema] = Field(default_factory=list)


class HealthResponse(BaseModel):
    """The ``/health`` body."""

    model_config = ConfigDict(extra="allow")

    status: Literal["healthy", "draining", "degraded"]
    agent_loop: str
    active_rollouts: int
    completed_rollouts: int
    queued_rollouts: int = 0
    #: The state backend ("memory" or "redis") and whether it answers; "degraded" when not.
    state: str | None = None
    state_reachable: bool | None = None


# --------------------------------------------------------------------------------------------
# 3. POST {server_url}/v1/chat/completions
# --------------------------------------------------------------------------------------------


class CompletionsRequest(BaseModel):
    """One LLM turn: OpenAI chat-completions plus ``rollout_id``; extra sampling keys pass."""

    model_config = ConfigDict(extra="allow")

    model: str = "default"
    rollout_id: str = Field(max_length=MAX_ROLLOUT_ID_LENGTH)
    messages: list[Message]
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = Field(default=None, fail_fast=True)
    logprobs: bool | None = True

    @field_validator("rollout_id")
    @classmethod
    def _check_rollout_id(cls, value: str) -> str:
        return check_rollout_id(value)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        return value


class ChatMessage(_Lenient):
    """The assistant message of a completion choice."""

    model_config = ConfigDict(extra="allow")

    role: str = "assistant"
    content: str | None = None
    tool_calls: list[OpenAIToolCall] | None = None


class CompletionChoice(_Lenient):
    """One choice; ``message`` is required (a reply without it is a protocol error)."""

    index: int = 0
    message: ChatMessage
    finish_reason: str | None = None


class CompletionUsage(_Lenient):
    """Token usage of one completion; required and never null."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @model_validator(mode="after")
    def _fill_total(self) -> Self:
        if self.total_tokens == 0:
            self.total_tokens = self.prompt_tokens + self.completion_tokens
        return self


class CompletionsResponse(_Lenient):
    """TrainGate's reply to one LLM turn, with the optional token-level extensions."""

    id: str = ""
    object: str = "chat.completion"
    created: int = 0
    model: str = "default"
    choices: list[CompletionChoice] = Field(min_length=1)
    usage: CompletionUsage
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None

    @field_validator("logprobs", mode="before")
    @classmethod
    def _flatten_openai_logprobs(cls, value: Any) -> Any:
        # protocol.md wants a flat list; OpenAI-style servers send {"content": [{"logprob"..}]}.
        if isinstance(value, dict):
            content = value.get("content") or []
            return [item.get("logprob") for item in content if isinstance(item, dict)]
        return value

    @property
    def message(self) -> ChatMessage:
        """The first choice's message."""
        return self.choices[0].message


# --------------------------------------------------------------------------------------------
# 4. POST {server_url}/v1/rollout/completed and 5. metrics
# --------------------------------------------------------------------------------------------


class RolloutStatus(StrEnum):
    """How a rollout ended."""

    COMPLETED = "COMPLETED"
    ERROR = "ERROR"


class RolloutMetrics(BaseModel):
    """Per-rollout metrics; extra fields (``queue_latency_ms``...) are allowed and kept."""

    model_config = ConfigDict(extra="allow")

    total_latency_ms: float = 0.0
    llm_latency_ms: float = 0.0
    tool_latency_ms: float = 0.0
    num_llm_calls: int = 0
    num_tool_calls: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    max_context_tokens: int = 0


class RolloutResponse(BaseModel):
    """The one completion callback of a rollout."""

    rollout_id: str
    status: RolloutStatus
    final_messages: list[Message] = Field(default_factory=list)
    finish_reason: str | None = None
    error_message: str | None = None
    reward: float | None = None
    metrics: RolloutMetrics | None = None
    extra_fields: dict[str, Any] = Field(default_factory=dict)

    @field_validator("reward")
    @classmethod
    def _finite_reward(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("reward must be a finite number")
        return value


# -- protocol v2 (docs/protocol-v2.md): one strict model per body, for both sides -------------


class _V2Body(BaseModel):
    """A v2 body: unknown fields are refused, so the two sides cannot drift apart unseen."""

    model_config = ConfigDict(extra="forbid")


def check_secret(value: str | None, name: str) -> str | None:
    """``value`` if it is printable ASCII without spaces (it goes into a header)."""
    if value is not None and not (value.isascii() and value.isprintable() and " " not in value):
        raise ValueError(f"{name} must be printable ASCII without spaces")
    return value


def check_one_segment(value: str) -> str:
    """``value`` if it is one URL path segment (a v2 rollout id: routes and URLs name it)."""
    if (
        not value.strip()
        or value in (".", "..")
        or any(c in value for c in "/\\\x00")
        or not value.isprintable()
    ):
        raise ValueError(
            "rollout_id must be one URL path segment: non-empty, printable, not . or .., "
            "without / or \\"
        )
    return value


def check_metadata(value: dict[str, Any] | None, info: ValidationInfo) -> Any:
    """``value`` if it serialises to JSON within the server's limit (in the context); the
    same bound for ``metadata`` and ``extra_fields``, whichever field ``info`` names."""
    if value is None:
        return None
    name = info.field_name or "metadata"
    limit = RolloutRequest.default_max_metadata_bytes
    if isinstance(info.context, dict):
        limit = int(info.context.get("max_metadata_bytes", limit))
    try:
        size = len(json.dumps(value, allow_nan=False, separators=(",", ":")).encode())
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be JSON-serialisable") from None
    if size > limit:
        raise ValueError(f"{name} is {size} bytes serialised; the limit is {limit}")
    return value


class V2Init(_V2Body):
    """``POST /rollout``'s body (spec 3.1). Checked strictly: every URL through the checker
    v1's ``server_url`` passes (scheme, host, printable ASCII; D2), every timeout finite (D4),
    secrets printable ASCII, the metadata under the limit (the validation context's
    ``max_metadata_bytes``), and a rollout id one path segment."""

    initial_messages: list[Message] = Field(fail_fast=True)
    label: str | None = None
    metadata: dict[str, Any] | None = None
    rollout_id: str | None = Field(default=None, max_length=MAX_ROLLOUT_ID_LENGTH)
    chat_completions_url: str
    controller_api_key: str | None = None
    llm_api_key: str | None = None
    completion_callback_url: str
    grader_callback_url: str | None = None
    agent_timeout_sec: float | None = Field(default=None, allow_inf_nan=False)
    grader_timeout_sec: float | None = Field(default=None, allow_inf_nan=False)
    extra_fields: dict[str, Any] | None = None

    @field_validator("rollout_id")
    @classmethod
    def _one_segment(cls, value: str | None) -> str | None:
        return None if value is None else check_one_segment(value)

    @field_validator("chat_completions_url", "completion_callback_url", "grader_callback_url")
    @classmethod
    def _check_urls(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        return check_called_url(value, str(info.field_name), info.data.get("rollout_id"))

    @field_validator("controller_api_key", "llm_api_key")
    @classmethod
    def _check_keys(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value == "" and info.field_name == "llm_api_key":
            raise ValueError("llm_api_key must not be empty: send null for no key")
        return check_secret(value, str(info.field_name)) or None

    @field_validator("metadata", "extra_fields")
    @classmethod
    def _check_metadata(cls, value: dict[str, Any] | None, info: ValidationInfo) -> Any:
        return check_metadata(value, info)


class V2InitReceived(V2Init):
    """:class:`V2Init` as a server reads it: unknown fields ignored (spec section 2)."""

    model_config = ConfigDict(extra="ignore")


class CancelBody(_V2Body):
    """``POST /rollout/cancel``'s body: exactly one of the three selectors (spec 3.3)."""

    ids: list[str] | None = Field(default=None, max_length=10_000)
    prefix: str | None = Field(default=None, max_length=MAX_ROLLOUT_ID_LENGTH)
    all: bool = False

    def selectors(self) -> int:
        """How many selectors are present (must be one)."""
        return (self.ids is not None) + (self.prefix is not None) + bool(self.all)


class CancelBodyReceived(CancelBody):
    """:class:`CancelBody` as a server reads it: unknown fields ignored (spec section 2)."""

    model_config = ConfigDict(extra="ignore")


#: The dispositions a cancel answers per rollout (spec 3.3).
Disposition = Literal["cancelled_queued", "cancelled_running", "not_found"]
DISPOSITIONS: frozenset[str] = frozenset({"cancelled_queued", "cancelled_running", "not_found"})


class CancelAnswer(_V2Body):
    """The cancel's answer: each rollout's disposition."""

    dispositions: dict[str, Disposition]


#: Terminal values of the status answer; in flight it is queued, running or grading.
TERMINAL_STATUSES: frozenset[str] = frozenset({"success", "failure", "cancelled"})


class StatusAnswer(_V2Body):
    """``GET /rollout/{id}/status``'s answer (spec 3.2; v1's extension answers the same):
    ``reward`` only for a success, ``err_message`` only otherwise."""

    rollout_id: str
    status: Literal["queued", "running", "grading", "success", "failure", "cancelled", "unknown"]
    reward: float | None = None
    err_message: str | None = None


class CompletionCallback(_V2Body):
    """``POST completion_callback_url``: the agent phase's verdict, no sample (spec 5.1). The
    fields in the order the server sends them."""

    rollout_id: str | None = None
    #: Always null from this server (U8).
    extra_fields: dict[str, Any] | None = None
    #: ``cancelled`` is what a controller also accepts (the original server never sends it).
    status: Literal["success", "failure", "cancelled"]
    err_message: str | None = None
    err_category: str | None = None


class Sample(_V2Body):
    """The grader callback's sample: the conversation and its reward (spec 5.2)."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    label: str | None = None
    reward: float | None = None
    remove_sample: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)
    extra_fields: dict[str, Any] = Field(default_factory=dict)


class GraderCallback(_V2Body):
    """``POST grader_callback_url``: the sample and its reward, the terminal event (5.2)."""

    status: Literal["success", "failure"]
    rollout_id: str | None = None
    sample: Sample | None = None
    err_message: str | None = None
    err_category: str | None = None


# -- the polling wire (docs/protocol-polling.md) ---------------------------------------------
# osmosis-ai 0.3.3+'s bodies, one strict model each like v2's: the server reads the start body
# (``PollingInitReceived``: unknown fields ignored, as the SDK's server does) and builds the
# 202 and the result answers; the mock TrainGate builds the start body and reads the rest.

#: A polling rollout's status: in flight (queued, running, grading), then one of the three ends.
PollingStatus = Literal["queued", "running", "grading", "success", "failure", "cancelled"]
#: The order a rollout's status moves in; the three ends share the last rank.
POLLING_STATUS_RANK: dict[str, int] = {
    "queued": 0,
    "running": 1,
    "grading": 2,
    "success": 3,
    "failure": 3,
    "cancelled": 3,
}


class PollingInit(_V2Body):
    """``POST /rollout``'s polling body: no callback URL and no controller key (the controller
    reads the result itself), a required ``rollout_id`` (the result route names it) and a
    ``grade`` flag; checked as :class:`V2Init` is (URL, id, secret, metadata, finite
    timeouts)."""

    initial_messages: list[Message] = Field(fail_fast=True)
    label: str | None = None
    metadata: dict[str, Any] | None = None
    rollout_id: str = Field(max_length=MAX_ROLLOUT_ID_LENGTH)
    chat_completions_url: str
    llm_api_key: str | None = None
    grade: bool = True
    agent_timeout_sec: float | None = Field(default=None, allow_inf_nan=False)
    grader_timeout_sec: float | None = Field(default=None, allow_inf_nan=False)
    extra_fields: dict[str, Any] | None = None

    @field_validator("rollout_id")
    @classmethod
    def _one_segment(cls, value: str) -> str:
        return check_one_segment(value)

    @field_validator("chat_completions_url")
    @classmethod
    def _check_url(cls, value: str, info: ValidationInfo) -> str:
        return check_called_url(value, "chat_completions_url", info.data.get("rollout_id"))

    @field_validator("llm_api_key")
    @classmethod
    def _check_key(cls, value: str | None) -> str | None:
        if value == "":
            raise ValueError("llm_api_key must not be empty: send null for no key")
        return check_secret(value, "llm_api_key")

    @field_validator("metadata", "extra_fields")
    @classmethod
    def _check_metadata(cls, value: dict[str, Any] | None, info: ValidationInfo) -> Any:
        return check_metadata(value, info)


class PollingInitReceived(PollingInit):
    """:class:`PollingInit` as a server reads it: unknown fields ignored (as the SDK's)."""

    model_config = ConfigDict(extra="ignore")


class PollingAccepted(_V2Body):
    """The 202 of a polling start: the lease token every result poll names, how long a poll
    waits, and how long a rollout nobody polls lives (longer than the wait)."""

    rollout_id: str
    status: PollingStatus
    polling_lease_token: str
    result_wait_timeout_sec: float = Field(gt=0, allow_inf_nan=False)
    polling_lease_timeout_sec: float = Field(gt=0, allow_inf_nan=False)


class PollingResult(_V2Body):
    """``GET /rollout/{id}/result``'s answer: the status, and once it is an end the sample
    (with its reward) or the error and its category."""

    rollout_id: str
    status: PollingStatus
    sample: Sample | None = None
    err_message: str | None = None
    err_category: str | None = None
