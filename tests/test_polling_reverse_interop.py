"""The reverse interop: our polling mock TrainGate drives an unmodified osmosis-ai 0.3.8 rollout
server, ``create_rollout_server(LocalBackend(...))`` written with the SDK's public API the way
its scaffold writes one (``tests/assets/sdk_local_rollout.py``), with and without a grader.

The server runs in the SDK's own Python 3.12+ venv (``tests/peer_sdk.py``), started as the
platform starts one (``evaluation.launch``: ``_OSMOSIS_ROLLOUT_PORT`` on 127.0.0.1, waited for
on ``/health``, always stopped). Checked: each result reads as the workflow and grader made it
(the conversation, the reward, a failure's category; without a grader, the SDK's own
``failure`` for a rollout that asks for grading), the SDK's bodies parse with our strict
models (a field we do not declare would be a ``malformed_request`` finding), and a sound server
gives no finding at all: the second read is the same, a wrong lease is a 403, statuses only
move forward.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.launch import LaunchSpec, launch
from osmosis_rollout.testing import Harness, ScriptedBackend

from .peer_sdk import python_of, sdk_venv
from .processes import REPO

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

SERVER = REPO / "tests" / "assets" / "sdk_local_rollout.py"
MESSAGES = [{"role": "user", "content": "What is 40 + 2?"}]
ADD = {
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": 40, "b": 2})},
        }
    ]
}
REPLIES: list[dict[str, Any]] = [ADD, {"content": "42"}]


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    """osmosis-ai[server] 0.3.8 in its cached Python 3.12+ venv."""
    return python_of(sdk_venv("0.3.8"))


@contextlib.asynccontextmanager
async def sdk_server(python: Path, *, grader: bool) -> AsyncIterator[str]:
    spec = LaunchSpec(
        f"{python} {SERVER}",
        cwd=REPO,
        env={"SDK_GRADER": "1" if grader else "0"},
        startup_timeout_s=90,
    )
    async with launch(spec) as server:
        yield server.url


async def drive(url: str, **metadata: Any) -> Any:
    async with Harness(server_url=url, backend=ScriptedBackend(REPLIES), protocol="polling") as h:
        return await h.run(MESSAGES, metadata={"ground_truth": "42", **metadata}, timeout_s=30)


@pytest.mark.parametrize("grader", [True, False], ids=["grader", "no-grader"])
async def test_our_mock_drives_the_sdks_local_backend(sdk_python: Path, grader: bool) -> None:
    async with sdk_server(sdk_python, grader=grader) as url:
        right = await drive(url)
        wrong = await drive(url, ground_truth="41")
        broken = await drive(url, **{"raise": True})
    for outcome in (right, wrong, broken):
        assert outcome.init_status == 202, outcome.init_body
        assert outcome.findings == [], outcome.findings
        assert outcome.record.exchange.statuses[-1] in ("success", "failure")
    failed = broken.record.result
    assert failed.status.value == "ERROR"
    assert failed.reward is None
    assert failed.error_message.startswith("agent_error: ")
    result = right.record.result
    assert result is not None
    assert len(right.record.chats) == 2
    if not grader:
        # A LocalBackend without a grader answers a rollout that asks for grading (the mock
        # sends ``grade: true``, as RolloutClient does by default) with ``failure``, no sample,
        # no message and no category (backend/local/backend.py: ``graded = FAILURE``): the SDK's
        # own behaviour, which the row reports as it is (ERROR), not a finding of ours.
        for outcome in (right, wrong):
            assert outcome.record.exchange.result == {
                "rollout_id": outcome.rollout_id,
                "status": "failure",
                "sample": None,
                "err_message": None,
                "err_category": None,
            }
            assert outcome.record.result.status.value == "ERROR"
            assert outcome.record.result.error_message == "failure without a message"
        return
    assert result.status.value == "COMPLETED", right.record.exchange.result
    assert [m["role"] for m in result.final_messages] == ["user", "assistant", "tool", "assistant"]
    assert result.final_messages[2]["content"] == "42.0"  # the workflow ran the tool call
    assert result.final_messages[-1]["content"] == "42"
    # the label decides the reward
    assert result.reward == 1.0
    assert wrong.record.result.status.value == "COMPLETED"
    assert wrong.record.result.reward == 0.0


async def test_osmosis_test_server_over_polling_finds_nothing_in_a_sound_sdk_server(
    sdk_python: Path,
) -> None:
    """``osmosis test --server URL --protocol polling``'s engine over the calculator rows: every
    row completes, no finding (the mock model's answers are not the labels: reward 0.0)."""
    async with sdk_server(sdk_python, grader=True) as url:
        report = await run_test(
            TestOptions(
                server=url,
                protocol="polling",
                dataset=REPO / "examples" / "calculator" / "dataset.jsonl",
                limit=4,
            )
        )
    summary = report.summary
    assert (summary["rows"], summary["completed"], summary["findings"]) == (4, 4, {})
    assert summary["mean_reward"] == 0.0
    assert all(row.reward == 0.0 for row in report.rows)
