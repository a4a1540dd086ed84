"""``completion_params`` (``sampling.py``): the known sampling fields, finite numbers, and
``extra_body`` for extensions, as an init's validation applies them."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from osmosis_rollout.protocol import RolloutRequest

from .serving import init_body

# -- completion_params: known sampling fields, finite numbers -----------------------------------


def _params_error(raw: str) -> str:
    """The message of the one error an init with ``completion_params`` = ``raw`` (JSON) gets."""
    text = json.dumps(init_body(completion_params="PARAMS"))
    text = text.replace('"completion_params": "PARAMS"', f'"completion_params": {raw}')
    with pytest.raises(ValidationError) as caught:
        RolloutRequest.model_validate_json(text)
    [error] = caught.value.errors(include_input=False)
    assert error["loc"] == ("completion_params",)
    return str(error["msg"])


@pytest.mark.parametrize(
    "raw", ['{"temperature": NaN}', '{"temperature": 1e999}', '{"top_p": -Infinity}']
)
def test_a_temperature_that_is_not_a_finite_number_is_refused(raw: str) -> None:
    """``NaN`` and ``1e999`` (infinity once parsed) used to be accepted, then sent on."""
    assert "finite number" in _params_error(raw)


@pytest.mark.parametrize(
    "raw",
    [
        '{"extra_body": {"guidance": [1, {"w": NaN}]}}',
        '{"logit_bias": {"50256": 1e999}}',
        '{"response_format": {"scale": Infinity}}',
    ],
)
def test_no_float_anywhere_in_completion_params_may_be_nan_or_infinite(raw: str) -> None:
    """Nested values too: they would be sent as invalid JSON or as a surprise to the engine."""
    assert "finite" in _params_error(raw)


@pytest.mark.parametrize("field", ["action", "url", "stream", "future_sampler"])
def test_an_unknown_completion_params_field_is_refused_naming_it(field: str) -> None:
    """Unknown keys arrived as top-level keys of the server's requests; now a 422 that names
    the key and says where extensions go."""
    message = _params_error(json.dumps({"temperature": 0.5, field: 1}))

    assert repr(field) in message
    assert "completion_params.extra_body" in message


@pytest.mark.parametrize(
    "hostile",
    ["ZZECHO-<script>alert(1)</script>", "x" * 33, "a b", "sk-live-1234567890abcdef\n"],
)
def test_a_hostile_field_name_is_never_echoed(hostile: str) -> None:
    """Found while measuring (issue 38, item 14): the 422 repeated the first 40 characters of
    an unknown field's name. A 4xx names a field only when it is a short identifier; else it
    says how long the name was."""
    for raw in (
        json.dumps({hostile: 1}),
        json.dumps({"extra_body": {hostile: 1, "messages": 1}}),
        json.dumps({"logit_bias": {hostile: "not a number"}}),
    ):
        message = _params_error(raw)
        assert hostile[:8] not in message, message
    assert f"an unknown field of {len(hostile)} characters" in _params_error(
        json.dumps({hostile: 1})
    )


@pytest.mark.parametrize("key", ["messages", "rollout_id", "model", "stream", "temperature"])
def test_extra_body_cannot_set_the_requests_own_fields(key: str) -> None:
    """Extensions extend: they do not replace the history, the id or a named field."""
    assert "not an extension" in _params_error(json.dumps({"extra_body": {key: 1}}))


def test_every_known_sampling_field_is_accepted() -> None:
    """OpenAI's chat-completions sampling fields and vLLM's common ones, typed."""
    params = {
        "model": "m",
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "max_tokens": 64,
        "max_completion_tokens": 64,
        "stop": ["</s>"],
        "seed": 7,
        "n": 1,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.1,
        "logprobs": True,
        "top_logprobs": 2,
        "logit_bias": {"50256": -100},
        "response_format": {"type": "json_object"},
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
    }
    request = RolloutRequest.model_validate(init_body(completion_params=params))

    assert request.completion_params == params
