"""Protocol v2's request bodies (``docs/protocol-v2.md``), and the rollout the core runs.

``V2Init`` is ``POST /rollout``'s body, checked strictly at the edge: every URL through the
checker v1's ``server_url`` passes (``server_url.py``: scheme, host, printable ASCII; D2), every
timeout finite (D4), secrets printable ASCII, the metadata under the server's limit, and a
rollout id one path segment. ``V2Rollout`` is what the scheduler, the registry and the agent
see: a ``RolloutRequest`` (chat base URL as ``server_url``, the LLM key as ``api_key``) plus
the v2 fields, so that a repeated id is "the same body" exactly when all of them match (D6).
The controller key is never on it (D15): it goes to the rollout's target only.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

from ...protocol import MAX_ROLLOUT_ID_LENGTH, Message, RolloutRequest
from ...redaction import ApiKey
from ...server_url import normal_server_url

__all__ = [
    "CancelBody",
    "V2Init",
    "V2Rollout",
    "check_metadata",
    "check_rollout_id",
    "check_secret",
    "check_url",
]


#: A rollout id that can stand for any other in a URL's path without changing its structure.
_PLAIN_ID = re.compile(r"[A-Za-z0-9._~-]{1,256}")


def check_url(value: str, name: str, rollout_id: str | None = None) -> str:
    """``value`` stripped, if ``server_url``'s checker takes it; the error names ``name``.

    The three URLs of a rollout usually differ from the last one's only by the rollout id as a
    path segment: checked with that segment replaced, the result is cached (the check parses
    the URL as the HTTP client will, a few times the cost of the rest of the init).
    """
    value = value.strip()
    origin = _origin_of(value)
    if rollout_id is not None and origin is not None and _PLAIN_ID.fullmatch(rollout_id):
        # Only the path is templated: the host (``http://2130706433/...`` with that id) is
        # always checked as written.
        segment = f"/{rollout_id}"
        path = value[len(origin) :]
        templated = path.replace(f"{segment}/", "/_id_/")
        if templated.endswith(segment):
            templated = templated[: -len(segment)] + "/_id_"
        _check_cached(origin + templated, name)
    else:
        _check(value, name)
    return value


def _origin_of(value: str) -> str | None:
    """``scheme://netloc`` as ``value`` starts with it, or None when it does not."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    origin = f"{parts.scheme}://{parts.netloc}"
    return origin if parts.netloc and value.startswith(origin) else None


def _check(value: str, name: str) -> None:
    try:
        normal_server_url(value)
    except ValueError as exc:
        raise ValueError(str(exc).replace("server_url", name)) from None


@functools.lru_cache(maxsize=1024)
def _check_cached(value: str, name: str) -> None:
    _check(value, name)


def check_secret(value: str | None, name: str) -> str | None:
    """``value`` if it is printable ASCII without spaces (it goes into a header)."""
    if value is not None and not all(" " < c <= "~" for c in value):
        raise ValueError(f"{name} must be printable ASCII without spaces")
    return value


def check_rollout_id(value: str) -> str:
    """``value`` if it is one URL path segment (status and result routes name it)."""
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
    """``value`` if it serialises to JSON within the server's limit (in the context)."""
    if value is None:
        return None
    limit = RolloutRequest.default_max_metadata_bytes
    if isinstance(info.context, dict):
        limit = int(info.context.get("max_metadata_bytes", limit))
    try:
        size = len(json.dumps(value, allow_nan=False, separators=(",", ":")).encode())
    except (TypeError, ValueError):
        raise ValueError("metadata must be JSON-serialisable") from None
    if size > limit:
        raise ValueError(f"metadata is {size} bytes serialised; the limit is {limit}")
    return value


class V2Init(BaseModel):
    """``POST /rollout``'s body; unknown fields are ignored (spec section 2)."""

    model_config = ConfigDict(extra="ignore")

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
        return None if value is None else check_rollout_id(value)

    @field_validator("chat_completions_url", "completion_callback_url", "grader_callback_url")
    @classmethod
    def _check_urls(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        return check_url(value, str(info.field_name), info.data.get("rollout_id"))

    @field_validator("controller_api_key", "llm_api_key")
    @classmethod
    def _check_keys(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value == "" and info.field_name == "llm_api_key":
            raise ValueError("llm_api_key must not be empty: send null for no key")
        return check_secret(value, str(info.field_name)) or None

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, Any] | None, info: ValidationInfo) -> Any:
        return check_metadata(value, info)


class V2Rollout(RolloutRequest):
    """A v2 rollout as the core and the agent see it (see the module docstring)."""

    completion_callback_url: str = ""
    grader_callback_url: str | None = None
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    label: str | None = None
    extra_fields: dict[str, Any] | None = None
    #: False when the init sent no rollout_id and the server invented it (D5).
    id_given: bool = True
    _controller_key: str | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, body: V2Init) -> V2Rollout:
        """The rollout ``body`` asks for (already checked: built without validating again)."""
        metadata = dict(body.metadata or {})
        if body.label is not None:
            metadata.setdefault("ground_truth", body.label)
        rollout = cls.model_construct(
            rollout_id=body.rollout_id or uuid.uuid4().hex,
            server_url=body.chat_completions_url.rstrip("/"),
            messages=body.initial_messages,
            completion_params={},
            metadata=metadata,
            api_key=ApiKey(body.llm_api_key) if body.llm_api_key is not None else None,
            completion_callback_url=body.completion_callback_url,
            grader_callback_url=body.grader_callback_url,
            agent_timeout_sec=body.agent_timeout_sec,
            grader_timeout_sec=body.grader_timeout_sec,
            label=body.label,
            extra_fields=body.extra_fields,
            id_given=body.rollout_id is not None,
        )
        rollout._controller_key = body.controller_api_key
        return rollout

    def called_urls(self) -> list[tuple[str, str]]:
        """Every URL the server will call for this rollout, by its field: the edge checks each
        against the destination policy (``destinations.py``), as v1's ``server_url``."""
        urls = [
            ("chat_completions_url", self.server_url),
            ("completion_callback_url", self.completion_callback_url),
        ]
        if self.grader_callback_url:
            urls.append(("grader_callback_url", self.grader_callback_url))
        return urls

    def take_controller_key(self) -> str | None:
        """The callback key, removed from the rollout (the agent is handed it next)."""
        key, self._controller_key = self._controller_key, None
        return key


class CancelBody(BaseModel):
    """``POST /rollout/cancel``'s body: exactly one of the three selectors (spec 3.3)."""

    model_config = ConfigDict(extra="ignore")

    ids: list[str] | None = Field(default=None, max_length=10_000)
    prefix: str | None = Field(default=None, max_length=MAX_ROLLOUT_ID_LENGTH)
    all: bool = False

    def selectors(self) -> int:
        """How many selectors are present (must be one)."""
        return (self.ids is not None) + (self.prefix is not None) + bool(self.all)
