"""Record a run against an OpenAI-compatible server, replay it offline, catch every change."""

from __future__ import annotations

import io
import json
import re
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest
from prompt_toolkit import PromptSession
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.evaluation.cassette import CassetteError
from osmosis_rollout.repl import run_repl
from osmosis_rollout.testing import ReplayBackend, RolloutRecord, read_cassette

from .openai_stub import OpenAIStub, RecordedRequest, Reply, text, tool_call
from .support import ASSETS, load_asset

AGENTS = ASSETS / "replay_agents.py"
SECRET = "sk-test-secret-0123456789"
ROWS = [
    {"user_prompt": "What is 1 + 2?", "ground_truth": "3"},
    {"user_prompt": "What is 20 + 22?", "ground_truth": "42"},
    {"user_prompt": "Describe 200000", "ground_truth": "long"},
]
runner = CliRunner()


def answer(request: RecordedRequest) -> Reply:
    """A deterministic "model": call the tool the question needs, then quote its result."""
    messages = request.body["messages"]
    last = messages[-1]
    logprobs = {"content": [{"token": "x", "logprob": -0.25}, {"token": "y", "logprob": -0.5}]}
    extras: dict[str, Any] = {
        "extra": {"token_ids": [101, 102]},
        "choice_extra": {"logprobs": logprobs},
    }
    if last["role"] == "tool":
        content = last["content"]
        if len(content) > 100:
            content = f"a long text of {len(content)} characters"
        return text(f"The answer is {content}.", **extras)
    if last["role"] == "user" and last["content"] == "Are you sure?":
        return text("Yes.", **extras)
    numbers = [int(n) for n in re.findall(r"\d+", last["content"])]
    if last["content"].startswith("Describe"):
        return tool_call("describe", {"n": numbers[0]}, **extras)
    return tool_call("add", {"a": numbers[0], "b": numbers[1]}, **extras)


def record_with(stub: OpenAIStub, dataset: Path, cassette: Path, *flags: str) -> None:
    """``osmosis test CalcAgent --record`` against ``stub`` on 127.0.0.1, with an API key."""
    with stub.serve() as base_url:
        args = ["-d", str(dataset), "--llm-url", base_url, "--model", "stub-model"]
        result = runner.invoke(
            app,
            ["test", f"{AGENTS}:CalcAgent", *args, "--record", str(cassette), *flags],
            env={"OPENAI_API_KEY": SECRET},
        )
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One recording of CalcAgent against the stub over real HTTP: cassette, results, stub."""
    work = tmp_path_factory.mktemp("record")
    dataset = work / "rows.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cassette, results = work / "runs" / "cassette.jsonl", work / "recorded.jsonl"
    stub = OpenAIStub(responder=answer)
    record_with(stub, dataset, cassette, "--temperature", "0.5", "-o", str(results))
    return {"dataset": dataset, "cassette": cassette, "results": results, "stub": stub}


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every attempt to open a network connection fails (and is noted)."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError("network access during a replay")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


def rows_of(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if line.get("type") == "row"]


def replay(
    recorded: dict[str, Any], agent: str, out: Path, *extra: str, dataset: bool = True
) -> Any:
    args = ["test", f"{AGENTS}:{agent}", "--replay", str(recorded["cassette"]), "-o", str(out)]
    if dataset:
        args += ["-d", str(recorded["dataset"])]
    return runner.invoke(app, [*args, *extra])


# -- the cassette --------------------------------------------------------------------------


def test_the_cassette_holds_requests_replies_tools_results_and_no_secret(
    recorded: dict[str, Any],
) -> None:
    """Per row: every request (messages, params, tools), the whole reply (usage, finish reason,
    token ids, logprobs), the tool results (large ones whole), the result; never the key."""
    raw = recorded["cassette"].read_text()
    assert SECRET not in raw
    cassette = read_cassette(recorded["cassette"])
    assert cassette.complete
    assert cassette.header.version == 1
    assert cassette.header.llm["model"] == "stub-model"
    assert cassette.header.options.completion_params == {"temperature": 0.5}
    by_row = {row.row: row for row in cassette.rows}  # written as they finish
    first, big = by_row[1], by_row[3]
    assert [tool["function"]["name"] for tool in first.tools] == ["add", "describe"]
    assert len(first.turns) == 2
    turn1, turn2 = first.turns
    assert turn1.request.params["temperature"] == 0.5
    assert first.request_messages()[0][0]["content"].startswith("You are a careful")
    assert turn1.reply.message.tool_calls is not None
    assert turn1.reply.choices[0].finish_reason == "tool_calls"
    assert turn1.reply.token_ids == [101, 102]
    assert turn1.reply.logprobs == [-0.25, -0.5]
    assert turn1.reply.usage.prompt_tokens > 0
    assert turn2.request.new_messages == [
        {"role": "tool", "tool_call_id": "call_1", "content": "3.0"}
    ]
    assert first.result.status == "COMPLETED"
    assert first.result.reward == 1.0
    assert first.final_messages()[-1]["content"].startswith("The answer is 3.0")
    tool_result = big.request_messages()[1][-1]["content"]
    assert len(tool_result) == 200_000


def test_a_secret_the_model_echoes_is_scrubbed(tmp_path: Path) -> None:
    """The API key never reaches the cassette, even when it appears in a reply."""
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps(ROWS[0]) + "\n")
    cassette = tmp_path / "c.jsonl"
    record_with(OpenAIStub([text(f"my key is {SECRET}")]), dataset, cassette)
    raw = cassette.read_text()
    assert SECRET not in raw
    assert "my key is **********" in raw


def test_an_interrupted_recording_reads_up_to_its_last_complete_row(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    """A cassette cut inside a row (a crash mid-write) keeps the rows before it, marked partial."""
    lines = recorded["cassette"].read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:3]) + lines[3][:50])
    cassette = read_cassette(cut)
    assert not cassette.complete
    kept = sorted(r.row for r in cassette.rows)
    assert len(kept) == 2
    out = tmp_path / "out.jsonl"
    result = runner.invoke(
        app, ["test", f"{AGENTS}:CalcAgent", "--replay", str(cut), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "partial cassette" in result.output
    assert [r["row"] for r in rows_of(out)] == kept


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"hello": 1}\n', "not an osmosis cassette"),
        ('{"type": "header", "format": "osmosis-cassette", "version": 9}\n', "format version 9"),
        (
            '{"type": "header", "format": "osmosis-cassette", "version": 1}\n{"type": "row"}\n',
            ":2: a malformed row",
        ),
        ("", "is empty"),
        (
            '{"type": "header", "format": "osmosis-cassette", "version": 1}\n'
            '{"type": "row", "row": 1, \n{"type": "end", "rows": 1}\n',
            ":2: not a JSON object",
        ),
        (
            '{"type": "header", "format": "osmosis-cassette", "version": 1}\n'
            '{"type": "row", "row": "one"}\n',
            ":2: a malformed row",
        ),
    ],
)
def test_a_bad_cassette_is_a_clear_usage_error(tmp_path: Path, content: str, message: str) -> None:
    """A file that is not a readable cassette says which and where, exit 2, no traceback."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    with pytest.raises(CassetteError, match=re.escape(message)):
        read_cassette(bad)
    result = runner.invoke(app, ["test", f"{AGENTS}:CalcAgent", "--replay", str(bad)])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


# -- replay -------------------------------------------------------------------------------


def test_replay_offline_gives_the_recorded_results(
    recorded: dict[str, Any], tmp_path: Path, offline: list[Any]
) -> None:
    """Replaying the unchanged agent, with no network at all, gives the recorded results and
    findings, exit 0."""
    out = tmp_path / "replayed.jsonl"
    requests_before = len(recorded["stub"].requests)
    result = replay(recorded, "CalcAgent", out)
    assert result.exit_code == 0, result.output
    assert offline == []
    assert len(recorded["stub"].requests) == requests_before
    keys = ("row", "status", "finish_reason", "reward", "turns", "tool_calls", "findings")
    before, after = rows_of(recorded["results"]), rows_of(out)
    assert [{k: r[k] for k in keys} for r in after] == [{k: r[k] for k in keys} for r in before]
    assert [r["final_messages"] for r in after] == [r["final_messages"] for r in before]


def test_replay_without_a_dataset_runs_the_recorded_rows(
    recorded: dict[str, Any], tmp_path: Path, offline: list[Any]
) -> None:
    """The cassette alone is enough: its rows and options are replayed."""
    out = tmp_path / "replayed.jsonl"
    result = replay(recorded, "CalcAgent", out, dataset=False)
    assert result.exit_code == 0, result.output
    assert [r["row"] for r in rows_of(out)] == [1, 2, 3]


@pytest.mark.parametrize(
    ("agent", "turn", "field", "message_index"),
    [
        ("ChangedPromptAgent", 1, "messages[0].content", 0),
        ("ChangedToolFormatAgent", 2, "messages[3].content", 3),
        ("ExtraTurnAgent", 3, "turn", None),
    ],
)
def test_a_changed_agent_diverges_at_the_right_turn_and_field(
    recorded: dict[str, Any],
    tmp_path: Path,
    offline: list[Any],
    agent: str,
    turn: int,
    field: str,
    message_index: int | None,
) -> None:
    """A changed prompt, tool output format or an extra turn: replay_diverged with the row,
    turn and field, a short diff, and exit 1."""
    out = tmp_path / "replayed.jsonl"
    result = replay(recorded, agent, out, "--limit", "1")
    assert result.exit_code == 1, result.output
    (row,) = rows_of(out)
    (finding,) = [f for f in row["findings"] if f["code"] == "replay_diverged"]
    assert finding["details"]["row"] == 1
    assert finding["details"]["turn"] == turn
    assert finding["details"]["field"] == field
    assert finding["details"]["message_index"] == message_index
    assert finding["message"].startswith(f"row 1, turn {turn}: ")
    assert row["status"] == "ERROR"  # strict: the row stops there
    assert f"replay_diverged row 1, turn {turn}" in result.output
    if agent == "ChangedPromptAgent":
        assert "-You are a careful calculator. Use the tools." in result.output
        assert "+You are a sloppy calculator." in result.output
    if agent == "ChangedToolFormatAgent":
        assert "-3.0" in finding["details"]["diff"]
        assert "+result: 3" in finding["details"]["diff"]


def test_a_changed_reward_diverges_on_the_result(
    recorded: dict[str, Any], tmp_path: Path, offline: list[Any]
) -> None:
    """The same requests but another reward: the result comparison reports it."""
    out = tmp_path / "replayed.jsonl"
    result = replay(recorded, "ChangedRewardAgent", out, "--limit", "1")
    assert result.exit_code == 1, result.output
    (row,) = rows_of(out)
    (finding,) = row["findings"]
    assert finding["details"]["field"] == "reward"
    assert "recorded 1.0, now 0.5" in finding["message"]


def test_lenient_mode_answers_by_nearest_match_and_says_so(
    recorded: dict[str, Any], tmp_path: Path, offline: list[Any]
) -> None:
    """--replay-mode lenient keeps going past a divergence, still reports it, exit 1."""
    out = tmp_path / "replayed.jsonl"
    result = replay(
        recorded, "ChangedToolFormatAgent", out, "--limit", "1", "--replay-mode", "lenient"
    )
    assert result.exit_code == 1, result.output
    (row,) = rows_of(out)
    assert row["status"] == "COMPLETED"
    assert row["turns"] == 2
    (finding,) = row["findings"]
    assert finding["details"]["turn"] == 2
    assert "nearest match" in finding["message"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--record", "x.jsonl", "--replay", "y.jsonl"], "not both"),
        (["--replay", "y.jsonl", "--llm-url", "http://127.0.0.1:1/v1"], "drop --llm/--llm-url"),
        (["--replay-mode", "lenient", "-d", "rows.jsonl"], "only with --replay"),
        (["--replay", "y.jsonl", "--replay-mode", "fuzzy"], "choose strict or lenient"),
        (["--record", "x.jsonl", "-i"], "only in batch mode"),
    ],
)
def test_record_and_replay_flags_are_checked(flags: list[str], message: str) -> None:
    """Flags that cannot go together are a usage error (exit 2) saying why."""
    result = runner.invoke(app, ["test", f"{AGENTS}:CalcAgent", *flags])
    assert result.exit_code == 2
    assert message in result.output


# -- ReplayBackend in a project's own pytest ---------------------------------------------------


@pytest.mark.anyio
async def test_replay_backend_replays_a_cassette_in_one_line(recorded: dict[str, Any]) -> None:
    """``await ReplayBackend(path).replay(agent)``: passed for the recorded agent, and a readable
    explanation naming the turn for a changed one."""
    agents = load_asset("replay_agents")
    report = await ReplayBackend(recorded["cassette"]).replay(agents.CalcAgent())
    assert report.passed, report.explain()
    assert [r.reward for r in report.rows] == [1.0, 1.0, 1.0]

    changed = await ReplayBackend(recorded["cassette"]).replay(agents.ChangedPromptAgent())
    assert not changed.passed
    explanation = changed.explain()
    assert "replay_diverged: row 1, turn 1: messages[0].content differs" in explanation
    assert "+You are a sloppy calculator." in explanation


# -- the interactive debugger ----------------------------------------------------------------


async def step_through(cassette: Path, agent: Any, keys: str) -> str:
    """Run ``osmosis test -i --replay``'s REPL on the cassette's first row; return the screen."""
    backend = ReplayBackend(cassette)
    screen = io.StringIO()
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        pipe.close()
        session: PromptSession[str] = PromptSession(input=pipe, output=DummyOutput())
        with anyio.fail_after(20):
            code = await run_repl(
                agent,
                backend=backend,
                rows=backend.rows(),
                start_row=1,
                completion_params=backend.options().completion_params,
                max_turns=backend.options().max_turns,
                session=session,
                console=Console(file=screen, width=120),
            )
    assert code == 0
    return screen.getvalue()


@pytest.mark.anyio
async def test_interactive_replay_steps_through_the_recorded_turns(
    recorded: dict[str, Any], offline: list[Any]
) -> None:
    """``-i --replay``: each recorded reply pauses at the prompt; the row ends as recorded."""
    agents = load_asset("replay_agents")
    text = await step_through(recorded["cassette"], agents.CalcAgent(), "\n\nq\n")
    assert "turn 1" in text
    assert "add(" in text
    assert "The answer is 3.0" in text
    assert "rollout COMPLETED" in text
    assert "replay_diverged" not in text


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("agent", "shown"),
    [
        ("ChangedToolFormatAgent", "row 1, turn 2: messages[3].content differs"),
        ("ChangedRewardAgent", "row 1: reward differs from the recording"),
    ],
)
async def test_interactive_replay_shows_where_a_changed_agent_diverges(
    recorded: dict[str, Any], offline: list[Any], agent: str, shown: str
) -> None:
    """A changed agent stepping through the recording gets the replay_diverged finding, for a
    request (at its turn) and for a result."""
    agents = load_asset("replay_agents")
    text = await step_through(recorded["cassette"], getattr(agents, agent)(), "\n\nq\n")
    assert "replay_diverged" in text
    assert shown in " ".join(text.split())


def test_a_row_missing_from_the_cassette_is_reported_not_crashed(
    recorded: dict[str, Any], tmp_path: Path, offline: list[Any]
) -> None:
    """A dataset row the cassette never recorded fails that row with a clear reason."""
    dataset = tmp_path / "other.jsonl"
    dataset.write_text(json.dumps({"user_prompt": "What is 5 + 5?", "ground_truth": "10"}) + "\n")
    out = tmp_path / "out.jsonl"
    result = replay({**recorded, "dataset": dataset}, "CalcAgent", out)
    assert result.exit_code == 1
    (row,) = rows_of(out)
    assert row["status"] == "ERROR"
    assert "no row of the cassette" in row["error_message"]


@pytest.mark.anyio
async def test_a_completion_of_an_unrecorded_row_becomes_a_finding(
    recorded: dict[str, Any],
) -> None:
    """An agent that completes without asking the model, on a row the cassette lacks, gets a
    replay_diverged finding instead of breaking the mock TrainGate's callback endpoint."""
    from osmosis_rollout.protocol import RolloutRequest, RolloutResponse

    backend = ReplayBackend(recorded["cassette"])
    record = RolloutRecord(rollout_id="r-1")
    record.request = RolloutRequest(
        rollout_id="r-1",
        server_url="http://traingate.test",
        messages=[{"role": "user", "content": "never recorded"}],
        completion_params={},
    )
    backend.rollout_completed(record, RolloutResponse(rollout_id="r-1", status="COMPLETED"))
    (finding,) = record.findings
    assert finding.code == "replay_diverged"
    assert "no row of the cassette" in finding.message
