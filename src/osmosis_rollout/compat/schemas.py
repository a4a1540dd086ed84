"""The legacy typed schema classes: tool definitions, parsed tool calls, tool responses.

Our ``OpenAIFunctionSchema`` keeps ``parameters`` as full JSON Schema and accepts these typed
parameter models too (they become their JSON Schema), so legacy tool definitions work unchanged.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from .. import protocol
from ..protocol import DEFAULT_MAX_METADATA_BYTES, CompletionChoice, RolloutRequest

__all__ = [
    "DEFAULT_MAX_METADATA_SIZE_BYTES",
    "CompletionsChoice",
    "MessageDict",
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolCall",
    "OpenAIFunctionToolSchema",
    "SamplingParamsDict",
    "SchemaDict",
    "ToolResponse",
    "get_max_metadata_size_bytes",
    "set_max_metadata_size_bytes",
]

#: The legacy aliases: a chat message and sampling parameters are plain dicts.
MessageDict = dict[str, Any]
SamplingParamsDict = dict[str, Any]

DEFAULT_MAX_METADATA_SIZE_BYTES = DEFAULT_MAX_METADATA_BYTES

_metadata_limit_lock = threading.Lock()


def get_max_metadata_size_bytes() -> int:
    """The metadata size limit ``RolloutRequest`` applies when no validation context sets one
    (the server always sets its own, from ``max_metadata_bytes``)."""
    with _metadata_limit_lock:
        return RolloutRequest.default_max_metadata_bytes


def set_max_metadata_size_bytes(max_bytes: int) -> None:
    """The legacy process-wide setter of :func:`get_max_metadata_size_bytes`: it sets
    ``RolloutRequest.default_max_metadata_bytes``."""
    if max_bytes <= 0:
        raise ValueError("max_metadata_size_bytes must be positive")
    with _metadata_limit_lock:
        RolloutRequest.default_max_metadata_bytes = max_bytes


#: The legacy name for one choice of a chat completion (ours: ``protocol.CompletionChoice``).
CompletionsChoice = CompletionChoice


class SchemaDict(dict[str, Any]):
    """A JSON Schema as a dict whose keys also read as attributes, at every depth.

    ``parameters["properties"]["a"]["enum"]`` is the way to read it; ``parameters.properties
    ["a"].enum`` works too, because the legacy typed parameter models were read that way. Keys that
    are dict methods (``items``, ``keys``...) must be read with ``[...]``.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in self:
            raise AttributeError(name)
        return self[name]

    @classmethod
    def wrap(cls, value: Any) -> Any:
        """``value`` with every dict in it (inside lists too) made a ``SchemaDict``."""
        if isinstance(value, dict):
            return cls({key: cls.wrap(item) for key, item in value.items()})
        if isinstance(value, list):
            return [cls.wrap(item) for item in value]
        return value


class OpenAIFunctionSchema(protocol.OpenAIFunctionSchema):
    """Ours, with ``parameters`` readable as attributes as the legacy typed models were."""

    @field_validator("parameters")
    @classmethod
    def _parameters_readable_as_attributes(cls, value: dict[str, Any]) -> dict[str, Any]:
        wrapped: dict[str, Any] = SchemaDict.wrap(value)
        return wrapped


class OpenAIFunctionToolSchema(protocol.OpenAIFunctionToolSchema):
    """Ours, whose ``function`` is the legacy :class:`OpenAIFunctionSchema` (attribute reading)."""

    function: OpenAIFunctionSchema


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter of a tool: its JSON type, description and allowed values."""

    type: str
    description: str | None = None
    enum: list[str] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    """A tool's parameters, typed the legacy way: an object with properties and required names.

    ``type`` defaults to ``"object"`` (the legacy documentation examples leave it out). For nested
    schemas (``items``, ``anyOf``, ``$defs``...) pass a plain JSON Schema dict instead.
    """

    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str]


class OpenAIFunctionParsedSchema(BaseModel):
    """A tool call's function as the model sent it: ``arguments`` is JSON text."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A tool call's function with ``arguments`` decoded to a dict."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(
        parsed: OpenAIFunctionParsedSchema,
    ) -> tuple[OpenAIFunctionCallSchema, bool]:
        """Decode ``parsed.arguments``; ``(call, True)`` with empty arguments when they are
        not a JSON object."""
        try:
            arguments = json.loads(parsed.arguments)
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    """One tool call with decoded arguments."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool returns when it has more than text: ``image`` and ``video`` are lists."""

    text: str | None = None
    image: list[Any] | None = Field(default=None)
    video: list[Any] | None = Field(default=None)

    @field_validator("image", "video", mode="before")
    @classmethod
    def _must_be_list(cls, value: Any, info: Any) -> Any:
        if value is not None and not isinstance(value, list):
            raise ValueError(
                f"{info.field_name} must be a list; wrap a single item as [{info.field_name}]"
            )
        return value

    def is_empty(self) -> bool:
        """True when there is no text, image or video."""
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        """True when there is text and nothing else."""
        return bool(self.text) and not self.image and not self.video
