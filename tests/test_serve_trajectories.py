"""ATIF trajectories as the platform reads them: ``osmosis serve`` under its artifact root (the
scheduler path, through the harness's in-process server) and ``osmosis test --trajectories``."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path
from typing import Any

import atif
import pytest
from typer.testing import CliRunner

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.cli import app
from osmosis_rollout.testing import Harness, MockLLMBackend

from .support import calculator_agent

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
DATASET = ROOT / "examples" / "calculator" / "dataset.jsonl"
PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]

pytestmark = pytest.mark.anyio


def validated(path: Path) -> atif.Trajectory:
    """The document at ``path``, parsed by the ``atif`` package's models, strictly (as the
    platform's upload check does with its own v1.7 models)."""
    document = json.loads(path.read_text())
    assert document["schema_version"] == "ATIF-v1.7"
    return atif.Trajectory.model_validate(document, strict=True)


class LeakyAgent(RolloutAgentLoop):
    """Puts the rollout's TrainGate key into its final messages, then completes."""

    name = "leaky"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await ctx.chat(list(ctx.request.messages))
        key = ctx.request.api_key_value
        leak = {"role": "user", "content": f"my key is {key}"}
        return ctx.complete([*ctx.request.messages, result.message, leak], reward=0.5)


class GradedAgent(LeakyAgent):
    """Protocol v2: the reward comes from ``grade``, after the agent."""

    name = "graded"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete([*ctx.request.messages, result.message])

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> float:
        return 0.75


async def test_serve_writes_a_valid_trajectory_per_rollout_under_the_artifact_root(
    tmp_path: Path,
) -> None:
    """A tool-calling rollout leaves ``<root>/<rollout_id>/trajectory.json``: its steps, tool
    calls with their observations, each turn's token ids and logprobs as TrainGate sent them,
    and final metrics; mode 0600 in a 0700 folder; the rollout id is where the platform's
    runner looks for it."""
    root = tmp_path / "artifacts"
    agent = calculator_agent()
    async with Harness(agent, backend=MockLLMBackend(), artifact_root=root) as harness:
        outcome = await harness.run(PROMPT, rollout_id="rollout-abc123")
    assert outcome.result is not None
    assert outcome.result.status.value == "COMPLETED"
    path = root / "rollout-abc123" / "trajectory.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["trajectory.json"]  # no temporary left
    trajectory = validated(path)
    document = json.loads(path.read_text())
    osmosis = document["extra"]["osmosis"]
    assert osmosis["rollout_id"] == trajectory.session_id == "rollout-abc123"
    assert osmosis["status"] == "COMPLETED"

    replies = outcome.record.replies
    agent_steps = [s for s in trajectory.steps if s.source == "agent"]
    assert [s.source for s in trajectory.steps[:1]] == ["user"]
    assert len(agent_steps) == len(replies) == outcome.result.metrics.num_llm_calls
    for step, reply in zip(agent_steps, replies, strict=True):
        assert step.llm_call_count == 1
        assert step.metrics is not None
        assert step.metrics.completion_token_ids == reply.token_ids
        assert step.metrics.logprobs == reply.logprobs
        assert step.metrics.prompt_token_ids == reply.prompt_token_ids
        assert step.metrics.prompt_tokens == reply.usage.prompt_tokens
        assert step.model_name == reply.model
    calls = [(c, s) for s in agent_steps for c in s.tool_calls or []]
    assert calls, "the mock LLM calls the calculator's tools"
    tool_messages = [m for m in outcome.result.final_messages if m.get("role") == "tool"]
    assert len(calls) == len(tool_messages)
    for (call, step), message in zip(calls, tool_messages, strict=True):
        assert step.observation is not None
        (result,) = [r for r in step.observation.results if r.source_call_id == call.tool_call_id]
        assert result.content == message["content"]
        assert isinstance(call.arguments, dict)
        assert call.arguments
    assert trajectory.agent.name == "calculator"
    assert {t["function"]["name"] for t in trajectory.agent.tool_definitions or []} >= {"add"}
    final = trajectory.final_metrics
    assert final is not None
    assert final.total_steps == len(trajectory.steps)
    assert final.total_prompt_tokens == sum(r.usage.prompt_tokens for r in replies)
    assert final.total_completion_tokens == sum(r.usage.completion_tokens for r in replies)


async def test_trajectory_holds_no_secret_and_a_v2_grade_gives_its_reward(tmp_path: Path) -> None:
    """The rollout's key written into its messages is scrubbed from the file; on protocol v2
    the reward is the grade's, written with the label the controller sent."""
    root = tmp_path / "artifacts"
    async with Harness(LeakyAgent(), artifact_root=root) as harness:
        outcome = await harness.run(PROMPT, rollout_id="leaky-1")
    key = outcome.record.api_key
    assert key
    assert key in json.dumps(outcome.result.final_messages)
    text = (root / "leaky-1" / "trajectory.json").read_text()
    assert key not in text
    assert "**********" in text
    assert json.loads(text)["extra"]["osmosis"]["reward"] == 0.5

    async with Harness(GradedAgent(), artifact_root=root, protocol="v2") as harness:
        outcome = await harness.run(PROMPT, rollout_id="graded-1", metadata={"ground_truth": "5"})
    assert outcome.result is not None
    assert outcome.result.reward == 0.75
    graded = root / "graded-1" / "trajectory.json"
    validated(graded)
    osmosis = json.loads(graded.read_text())["extra"]["osmosis"]
    assert (osmosis["reward"], osmosis["label"]) == (0.75, "5")


async def test_a_write_that_fails_is_logged_and_the_rollout_still_completes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An artifact root that cannot be written (a file stands where it should be) costs the
    trajectory, never the rollout; the log line names the rollout, not a traceback."""
    root = tmp_path / "not-a-folder"
    root.write_text("")
    with caplog.at_level(logging.ERROR, logger="osmosis_rollout.trajectories"):
        async with Harness(calculator_agent(), artifact_root=root) as harness:
            outcome = await harness.run(PROMPT, rollout_id="doomed-1")
    assert outcome.result is not None
    assert outcome.result.status.value == "COMPLETED"
    assert not outcome.findings
    lines = [r.getMessage() for r in caplog.records if r.name == "osmosis_rollout.trajectories"]
    assert len(lines) == 1
    assert "doomed-1" in lines[0]


async def test_a_slow_disk_delays_no_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is written on the writer thread: while a write hangs, rollouts still end and
    deliver their results; the server's shutdown then waits for the file."""
    import threading

    from osmosis_rollout import trajectory_files

    release = threading.Event()
    real = trajectory_files._write_whole

    def stuck(path: Path, data: bytes) -> None:
        release.wait(30)
        real(path, data)

    monkeypatch.setattr(trajectory_files, "_write_whole", stuck)
    root = tmp_path / "artifacts"
    async with Harness(calculator_agent(), artifact_root=root) as harness:
        for number in range(3):
            outcome = await harness.run(PROMPT, rollout_id=f"slow-{number}")
            assert outcome.result is not None
            assert outcome.result.status.value == "COMPLETED"
        assert not list(root.glob("*/trajectory.json"))  # all three still queued
        release.set()
    assert sorted(p.parent.name for p in root.glob("*/trajectory.json")) == [
        "slow-0",
        "slow-1",
        "slow-2",
    ]


async def test_hostile_rollout_ids_stay_inside_the_artifact_root(tmp_path: Path) -> None:
    """Ids a TrainGate may send that are not plain folder names get a safe folder of their own
    (the trace rule), keep their id inside the document, and never leave the root."""
    root = tmp_path / "artifacts"
    hostile = ["../escape", "a/b", "..", "con", "x" + "\\" + "y", "dot.", "-lead"]
    async with Harness(calculator_agent(), artifact_root=root) as harness:
        for rollout_id in hostile:
            outcome = await harness.run(PROMPT, rollout_id=rollout_id)
            assert outcome.accepted, (rollout_id, outcome.init_body)
    assert not (tmp_path / "escape").exists()
    files = sorted(root.glob("*/trajectory.json"))
    assert len(files) == len(hostile)
    assert all(p.resolve().parent.parent == root.resolve() for p in files)
    ids = {json.loads(p.read_text())["extra"]["osmosis"]["rollout_id"] for p in files}
    assert ids == set(hostile)


def test_osmosis_test_writes_one_trajectory_per_row_and_sample(tmp_path: Path) -> None:
    """``--trajectories DIR``: one valid document per row, and per sample with ``--samples``,
    each with the row's findings and metadata; ``--jobs`` above 1 is refused up front."""
    out = tmp_path / "trajectories"
    result = CliRunner().invoke(
        app,
        [
            "test",
            CALCULATOR,
            "-d",
            str(DATASET),
            "--limit",
            "2",
            "--samples",
            "2",
            "--trajectories",
            str(out),
            "-o",
            str(tmp_path / "results.jsonl"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"4 ATIF trajectories written to {out.resolve()}" in " ".join(result.stderr.split())
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["type"] == "row"]
    assert len(rows) == 4
    for row in rows:
        path = out / row["rollout_id"] / "trajectory.json"
        trajectory = validated(path)
        osmosis = (trajectory.extra or {})["osmosis"]
        assert osmosis["reward"] == row["reward"]
        assert osmosis["request_metadata"] == row["metadata"]
        agent_steps = [s for s in trajectory.steps if s.source == "agent"]
        assert len(agent_steps) == row["turns"]
        assert all(s.metrics and s.metrics.completion_token_ids for s in agent_steps)

    refused = CliRunner().invoke(
        app, ["test", CALCULATOR, "-d", str(DATASET), "--jobs", "2", "--trajectories", str(out)]
    )
    assert refused.exit_code == 2
    assert "--trajectories" in refused.output
    assert "Traceback" not in refused.output


def test_osmosis_test_says_when_trajectories_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file where the folder should be is a usage error up front; a write that fails during
    the run is a warning naming why, and the rows' results stand."""
    taken = tmp_path / "taken"
    taken.write_text("")
    args = ["test", CALCULATOR, "-d", str(DATASET), "--limit", "2"]
    refused = CliRunner().invoke(app, [*args, "--trajectories", str(taken)])
    assert refused.exit_code == 2
    assert "a file is there" in refused.output

    from osmosis_rollout import trajectory_files

    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trajectory_files, "_write_whole", full)
    result = CliRunner().invoke(app, [*args, "--trajectories", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "0 ATIF trajectories written" in said
    assert "2 trajectories could not be written: OSError: [Errno 28] No space left" in said


def test_the_server_and_osmosis_test_write_the_same_trajectory(tmp_path: Path) -> None:
    """``osmosis test --server URL --trajectories DIR`` against ``osmosis serve`` with an
    artifact root: both sides write each rollout, one from the turns the server got, one from
    what the mock TrainGate sent, and the steps agree (the server's also carry timestamps)."""
    from osmosis_rollout.config import ServerSettings
    from osmosis_rollout.server import create_app

    from .support import serve_in_thread

    served = tmp_path / "served"
    application = create_app(calculator_agent(), settings=ServerSettings(artifact_root=served))
    with serve_in_thread(application, lifespan="on") as url:
        args = ["--server", url, "-d", str(DATASET), "--limit", "2"]
        result = CliRunner().invoke(
            app, ["test", *args, "--trajectories", str(tmp_path / "tested")]
        )
        assert result.exit_code == 0, result.output
    tested = sorted((tmp_path / "tested").glob("*/trajectory.json"))
    assert len(tested) == 2
    for path in tested:
        ours = json.loads(path.read_text())
        theirs = json.loads((served / path.parent.name / "trajectory.json").read_text())
        for step in theirs["steps"]:
            step.pop("timestamp", None)
        assert ours["steps"] == theirs["steps"]
        assert ours["agent"] == theirs["agent"]  # the name came from the server's /health
        assert ours["agent"]["name"] == "calculator"
        assert ours["extra"]["osmosis"]["reward"] == theirs["extra"]["osmosis"]["reward"]
