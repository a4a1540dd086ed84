"""``osmosis view`` over ATIF trajectories: a folder another producer wrote (Harbor's trial
layout, made here by hand in the shape Harbor and atif-make write), and ours joined with the
results file of the same run. The page is driven in headless Chromium."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import atif
import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.view import build_index, create_view_app

from .browser import Chromium, find_chromium
from .programs import skip_missing
from .support import serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"

#: A trajectory as Harbor's agents write one: no ``extra.osmosis``, ISO timestamps, usage and
#: cost per step, a step that dispatched a tool without the LLM, a text observation.
FOREIGN: dict[str, Any] = {
    "schema_version": "ATIF-v1.5",
    "session_id": "7d1c-harbor-session",
    "agent": {"name": "terminus-2", "version": "2.0.0", "model_name": "gpt-5-mini"},
    "steps": [
        {
            "step_id": 1,
            "timestamp": "2025-10-16T14:30:00Z",
            "source": "user",
            "message": "List the files, then say how many there are.",
        },
        {
            "step_id": 2,
            "timestamp": "2025-10-16T14:30:02Z",
            "source": "agent",
            "model_name": "gpt-5-mini",
            "message": "I will list them.",
            "reasoning_content": "ls is enough",
            "tool_calls": [
                {
                    "tool_call_id": "call_ls",
                    "function_name": "bash",
                    "arguments": {"command": "ls"},
                }
            ],
            "observation": {"results": [{"source_call_id": "call_ls", "content": "a.txt\nb.txt"}]},
            "metrics": {"prompt_tokens": 120, "completion_tokens": 15, "cost_usd": 0.0004},
        },
        {
            "step_id": 3,
            "timestamp": "2025-10-16T14:30:05Z",
            "source": "agent",
            "message": "There are 2 files.",
            "metrics": {"prompt_tokens": 160, "completion_tokens": 7},
        },
    ],
    "final_metrics": {
        "total_prompt_tokens": 280,
        "total_completion_tokens": 22,
        "total_cost_usd": 0.0006,
        "total_steps": 3,
    },
}


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    """A Harbor job folder: one trial with its agent's trajectory, beside files that are not
    trajectories (ignored) and one broken trajectory (a warning)."""
    atif.Trajectory.model_validate(FOREIGN)  # it is what the spec allows
    job = tmp_path / "job"
    (job / "trial-1" / "agent").mkdir(parents=True)
    (job / "trial-1" / "agent" / "trajectory.json").write_text(json.dumps(FOREIGN, indent=2))
    (job / "config.json").write_text(json.dumps({"n_attempts": 1}))
    (job / "broken").mkdir()
    (job / "broken" / "trajectory.json").write_text("{ not json")
    return job


def test_index_lists_a_foreign_atif_folder(foreign: Path) -> None:
    index = build_index([foreign])
    (summary,) = index.rollouts
    assert index.warnings == ["broken/trajectory.json: not JSON"]
    assert summary.rollout_id == "7d1c-harbor-session"
    assert (summary.status, summary.reward, summary.row) == ("UNKNOWN", None, None)
    assert (summary.turns, summary.tool_calls) == (2, 1)
    assert (summary.prompt_tokens, summary.response_tokens) == (280, 22)
    assert summary.latency_ms == 5000.0  # first to last step
    full = index.load(summary)
    assert full["trace_error"] is None
    first, second = full["trajectory"]["turns"]
    assert first["new_messages"] == [
        {"role": "user", "content": "List the files, then say how many there are."}
    ]
    assert first["tool_calls"][0]["tool"] == "bash"
    assert first["tool_calls"][0]["result"] == "a.txt\nb.txt"
    assert json.loads(first["tool_calls"][0]["arguments"]) == {"command": "ls"}
    assert second["new_messages"] == [
        {"role": "tool", "content": "a.txt\nb.txt", "tool_call_id": "call_ls"}
    ]
    assert [m["role"] for m in full["messages"]] == ["user", "assistant", "tool", "assistant"]
    # A single file given by its path reads the same.
    (alone,) = build_index([foreign / "trial-1" / "agent" / "trajectory.json"]).rollouts
    assert alone.rollout_id == summary.rollout_id
    # A .json file named on the command line that is no trajectory is said to be none.
    named = build_index([foreign / "config.json"])
    assert named.rollouts == []
    assert named.warnings == [
        "job/config.json: not an ATIF trajectory (no ATIF schema_version and steps)"
    ]


def test_results_and_our_trajectories_are_one_rollout_each(tmp_path: Path) -> None:
    """``osmosis view results.jsonl trajectories/``: each row gets its trajectory's turns."""
    result = CliRunner().invoke(
        app,
        [
            "test",
            CALCULATOR,
            "-d",
            str(ROOT / "examples" / "calculator" / "dataset.jsonl"),
            "--limit",
            "2",
            "-o",
            str(tmp_path / "results.jsonl"),
            "--trajectories",
            str(tmp_path / "trajectories"),
        ],
    )
    assert result.exit_code == 0, result.output
    index = build_index([tmp_path / "results.jsonl", tmp_path / "trajectories"])
    assert [r.row for r in index.rollouts] == [1, 2]
    assert all(r.atif_path is not None for r in index.rollouts)
    full = index.load(index.rollouts[0])

    def shown(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        # ATIF's message is always text: an assistant's missing content reads back as "".
        return [
            (m["role"], m.get("content") or "", m.get("tool_calls"), m.get("tool_call_id"))
            for m in messages
        ]

    assert shown(full["messages"]) == shown(full["row"]["final_messages"])
    assert len(full["trajectory"]["turns"]) == full["row"]["turns"]
    alone = build_index([tmp_path / "trajectories"]).rollouts
    assert [(r.row, r.status, r.turns) for r in alone] == [
        (r.row, r.status, r.turns) for r in index.rollouts
    ]


def test_a_crafted_atif_file_reads_without_error(tmp_path: Path) -> None:
    """Wrong types wherever a foreign file can put them: the index and the page's record are
    still built (what cannot be read is left out), and no string passes for a number."""
    crafted = {
        "schema_version": "ATIF-v1.7",
        "session_id": 7,
        "steps": [
            5,
            {
                "source": "agent",
                "message": {"a": 1},
                "tool_calls": 3,
                "observation": {"results": 1},
            },
            {"source": "agent", "tool_calls": [{"arguments": "x"}, 2], "metrics": [1]},
            {"source": "system", "observation": {"results": ["x", {"content": 2}]}},
        ],
        "final_metrics": {"total_prompt_tokens": "9", "extra": []},
        "extra": {"osmosis": {"findings": 4, "reward": "1", "metrics": 2, "rollout_id": ["x"]}},
    }
    (tmp_path / "t.json").write_text(json.dumps(crafted))
    index = build_index([tmp_path])
    (summary,) = index.rollouts
    assert (summary.rollout_id, summary.reward, summary.prompt_tokens) == (None, None, 0)
    assert (summary.turns, summary.tool_calls) == (2, 1)
    full = index.load(summary)
    assert [len(t["tool_calls"]) for t in full["trajectory"]["turns"]] == [0, 1]
    assert full["messages"][-1] == {"role": "tool", "content": "2"}


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    executable = find_chromium()
    if executable is None:
        skip_missing("chromium")
        raise AssertionError("unreachable")
    with Chromium(executable, tmp_path_factory.mktemp("chromium-profile")) as chromium:
        yield chromium


def test_viewer_shows_a_foreign_trajectory_in_chromium(foreign: Path, browser: Chromium) -> None:
    """The list names it; its page shows each turn with the tool call and its result."""
    index = build_index([foreign])
    with serve_in_thread(create_view_app(index)) as url:
        browser.open(url + "/")
        rows = browser.evaluate(
            "[...document.querySelectorAll('#rollouts tbody tr')].map(tr => tr.dataset.status)"
        )
        assert rows == ["UNKNOWN"]
        browser.go(f"#/rollout/{index.rollouts[0].id}")
        shown = browser.evaluate(
            "({ turns: document.querySelectorAll('section.turn[data-turn]').length,"
            " tool: document.querySelector('.tool-call .tool-name').textContent,"
            " result: document.querySelector('.tool-call .tool-result pre').textContent,"
            " text: document.querySelector('.transcript').textContent })"
        )
    assert shown["turns"] == 2
    assert (shown["tool"], shown["result"]) == ("bash", "a.txt\nb.txt")
    assert "There are 2 files." in shown["text"]
