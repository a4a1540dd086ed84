"""``transport/``: the carriers' one home, and the one SSE reader/writer and ``Retry-After``
parser every caller shares (the carriers themselves: test_http1.py, test_client.py,
test_inprocess_transports.py, test_destinations.py)."""

from __future__ import annotations

import email.utils
import json
import time
from pathlib import Path

import pytest

import osmosis_rollout
from osmosis_rollout.endpoint.translate import sse_events
from osmosis_rollout.protocol import CompletionsRequest
from osmosis_rollout.results import CompletionsResult
from osmosis_rollout.testing.records import completion_from_message
from osmosis_rollout.testing.wire.v2 import retry_after, sse_reply
from osmosis_rollout.transport import (
    AsgiTransport,
    Http1Transport,
    Httpx2Transport,
    PostTransport,
    parse_retry_after,
    read_event_stream,
)
from osmosis_rollout.transport.sse import DONE_EVENT, encode_event

SRC = Path(osmosis_rollout.__file__).parent
TRANSPORT = SRC / "transport"


def test_every_carrier_imports_from_the_package() -> None:
    """Existing importers keep ``from osmosis_rollout.transport import ...``; the lean carrier
    is the one in ``transport/http1.py``, loaded on first use."""
    from osmosis_rollout.transport.http1 import Http1Transport as Lean

    assert Http1Transport is Lean
    for carrier in (Http1Transport, Httpx2Transport, AsgiTransport):
        assert carrier.__module__.startswith("osmosis_rollout.transport.")
        assert {"post", "aclose"} <= set(dir(carrier))
    assert isinstance(AsgiTransport(app=None), PostTransport)  # type: ignore[arg-type]


def test_nothing_outside_transport_reads_retry_after_or_sse_itself() -> None:
    """One parser and one reader/writer: a second copy elsewhere in ``src`` fails here."""
    markers = ("parsedate_to_datetime", "data: [DONE]", 'b"data: "')
    found = [
        f"{path.relative_to(SRC)}: {marker}"
        for path in SRC.rglob("*.py")
        if TRANSPORT not in path.parents
        for marker in markers
        if marker in path.read_text()
    ]
    assert found == []


def test_a_nan_retry_after_is_unreadable() -> None:
    """``NaN`` is no number of seconds: the caller's own rule applies (it meant "retry at once"
    to the TrainGate client before)."""
    assert parse_retry_after("nan") is None
    assert parse_retry_after("inf") == float("inf")  # each caller caps it


def test_the_v2_controller_honours_an_http_date_retry_after() -> None:
    """The mock's v2 controller reads ``Retry-After`` with the shared parser: an HTTP-date is
    a wait too (it waited 1 s for any date before), clamped as before."""
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25.0 <= retry_after(soon) <= 30.0
    assert retry_after(email.utils.formatdate(time.time() + 3600, usegmt=True)) == 60.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.05  # in the past: at once


def test_the_endpoints_stream_reads_back_as_its_completion() -> None:
    """The rollout endpoint's ``stream: true`` reply, folded by the shared reader, is the
    same message, finish reason and usage."""
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
    result = CompletionsResult(
        message={"role": "assistant", "content": None, "tool_calls": [call]},
        usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        finish_reason="tool_calls",
    )
    body = read_event_stream(sse_events(result, "1", "m", include_usage=True))
    [choice] = body["choices"]
    assert choice["message"]["tool_calls"] == [call]
    assert choice["finish_reason"] == "tool_calls"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_the_mocks_stream_reads_back_as_its_reply() -> None:
    """The mock TrainGate's streamed v2 reply, folded by the shared reader, is its reply."""
    request = CompletionsRequest(rollout_id="r", messages=[{"role": "user", "content": "hi"}])
    reply = completion_from_message(request, {"content": "Hello there."})
    body = read_event_stream(sse_reply(reply))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello there."}
    assert body["usage"] == reply.usage.model_dump(mode="json")


@pytest.mark.parametrize("data", [{"a": "line\nbreak"}, {"b": [1, 2]}, "text"])
def test_an_event_is_one_data_line(data: object) -> None:
    """JSON escapes newlines, so one event is one ``data:`` line and a blank line."""
    event = encode_event(data)
    assert event.count(b"\n") == 2
    assert event.endswith(b"\n\n")
    assert json.loads(event.removeprefix(b"data: ")) == data
    assert DONE_EVENT == b"data: [DONE]\n\n"
