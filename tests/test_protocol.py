"""The wire models: every validation rule of protocol.md, secrets, tools and lenient replies."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from pydantic import ValidationError

from osmosis_rollout.protocol import (
    DEFAULT_MAX_METADATA_BYTES,
    CompletionsRequest,
    CompletionsResponse,
    InitResponse,
    OpenAIFunctionCall,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
    describe_validation_error,
    wire,
    wire_json,
)
from osmosis_rollout.redaction import REDACTED, scrub

from .leaks import NASTY_KEY, every_form_absent
from .serving import init_body

SECRET = "sk-live-0123456789abcdef"


def request_data(**overrides: Any) -> dict[str, Any]:
    """A minimal valid init body, with ``overrides`` applied."""
    data: dict[str, Any] = {
        "rollout_id": "r-1",
        "server_url": "http://traingate.test",
        "messages": [{"role": "user", "content": "hi"}],
        "completion_params": {"temperature": 0.5},
    }
    data.update(overrides)
    return data


def error_locs(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple[Any, ...]]:
    """The ``loc`` of every error in a ValidationError."""
    return [tuple(err["loc"]) for err in exc.value.errors()]


# -- RolloutRequest: rollout_id -------------------------------------------------------------


@pytest.mark.parametrize("rollout_id", ["", " ", "\t\n  "])
def test_blank_rollout_id_is_rejected(rollout_id: str) -> None:
    """An empty or whitespace-only rollout_id fails validation on that field."""
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(request_data(rollout_id=rollout_id))
    assert error_locs(exc) == [("rollout_id",)]


@pytest.mark.parametrize("length", [1, 256])
def test_rollout_id_length_bounds_are_accepted(length: int) -> None:
    """rollout_ids of exactly 1 and 256 characters are valid and kept verbatim."""
    rollout_id = "r" * length
    assert RolloutRequest.model_validate(request_data(rollout_id=rollout_id)).rollout_id == (
        rollout_id
    )


def test_rollout_id_of_257_chars_is_rejected() -> None:
    """A 257-character rollout_id is one too many, and the message gives the limit."""
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(request_data(rollout_id="r" * 257))
    assert error_locs(exc) == [("rollout_id",)]
    assert "at most 256" in describe_validation_error(exc.value)


def test_rollout_id_is_required() -> None:
    """A body without rollout_id is rejected as missing."""
    data = request_data()
    del data["rollout_id"]
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(data)
    assert error_locs(exc) == [("rollout_id",)]


# -- RolloutRequest: server_url -------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["ftp://traingate.test", "file:///etc/passwd", "traingate.test", "javascript:alert(1)", ""],
)
def test_non_http_server_url_is_rejected(url: str) -> None:
    """server_url must use http or https."""
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(request_data(server_url=url))
    assert error_locs(exc) == [("server_url",)]
    assert "http:// or https://" in describe_validation_error(exc.value)


@pytest.mark.parametrize("url", ["http://", "https:///v1", "http://:8080"])
def test_server_url_without_host_is_rejected(url: str) -> None:
    """An http(s) URL without a host is not a usable TrainGate base URL."""
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(request_data(server_url=url))
    assert error_locs(exc) == [("server_url",)]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://traingate.test/", "http://traingate.test"),
        ("https://tg.example:8443/base/", "https://tg.example:8443/base"),
        ("http://127.0.0.1:9000//", "http://127.0.0.1:9000"),
        ("http://traingate.test", "http://traingate.test"),
    ],
)
def test_server_url_trailing_slash_is_stripped(url: str, expected: str) -> None:
    """The base URL loses its trailing slashes so callback URLs never contain ``//v1``."""
    assert RolloutRequest.model_validate(request_data(server_url=url)).server_url == expected


# -- RolloutRequest: metadata ---------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [{"when": object()}, {"tags": {1, 2}}, {"score": float("nan")}, {"x": float("inf")}],
)
def test_metadata_that_is_not_json_serialisable_is_rejected(metadata: dict[str, Any]) -> None:
    """metadata must survive a strict JSON round trip (no objects, sets, NaN or infinity)."""
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(request_data(metadata=metadata))
    assert error_locs(exc) == [("metadata",)]
    assert "JSON-serialisable" in describe_validation_error(exc.value)


def test_metadata_over_one_mebibyte_is_rejected() -> None:
    """Serialised metadata above 1 MiB is rejected with its size and the limit."""
    blob = "x" * DEFAULT_MAX_METADATA_BYTES
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(request_data(metadata={"blob": blob}))
    assert error_locs(exc) == [("metadata",)]
    assert f"the limit is {DEFAULT_MAX_METADATA_BYTES}" in describe_validation_error(exc.value)


def test_metadata_of_exactly_the_limit_is_accepted() -> None:
    """Metadata whose compact JSON is exactly 1 MiB is still valid."""
    overhead = len(json.dumps({"blob": ""}, separators=(",", ":")))
    blob = "x" * (DEFAULT_MAX_METADATA_BYTES - overhead)
    request = RolloutRequest.model_validate(request_data(metadata={"blob": blob}))
    assert len(request.metadata["blob"]) == len(blob)


def test_metadata_limit_is_configurable_through_validation_context() -> None:
    """``context={"max_metadata_bytes": n}`` lowers (or raises) the metadata limit."""
    data = request_data(metadata={"note": "x" * 100})
    RolloutRequest.model_validate(data)
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(data, context={"max_metadata_bytes": 50})
    assert "the limit is 50" in describe_validation_error(exc.value)
    big = request_data(metadata={"blob": "x" * (DEFAULT_MAX_METADATA_BYTES + 10)})
    limit = 2 * DEFAULT_MAX_METADATA_BYTES
    assert RolloutRequest.model_validate(big, context={"max_metadata_bytes": limit}).metadata


# -- RolloutRequest: budgets, defaults, unknown keys ----------------------------------------


@pytest.mark.parametrize("field", ["max_turns", "max_tokens_total"])
@pytest.mark.parametrize("value", [0, -1])
def test_budgets_below_one_are_rejected(field: str, value: int) -> None:
    """max_turns and max_tokens_total must be at least 1."""
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(request_data(**{field: value}))
    assert error_locs(exc) == [(field,)]


def test_budget_of_one_and_defaults_are_accepted() -> None:
    """max_turns=1 is valid; omitted optional fields take protocol.md's defaults."""
    request = RolloutRequest.model_validate(request_data(max_turns=1))
    assert request.max_turns == 1
    defaults = RolloutRequest.model_validate(request_data())
    assert defaults.max_turns == 10
    assert defaults.max_tokens_total == 8192
    assert defaults.metadata == {}
    assert defaults.api_key is None
    assert defaults.tool_server_url is None
    assert defaults.dedup_key == "r-1"


def test_unknown_keys_are_ignored() -> None:
    """Fields a newer TrainGate adds are dropped, not rejected."""
    request = RolloutRequest.model_validate(request_data(future_field={"a": 1}, priority=3))
    assert "future_field" not in request.model_dump()
    assert request.model_extra in (None, {})


def test_rollout_request_still_accepts_plain_values() -> None:
    """The new checks leave ordinary requests alone (unknown sampling keys pass through)."""
    request = RolloutRequest.model_validate(
        init_body(completion_params={"temperature": 1, "stop": "x", "seed": 3, "top_k": 5})
    )
    assert request.completion_params["top_k"] == 5


def test_empty_initial_messages_are_accepted() -> None:
    """The initial conversation may be empty."""
    assert RolloutRequest.model_validate(request_data(messages=[])).messages == []


def test_idempotency_key_falls_back_to_rollout_id() -> None:
    """dedup_key is idempotency_key when given, else rollout_id."""
    request = RolloutRequest.model_validate(request_data(idempotency_key="k-9"))
    assert request.dedup_key == "k-9"


# -- secrets ---------------------------------------------------------------------------------


def test_api_key_is_redacted_everywhere_but_the_wire() -> None:
    """api_key is ``**********`` in repr, str and dumps; only wire()/wire_json() reveal it."""
    request = RolloutRequest.model_validate(request_data(api_key=SECRET))
    for text in (
        repr(request),
        str(request),
        json.dumps(request.model_dump()),
        json.dumps(request.model_dump(mode="json")),
        request.model_dump_json(),
    ):
        assert SECRET not in text
        assert "**********" in text
    assert request.model_dump()["api_key"] == "**********"
    assert wire(request)["api_key"] == SECRET
    assert json.loads(wire_json(request))["api_key"] == SECRET
    assert request.api_key_value == SECRET


def test_scrub_removes_every_form_of_a_key_with_quotes_and_backslashes() -> None:
    """Raw, JSON-escaped (once and twice), repr-escaped and URL-encoded forms all go."""
    key = NASTY_KEY
    texts = [
        f"raw {key}",
        json.dumps({"detail": f"bad key {key}"}),
        json.dumps({"outer": json.dumps({"detail": key})}),
        repr(ValueError(f"bad {key}")),
        f"url ?key={quote(key, safe='')}",
        f"url ?key={quote_plus(key)}",
    ]
    for text in texts:
        cleaned = scrub(text, key)
        assert REDACTED in cleaned
        assert every_form_absent(cleaned, key) == [], text


def test_wire_round_trips_a_request_with_its_secret() -> None:
    """What wire_json() sends validates back into an equal request, secret included."""
    request = RolloutRequest.model_validate(request_data(api_key=SECRET, metadata={"a": [1]}))
    again = RolloutRequest.model_validate_json(wire_json(request))
    assert again.api_key_value == SECRET
    assert wire(again) == wire(request)


def test_wire_drops_nulls_from_a_request() -> None:
    """Optional fields left as None are not sent at all."""
    body = wire(RolloutRequest.model_validate(request_data()))
    assert "api_key" not in body
    assert "tool_server_url" not in body
    assert "idempotency_key" not in body
    assert None not in body.values()


@pytest.mark.parametrize(
    "overrides",
    [
        {"rollout_id": SECRET * 20},
        {"server_url": f"ftp://{SECRET}"},
        {"server_url": f"http://user:{SECRET}@"},
        {"api_key": {"nested": SECRET}},
        {"api_key": [SECRET]},
        {"max_turns": SECRET},
        {"messages": SECRET},
        {"messages": [SECRET]},
        {"completion_params": SECRET},
        {"metadata": {"blob": SECRET * 60000}},
        {"metadata": SECRET},
        {"idempotency_key": SECRET * 20},
        {"tool_server_url": {"u": SECRET}},
    ],
)
def test_validation_errors_never_echo_input_values(overrides: dict[str, Any]) -> None:
    """describe_validation_error names fields and rules but never repeats what was sent."""
    data = request_data(api_key=SECRET)
    data.update(overrides)
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate(data)
    assert SECRET in str(exc.value.errors())  # pydantic keeps the input: that is the risk
    text = describe_validation_error(exc.value, limit=50)
    assert text
    assert SECRET not in text


def test_validation_error_from_bad_json_never_echoes_it() -> None:
    """Truncated JSON holding a secret is described without the secret."""
    raw = '{"rollout_id": "r-1", "api_key": "' + SECRET + '", "server_url": '
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate_json(raw)
    text = describe_validation_error(exc.value)
    assert "Invalid JSON" in text
    assert SECRET not in text


def test_describe_validation_error_limits_and_counts() -> None:
    """Beyond ``limit`` errors the summary says how many more there are."""
    with pytest.raises(ValidationError) as exc:
        RolloutRequest.model_validate({})
    assert exc.value.error_count() == 4
    text = describe_validation_error(exc.value, limit=2)
    assert text == "rollout_id: Field required; server_url: Field required; and 2 more"


# -- tools ------------------------------------------------------------------------------------

NESTED_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search a catalogue",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1},
                "filters": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "field": {"type": "string", "enum": ["price", "rating"]},
                            "op": {"anyOf": [{"const": "lt"}, {"const": "gt"}]},
                            "value": {"type": ["number", "null"], "default": None},
                        },
                        "required": ["field", "op"],
                        "additionalProperties": False,
                    },
                },
                "limit": {"type": "integer", "default": 10, "enum": [5, 10, 20]},
                "exact": {"type": "boolean", "enum": [True, False, None]},
                "mode": {"$ref": "#/$defs/mode"},
            },
            "required": ["query"],
            "$defs": {"mode": {"type": "string", "enum": ["fast", "deep"]}},
        },
        "strict": True,
    },
}


def test_tool_keeps_the_full_json_schema() -> None:
    """Nested items/properties/anyOf/default/non-string enum/$defs survive wire() verbatim."""
    tool = OpenAIFunctionToolSchema.model_validate(NESTED_TOOL)
    assert wire(tool) == NESTED_TOOL
    assert json.loads(wire_json(tool)) == NESTED_TOOL
    assert tool.name == "search"


def test_tool_in_init_response_keeps_schema_and_drops_null_description() -> None:
    """Init responses carry the full schema and never ``"description": null``."""
    bare = {"type": "function", "function": {"name": "ping", "description": None}}
    init = InitResponse(
        rollout_id="r-1",
        tools=[
            OpenAIFunctionToolSchema.model_validate(NESTED_TOOL),
            OpenAIFunctionToolSchema.model_validate(bare),
        ],
    )
    body = json.loads(wire_json(init))
    assert body["tools"][0] == NESTED_TOOL
    assert body["tools"][1] == {
        "type": "function",
        "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
    }
    assert "null" not in json.dumps(body["tools"][1])


def test_tool_extra_keys_are_kept() -> None:
    """Unknown keys on a tool or its function (vendor extensions) are passed through."""
    data = {"type": "function", "function": {"name": "f", "x-cost": 2}, "cache_control": "x"}
    assert wire(OpenAIFunctionToolSchema.model_validate(data))["function"]["x-cost"] == 2


# -- CompletionsRequest -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stop", "expected"), [("</s>", ["</s>"]), (["a", "b"], ["a", "b"]), (None, None)]
)
def test_stop_string_becomes_a_list(stop: Any, expected: list[str] | None) -> None:
    """``stop`` is always sent as a list; a single string becomes a one-element list."""
    request = CompletionsRequest(rollout_id="r-1", messages=[], stop=stop)
    assert request.stop == expected
    assert wire(request).get("stop") == expected


def test_completions_request_wire_shape() -> None:
    """Requests drop nulls, keep extra sampling keys, and ask for logprobs by default."""
    request = CompletionsRequest.model_validate(
        {"rollout_id": "r-1", "messages": [{"role": "user", "content": "hi"}], "seed": 7}
    )
    assert wire(request) == {
        "model": "default",
        "rollout_id": "r-1",
        "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True,
        "seed": 7,
    }


# -- CompletionsResponse ----------------------------------------------------------------------


def completion(**overrides: Any) -> dict[str, Any]:
    """A minimal valid chat-completion reply, with ``overrides`` applied."""
    data: dict[str, Any] = {
        "id": "c1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    data.update(overrides)
    return data


def test_protocol_example_reply_parses() -> None:
    """protocol.md's example reply parses with every extension."""
    reply = CompletionsResponse.model_validate(
        completion(
            object="chat.completion",
            created=1760000000,
            choices=[
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'},
                            }
                        ],
                    },
                }
            ],
            token_ids=[11, 12],
            logprobs=[-0.1, -0.3],
            prompt_token_ids=[1, 2, 3],
            system_fingerprint="ignored",
        )
    )
    assert reply.message.tool_calls is not None
    assert reply.message.tool_calls[0].function.arguments == '{"a": 3, "b": 4}'
    assert reply.token_ids == [11, 12]
    assert reply.logprobs == [-0.1, -0.3]
    assert reply.prompt_token_ids == [1, 2, 3]


@pytest.mark.parametrize(
    "choices",
    [[], [{"index": 0, "finish_reason": "stop"}], [{"index": 0, "message": None}]],
    ids=["no-choices", "no-message", "null-message"],
)
def test_reply_without_a_message_fails_validation(choices: list[Any]) -> None:
    """A reply without ``choices[0].message`` is a validation error, not a KeyError later."""
    with pytest.raises(ValidationError) as exc:
        CompletionsResponse.model_validate(completion(choices=choices))
    assert all(loc[0] == "choices" for loc in error_locs(exc))


def test_reply_without_choices_key_fails_validation() -> None:
    """A reply missing the ``choices`` key altogether is rejected."""
    data = completion()
    del data["choices"]
    with pytest.raises(ValidationError) as exc:
        CompletionsResponse.model_validate(data)
    assert error_locs(exc) == [("choices",)]


@pytest.mark.parametrize("usage", [None, "missing"])
def test_reply_with_null_or_missing_usage_fails_validation(usage: Any) -> None:
    """``usage`` is required and never null."""
    data = completion(usage=usage)
    if usage == "missing":
        del data["usage"]
    with pytest.raises(ValidationError) as exc:
        CompletionsResponse.model_validate(data)
    assert error_locs(exc) == [("usage",)]


def test_usage_total_is_filled_in() -> None:
    """A usage without total_tokens gets prompt + completion."""
    reply = CompletionsResponse.model_validate(
        completion(usage={"prompt_tokens": 5, "completion_tokens": 2})
    )
    assert reply.usage.total_tokens == 7


def test_openai_style_logprobs_are_flattened() -> None:
    """``{"content": [{"logprob": ...}, ...]}`` becomes a flat list of floats."""
    logprobs = {
        "content": [
            {"token": "Hel", "logprob": -0.25, "top_logprobs": []},
            {"token": "lo", "logprob": -1.5, "top_logprobs": []},
        ]
    }
    reply = CompletionsResponse.model_validate(completion(logprobs=logprobs))
    assert reply.logprobs == [-0.25, -1.5]


def test_openai_style_logprobs_with_null_content_become_empty() -> None:
    """``{"content": null}`` (no tokens) flattens to an empty list."""
    reply = CompletionsResponse.model_validate(completion(logprobs={"content": None}))
    assert reply.logprobs == []


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"a": 3, "b": [1, 2]}, {"a": 3, "b": [1, 2]}),
        ('{"a": 3}', {"a": 3}),
        (None, {}),
    ],
)
def test_tool_call_arguments_become_a_json_string(arguments: Any, expected: Any) -> None:
    """Tool-call ``arguments`` is a JSON string; objects and null are tolerated and converted."""
    call = OpenAIFunctionCall.model_validate({"name": "add", "arguments": arguments})
    assert isinstance(call.arguments, str)
    assert json.loads(call.arguments) == expected


def test_tool_call_arguments_object_inside_a_reply() -> None:
    """An object ``arguments`` inside a full reply reaches the agent as a JSON string."""
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
        ],
    }
    reply = CompletionsResponse.model_validate(completion(choices=[{"message": message}]))
    dumped = reply.message.model_dump(mode="json", exclude_none=True)
    assert dumped["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'


# -- RolloutResponse ----------------------------------------------------------------------------


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), float("-inf")])
def test_rollout_response_rejects_non_finite_reward(reward: float) -> None:
    """A NaN or infinite reward cannot be sent to TrainGate."""
    with pytest.raises(ValidationError):
        RolloutResponse(rollout_id="r-1", status=RolloutStatus.COMPLETED, reward=reward)


def test_rollout_response_wire_drops_nulls() -> None:
    """The callback omits error_message and reward when they are None."""
    body = wire(RolloutResponse(rollout_id="r-1", status=RolloutStatus.COMPLETED))
    assert body == {
        "rollout_id": "r-1",
        "status": "COMPLETED",
        "final_messages": [],
        "extra_fields": {},
    }
