"""One v2 schema for both sides (protocol.py): every body the server builds is exactly a
model's fields, the mock TrainGate refuses a body with a field the model does not declare, and
the one list of mock wires (testing/wire) is the server's list of wires."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from osmosis_rollout.grading import Grade
from osmosis_rollout.protocol import (
    CancelAnswer,
    CancelBody,
    CancelBodyReceived,
    CompletionCallback,
    GraderCallback,
    RolloutMetrics,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
    Sample,
    StatusAnswer,
    V2Init,
    V2InitReceived,
    check_secret,
)
from osmosis_rollout.server.types import terminal
from osmosis_rollout.server.wire import all_wires
from osmosis_rollout.server.wire.control import status_body
from osmosis_rollout.server.wire.v2_target import callback_bodies
from osmosis_rollout.testing import MockLLMBackend, MockTrainGate
from osmosis_rollout.testing.protocol_checks_v2 import check_cancel, check_status
from osmosis_rollout.testing.records import RolloutRecord, V2Exchange
from osmosis_rollout.testing.wire import LEGACY_PROTOCOL, WIRES, wire_named
from osmosis_rollout.testing.wire.v2 import start_body

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]
FINAL = [*MESSAGES, {"role": "assistant", "content": "7"}]
AUTH = {"authorization": "Bearer cb"}


def _response(**changes: Any) -> RolloutResponse:
    fields: dict[str, Any] = {
        "rollout_id": "r-1",
        "status": RolloutStatus.COMPLETED,
        "final_messages": FINAL,
        "finish_reason": "stop",
        "reward": 1.0,
        "metrics": RolloutMetrics(num_llm_calls=1),
    }
    return RolloutResponse(**(fields | changes))


#: Every way a rollout ends that builds different bodies: (response, grade, category).
OUTCOMES = [
    (_response(), None, None),
    (_response(reward=None), Grade(reward=0.5), None),
    (_response(reward=None), None, None),
    (_response(), Grade(error="grader broke", category="agent_error"), None),
    (
        _response(status=RolloutStatus.ERROR, error_message="boom", finish_reason="error"),
        None,
        "validation_error",
    ),
    (
        _response(status=RolloutStatus.ERROR, error_message="late", finish_reason="timeout"),
        None,
        None,
    ),
    (
        _response(status=RolloutStatus.ERROR, error_message="stop", finish_reason="cancelled"),
        None,
        None,
    ),
]


def _exact(model: type[BaseModel], body: dict[str, Any]) -> None:
    """``body`` has exactly ``model``'s fields, in order, and the strict model reads it."""
    assert list(body) == list(model.model_fields), model.__name__
    model.model_validate(body)


@pytest.mark.parametrize(("response", "grade", "category"), OUTCOMES)
@pytest.mark.parametrize("rollout_id", ["r-1", None])
def test_every_field_the_server_sets_is_declared(
    response: RolloutResponse, grade: Grade | None, category: str | None, rollout_id: str | None
) -> None:
    bodies, _ = callback_bodies(
        response, grade, category, rollout_id=rollout_id, label="7", graded=True
    )
    assert set(bodies) == {"completion", "grader"}
    _exact(CompletionCallback, bodies["completion"])
    _exact(GraderCallback, bodies["grader"])
    _exact(Sample, bodies["grader"]["sample"])


def test_a_field_no_model_declares_is_refused_when_built() -> None:
    """A field the server would add without declaring it fails where it is set."""
    with pytest.raises(ValidationError, match="extra_forbidden"):
        CompletionCallback(status="success", trace_id="t")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="extra_forbidden"):
        Sample(messages=FINAL, score=1.0)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("part", "where"), [("completion", None), ("grader", None), ("grader", "sample")]
)
async def test_a_server_built_body_with_an_extra_key_is_refused_by_the_mock(
    part: str, where: str | None
) -> None:
    bodies, _ = callback_bodies(_response(), None, None, rollout_id="r-1", label="7", graded=True)
    body = bodies[part]
    (body if where is None else body[where])["new_field"] = 1
    gate = MockTrainGate(MockLLMBackend())
    gate.v2.expect("r-1", api_key="llm", callback_key="cb")
    if part == "grader":  # the completion first, as the server sends it
        completion = json.dumps(bodies["completion"]).encode()
        assert (await gate.v2.handle("completion", "r-1", AUTH, completion)).status_code == 200
    reply = await gate.v2.handle(part, "r-1", AUTH, json.dumps(body).encode())
    assert reply.status_code == 422
    finding = gate.records["r-1"].findings[-1]
    assert finding.code == "malformed_request"
    assert "new_field" in finding.message


async def test_the_server_built_bodies_are_taken_by_the_mock_as_they_are() -> None:
    bodies, _ = callback_bodies(_response(), None, None, rollout_id="r-1", label="7", graded=True)
    gate = MockTrainGate(MockLLMBackend())
    gate.v2.expect("r-1", api_key="llm", callback_key="cb")
    for part in ("completion", "grader"):
        reply = await gate.v2.handle(part, "r-1", AUTH, json.dumps(bodies[part]).encode())
        assert reply.status_code == 200
    record = gate.records["r-1"]
    assert record.findings == []
    assert record.result is not None
    assert record.result.reward == 1.0


def test_the_status_answers_the_server_builds_are_the_model() -> None:
    answers = [
        status_body("r", "running"),
        status_body("r", "unknown"),
        status_body("r", "", terminal("success", 1.0)),
        status_body("r", "", terminal("failure", None, "boom")),
        status_body("r", "", terminal("cancelled", None, "stopped")),
    ]
    for answer in answers:
        _exact(StatusAnswer, answer)


def _exchange_after(grader: GraderCallback) -> tuple[RolloutRecord, V2Exchange]:
    exchange = V2Exchange(callback_key="cb")
    exchange.completions.append(CompletionCallback(rollout_id="r", status="success"))
    exchange.graders.append(grader)
    return RolloutRecord(rollout_id="r", exchange=exchange), exchange


def test_a_status_or_cancel_answer_with_an_undeclared_field_is_a_finding() -> None:
    grader = GraderCallback(status="success", sample=Sample(messages=FINAL, reward=1.0))
    record, exchange = _exchange_after(grader)
    good = status_body("r", "", terminal("success", 1.0))
    check_status(record, exchange, 200, good)
    assert record.findings == []
    check_status(record, exchange, 200, good | {"progress": 0.5})
    assert [f.code for f in record.findings] == ["status_wrong"]
    assert "progress" in record.findings[0].message
    record, exchange = _exchange_after(grader)
    check_cancel(record, exchange, 200, {"dispositions": {"r": "not_found"}})
    assert record.findings == []
    CancelAnswer.model_validate({"dispositions": {"r": "not_found"}})
    check_cancel(record, exchange, 200, {"dispositions": {"r": "not_found"}, "n": 1})
    assert [f.code for f in record.findings] == ["cancel_wrong"]


def test_the_mock_builds_the_init_and_the_cancel_from_the_models() -> None:
    request = RolloutRequest(
        rollout_id="r-1",
        server_url="http://x.test",
        messages=MESSAGES,
        completion_params={},
        metadata={"ground_truth": "7"},
    )
    body = start_body(
        request,
        base_url="http://gate.test",
        llm_key="a",
        callback_key="b",
        agent_timeout_s=1,
        grader_timeout_s=2,
    )
    assert set(body) <= set(V2Init.model_fields)
    init = V2Init.model_validate(body)  # strict: an undeclared field would fail here
    assert init.model_dump(exclude_unset=True).keys() == body.keys()
    cancel = CancelBody(ids=["r-1"]).model_dump(exclude_unset=True)
    assert cancel == {"ids": ["r-1"]}


def test_only_a_server_reading_an_init_or_a_cancel_ignores_unknown_fields() -> None:
    """The spec says a server ignores unknown request fields; the shared models refuse them."""
    body = {
        "initial_messages": MESSAGES,
        "chat_completions_url": "http://gate.test/c",
        "completion_callback_url": "http://gate.test/d",
        "priority": 3,
    }
    assert V2InitReceived.model_validate(body).chat_completions_url == "http://gate.test/c"
    with pytest.raises(ValidationError, match="extra_forbidden"):
        V2Init.model_validate(body)
    assert CancelBodyReceived.model_validate({"all": True, "why": "x"}).selectors() == 1
    with pytest.raises(ValidationError, match="extra_forbidden"):
        CancelBody.model_validate({"all": True, "why": "x"})


#: Server wires whose mock side is still to come: the entry goes when it lands (the test below
#: then fails until it does).
AWAITING_MOCK: set[str] = set()


def test_the_mock_wires_are_the_server_wires_by_name() -> None:
    """One list: each mock wire names its server-side twin, and every server wire has one."""
    server = [wire.protocol for wire in all_wires()]
    assert [wire.protocol for wire in WIRES] == [p for p in server if p not in AWAITING_MOCK]
    assert set(server) >= AWAITING_MOCK
    assert not AWAITING_MOCK & {wire.protocol for wire in WIRES}, "drop it from AWAITING_MOCK"
    gate = MockTrainGate()
    for wire in WIRES:
        assert wire_named(wire.protocol.upper()) is wire
        assert gate.controller(wire) is gate.controllers[wire.protocol]
        assert wire.name_urls("nothing here", gate.base_url) == "nothing here"


def test_an_unknown_wire_is_a_clear_error() -> None:
    from osmosis_rollout.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown protocol 'v9'; choose v1 or v2"):
        wire_named("v9")


def _header(**fields: Any) -> dict[str, Any]:
    return {"type": "header", "format": "osmosis-cassette", "version": 1} | fields


def _cassette(tmp_path: Path, header: dict[str, Any]) -> Path:
    path = tmp_path / "c.jsonl"
    lines = [header, {"type": "end", "rows": 0}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_cassette_names_its_wire_and_one_without_predates_v2(tmp_path: Path) -> None:
    from osmosis_rollout.evaluation.cassette import CassetteError, read_cassette

    assert read_cassette(_cassette(tmp_path, _header())).header.protocol == LEGACY_PROTOCOL
    assert read_cassette(_cassette(tmp_path, _header(protocol="v2"))).header.protocol == "v2"
    assert read_cassette(_cassette(tmp_path, _header(protocol="polling"))).header.protocol == (
        "polling"
    )
    with pytest.raises(CassetteError, match="not a wire this osmosis speaks"):
        read_cassette(_cassette(tmp_path, _header(protocol="v9")))


def test_a_recorder_is_told_its_wire(tmp_path: Path) -> None:
    """Nothing records a run as v1 by default: the wire is a required argument."""
    from osmosis_rollout.evaluation.recording import CassetteRecorder
    from osmosis_rollout.evaluation.runner import RunOptions

    gate = MockTrainGate()
    with pytest.raises(TypeError, match="protocol"):
        CassetteRecorder(tmp_path / "a.jsonl", gate, RunOptions())  # type: ignore[call-arg]
    recorder = CassetteRecorder(tmp_path / "b.jsonl", gate, RunOptions(), protocol="v2")
    recorder.close()
    header = json.loads((tmp_path / "b.jsonl").read_text().splitlines()[0])
    assert header["protocol"] == "v2"


def test_an_outbox_file_always_names_its_wire(tmp_path: Path) -> None:
    from osmosis_rollout.server.state.memory import read_outbox_dir, write_outbox

    response = _response()
    path = write_outbox(tmp_path, "http://tg.test", response, "failed", protocol="v1")
    assert json.loads(path.read_text())["protocol"] == "v1"
    data = json.loads(path.read_text())
    del data["protocol"]  # written before v2: read as v1
    path.write_text(json.dumps(data))
    assert [entry.protocol for entry in read_outbox_dir(tmp_path)] == [LEGACY_PROTOCOL]


# -- the polling wire: the same rule, one strict model per body --------------------------------


@pytest.mark.parametrize(("response", "grade", "category"), OUTCOMES)
@pytest.mark.parametrize("graded", [True, False])
def test_every_polling_result_the_server_keeps_is_declared(
    response: RolloutResponse, grade: Grade | None, category: str | None, graded: bool
) -> None:
    """The result body a finished polling rollout keeps (and every in-flight and lease-expired
    answer) is exactly ``protocol.PollingResult``'s fields, read by the mock's strict model."""
    from osmosis_rollout.protocol import PollingResult
    from osmosis_rollout.server.wire.polling_results import in_flight_body, lease_expired_body
    from osmosis_rollout.server.wire.polling_target import result_body

    body, _ = result_body(response, grade, category, label="7", graded=graded)
    _exact(PollingResult, body)
    if body["sample"] is not None:
        _exact(Sample, body["sample"])
    for raw in (in_flight_body("r-1", "running"), lease_expired_body("r-1")):
        _exact(PollingResult, json.loads(raw))


def test_the_polling_start_is_one_model_read_leniently_by_the_server() -> None:
    """The mock builds ``protocol.PollingInit`` (unknown fields refused); the server reads the
    same fields as ``PollingInitReceived`` (unknown fields ignored, as the SDK's server). The
    202 is read with the strict ``PollingAccepted`` in every polling run of the mock."""
    from osmosis_rollout.protocol import PollingInit, PollingInitReceived
    from osmosis_rollout.server.wire.polling_body import PollingInit as Served
    from osmosis_rollout.testing.wire.polling import start_body

    request = RolloutRequest(
        rollout_id="r-1", server_url="http://gate.test", messages=MESSAGES, completion_params={}
    )
    body = start_body(
        request, base_url="http://gate.test", llm_key="k", agent_timeout_s=5, grader_timeout_s=5
    )
    assert PollingInit.model_validate(body).rollout_id == "r-1"
    with pytest.raises(ValidationError, match="extra"):
        PollingInit.model_validate({**body, "novel": 1})
    assert PollingInitReceived.model_validate({**body, "novel": 1}).rollout_id == "r-1"
    assert set(PollingInitReceived.model_fields) == set(PollingInit.model_fields)
    assert issubclass(Served, PollingInitReceived)  # the server's reading is the protocol's


@pytest.mark.parametrize(
    ("key", "taken"),
    [
        ("sk-live_1.~!", True),
        ("", True),
        ("a b", False),
        ("a\tb", False),
        ("a\x7f", False),
        ("clé", False),
        ("a\x00", False),
    ],
)
def test_a_secret_is_printable_ascii_without_spaces(key: str, taken: bool) -> None:
    """It goes into a header: a space, a control character or non-ASCII would break it."""
    if taken:
        assert check_secret(key, "controller_api_key") == key
    else:
        with pytest.raises(ValueError, match="printable ASCII without spaces"):
            check_secret(key, "controller_api_key")
