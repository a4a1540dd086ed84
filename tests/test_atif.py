"""``atif``: a rollout as an ATIF document (checked by the ``atif`` package's models, which the
writer never imports), the bytes written, and any ATIF document read back for ``osmosis view``."""

from __future__ import annotations

import json
import math
import os
import stat
import uuid
from pathlib import Path
from typing import Any

import atif
import pytest

from osmosis_rollout.atif import (
    ATIF_VERSION,
    TurnRecord,
    build_trajectory,
    encode_trajectory,
    is_atif,
    read_atif,
)
from osmosis_rollout.protocol import RolloutMetrics, RolloutResponse, RolloutStatus
from osmosis_rollout.server.wire.v2_body import V2Rollout
from osmosis_rollout.trajectory_files import TrajectoryFiles


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


FIRST = {"role": "assistant", "content": None, "tool_calls": [call("c1", "add", '{"a": 1}')]}
SECOND = {"role": "assistant", "content": "It is 3.", "reasoning_content": "1 + 2"}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "1 + 2?"}]},
    FIRST,
    {"role": "tool", "tool_call_id": "c1", "content": "3"},
    SECOND,
]


def result(messages: list[Any], **fields: Any) -> RolloutResponse:
    return RolloutResponse(
        rollout_id="r-1",
        status=RolloutStatus.COMPLETED,
        final_messages=messages,
        finish_reason="stop",
        reward=1.0,
        metrics=RolloutMetrics(num_llm_calls=2, num_tool_calls=1, prompt_tokens=30),
        **fields,
    )


def validated(document: dict[str, Any]) -> atif.Trajectory:
    """Through JSON, as a reader gets it, then the models, strictly."""
    return atif.Trajectory.model_validate(json.loads(encode_trajectory(document)), strict=True)


def test_a_tool_calling_rollout_validates_with_its_token_ids_and_logprobs() -> None:
    turns = [
        TurnRecord(FIRST, "m", 10, 3, [5, 6, 7], [-0.1, -0.2, -0.3], [1, 2], "tool_calls", 1e9),
        TurnRecord(SECOND, "m", 20, 2, None, None, None, "stop"),
    ]
    document = build_trajectory(result(CONVERSATION), turns, agent_name="adder")
    trajectory = validated(document)
    assert trajectory.schema_version == ATIF_VERSION == "ATIF-v1.7"
    assert [s.source for s in trajectory.steps] == ["system", "user", "agent", "agent"]
    assert trajectory.steps[1].message == "1 + 2?"  # text parts as text
    first, second = trajectory.steps[2:]
    assert first.tool_calls is not None
    assert first.tool_calls[0].arguments == {"a": 1}
    assert first.observation is not None
    assert first.observation.results[0].source_call_id == "c1"
    assert first.observation.results[0].content == "3"
    assert first.metrics is not None
    assert (first.metrics.completion_token_ids, first.metrics.logprobs) == (
        [5, 6, 7],
        [-0.1, -0.2, -0.3],
    )
    assert first.metrics.prompt_token_ids == [1, 2]
    assert first.timestamp == "2001-09-09T01:46:40Z"
    # A turn TrainGate gave no token ids: counts only, no made-up ids.
    assert second.metrics is not None
    assert second.metrics.completion_token_ids is None
    assert second.metrics.prompt_tokens == 20
    assert second.reasoning_content == "1 + 2"
    assert trajectory.agent.model_name == "m"
    final = trajectory.final_metrics
    assert final is not None
    assert (final.total_prompt_tokens, final.total_completion_tokens, final.total_steps) == (
        30,
        5,
        4,
    )
    assert (trajectory.extra or {})["osmosis"]["reward"] == 1.0


def test_odd_messages_still_make_a_valid_document() -> None:
    """What ATIF has no place for is kept under ``extra`` instead of failing the document:
    arguments that are not a JSON object, tool calls on a user message, a tool result with no
    agent step before it or answering no call of it, a role ATIF does not know, -inf logprobs,
    a NaN in the metrics; a rollout with no message at all still has its one step."""
    messages = [
        {"role": "tool", "tool_call_id": "x", "content": "orphan"},
        {"role": "user", "content": "hi", "tool_calls": [call("u1", "f", "{}")]},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "f", "[1, 2]")]},
        {"role": "tool", "tool_call_id": "nope", "content": "stray"},
        {"role": "critic", "content": "meh"},
        {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
    ]
    first = messages[2]
    turns = [TurnRecord(first, logprobs=[-math.inf, -0.5], completion_tokens=2)]
    response = result(messages)
    response.metrics = RolloutMetrics(total_latency_ms=math.nan)
    trajectory = validated(build_trajectory(response, turns))
    steps = trajectory.steps
    assert steps[0].source == "system"
    assert steps[0].observation is not None
    assert steps[1].source == "user"
    assert steps[1].tool_calls is None
    assert (steps[1].extra or {})["tool_calls"][0]["tool_call_id"] == "u1"
    agent = steps[2]
    assert agent.tool_calls is not None
    assert agent.tool_calls[0].arguments == {}
    assert (agent.tool_calls[0].extra or {})["arguments"] == "[1, 2]"
    assert agent.observation is not None
    assert agent.observation.results[0].source_call_id is None
    assert agent.metrics is not None
    assert agent.metrics.logprobs is None
    assert (steps[3].source, (steps[3].extra or {}).get("role")) == ("user", "critic")
    assert json.loads(str(steps[4].message))[0]["type"] == "image_url"
    assert (trajectory.extra or {})["osmosis"]["metrics"]["total_latency_ms"] is None

    empty = RolloutResponse(rollout_id="r-2", status=RolloutStatus.ERROR, error_message="boom")
    (only,) = validated(build_trajectory(empty)).steps
    assert only.source == "system"


def test_a_v2_rollouts_label_and_extra_fields_are_where_the_platform_reads_them() -> None:
    """The platform's upload matches ``extra.osmosis.request_extra_fields`` (its row and run
    index) and the document's rollout id with its index; the label is kept beside them."""
    request = V2Rollout.model_construct(
        rollout_id="0123abcd",
        server_url="http://127.0.0.1:1",
        messages=[{"role": "user", "content": "q"}],
        completion_params={},
        metadata={"ground_truth": "42"},
        label="42",
        extra_fields={"row_index": 3, "run_index": 1},
    )
    response = result([{"role": "user", "content": "q"}]).model_copy(
        update={"rollout_id": "0123abcd"}
    )
    document = build_trajectory(response, request=request)
    osmosis = validated(document).extra["osmosis"]  # type: ignore[index]
    assert osmosis["request_extra_fields"] == {"row_index": 3, "run_index": 1}
    assert (osmosis["label"], osmosis["rollout_id"]) == ("42", "0123abcd")
    assert document["session_id"] == document["trajectory_id"] == "0123abcd"


def test_encoding_keeps_token_arrays_on_one_line_and_removes_secrets() -> None:
    document = build_trajectory(
        result([*CONVERSATION, {"role": "user", "content": "key sk-secret-123"}]),
        [TurnRecord(FIRST, token_ids=list(range(50)), logprobs=[-0.5] * 50)],
    )
    text = encode_trajectory(document, ["sk-secret-123"]).decode()
    assert "sk-secret-123" not in text
    assert "**********" in text
    assert '"completion_token_ids": [0, 1, 2,' in text
    assert len(text.splitlines()) < 120  # 100 numbers, not 100 lines
    assert json.loads(text)["steps"][2]["metrics"]["logprobs"] == [-0.5] * 50


def test_our_document_reads_back_as_the_conversation_it_came_from() -> None:
    turns = [TurnRecord(FIRST, prompt_tokens=10, completion_tokens=3), TurnRecord(SECOND)]
    document = json.loads(encode_trajectory(build_trajectory(result(CONVERSATION), turns)))
    assert is_atif(document)
    assert not is_atif({"steps": []})
    assert not is_atif([])
    trajectory = read_atif(document)
    assert [t.reply["content"] for t in trajectory.turns if t.reply] == ["", "It is 3."]
    assert trajectory.turns[0].usage == {"prompt_tokens": 10, "completion_tokens": 3}
    (traced,) = trajectory.turns[0].tool_calls
    assert (traced.tool, traced.tool_call_id, traced.result) == ("add", "c1", "3")
    messages = trajectory.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3] == {"role": "tool", "content": "3", "tool_call_id": "c1"}
    assert trajectory.end is not None
    assert trajectory.end["reward"] == 1.0


def test_files_are_private_whole_and_refuse_a_linked_folder(tmp_path: Path) -> None:
    """0600 files in 0700 folders, written through a temporary renamed into place; a folder
    swapped for a symbolic link is refused, not followed."""
    files = TrajectoryFiles(tmp_path / "root")
    document = build_trajectory(result(CONVERSATION))
    path = files.write("r-1", document)
    assert path == (tmp_path / "root" / "r-1" / "trajectory.json").resolve()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["trajectory.json"]
    files.write("r-1", document)  # rewritten in place
    assert os.listdir(path.parent) == ["trajectory.json"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "root" / "linked").symlink_to(elsewhere)
    with pytest.raises(OSError, match="not a plain folder"):
        files.write("linked", document)
    assert list(elsewhere.iterdir()) == []
    # The platform's runner looks for <root>/<its rollout id>/: a uuid keeps its name.
    for plain in (uuid.uuid4().hex, str(uuid.uuid4()), "row-3-a1b2c3d4"):
        assert files.path_for(plain).parent.name == plain
    for hostile in ("../up", "/abs", "a/../../b", "..", ".hidden", "nul", "x-0123456789abcdef"):
        assert files.path_for(hostile).parent.parent == files.root
        assert files.path_for(hostile) != files.path_for(hostile + "x")


def test_the_writer_needs_no_schema_package() -> None:
    """Serving never imports ``atif`` (a test-only dependency): the documents are plain JSON."""
    import subprocess
    import sys

    code = (
        "import sys, osmosis_rollout.atif, osmosis_rollout.server.trajectories, "
        "osmosis_rollout.evaluation.trajectories, osmosis_rollout.view.index; "
        "assert 'atif' not in sys.modules, 'atif imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
