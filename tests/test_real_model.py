"""Opt-in (``OSMOSIS_REAL_MODEL=1``): the demo and calculator agents against the real
llama.cpp server and Qwen2.5-Coder-0.5B cached by ``setup.sh``, with no false finding.

Skipped, saying why, without the opt-in or the cached server (``tests/llama_server.py``).
Each run is a few greedy turns of a 0.5B model on one thread: a minute or two in all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis_rollout.evaluation import TestOptions, TestReport, run_test
from osmosis_rollout.scaffold import create_project

from .llama_server import TAGLESS_TEMPLATE, missing, serve_llama
from .support import CALCULATOR, DATASET

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """``osmosis init demo``: its agent and dataset."""
    dest = tmp_path_factory.mktemp("real") / "demo"
    create_project(dest, name="demo")
    return f"{dest}/demo/agent.py:DemoAgent", dest / "dataset.jsonl"


@pytest.fixture(scope="module")
def tagless() -> Iterator[str]:
    """The server with a template that renders calls the way this model writes them."""
    with serve_llama("--jinja", "--chat-template-file", str(TAGLESS_TEMPLATE)) as url:
        yield url


def run(target: str, dataset: Path | str, url: str, **options: object) -> TestReport:
    settings = {"limit": 2, "temperature": 0.0, "max_turns": 4, "model": "qwen", **options}
    return asyncio.run(
        run_test(TestOptions(target=target, dataset=dataset, llm_url=url, **settings))
    )


@pytest.mark.parametrize("agent", ["demo", "calculator"])
def test_the_agents_against_the_real_server_have_no_false_finding(
    agent: str, demo: tuple[str, Path], tagless: str
) -> None:
    """Real tool calls with `"content": ""`, checked by the messages and by the tokens: no
    history_rewritten, no token_drift, nothing at all; sized to the server's 2 slots, each
    turn's time split by the server's own timings."""
    target, dataset = demo if agent == "demo" else (CALCULATOR, DATASET)
    report = run(target, dataset, tagless, token_check=True)
    assert [row.status for row in report.rows] == ["COMPLETED"] * 2
    assert report.findings == [], [f.message for f in report.findings]
    assert report.summary["token_check"]["turns_with_drift"] == 0
    assert report.summary["token_check"]["turns_compared"] > 0
    assert report.summary["concurrency"] == {"rollouts": 2, "from": "server", "server_slots": 2}
    split = report.summary["time_per_turn_ms"]
    assert split["model"] > 0
    assert split["toolkit"] is not None


def test_bare_json_calls_with_the_models_own_template_get_the_template_advice() -> None:
    """The model's own template expects <tool_call> tags; it writes bare JSON: every finding is
    a true tool_call_in_text, and says that no parser flag helps."""
    with serve_llama("--jinja") as url:
        report = run(CALCULATOR, DATASET, url, limit=1)
    assert report.findings
    for finding in report.findings:
        assert finding.code == "tool_call_in_text"
        assert "without the <tool_call> tags its chat template expects" in finding.message


def test_a_server_without_jinja_stops_at_once_with_one_message() -> None:
    """`tools param requires --jinja flag`: the first row fails at once, the rest are skipped."""
    with serve_llama("--no-jinja") as url:
        report = run(CALCULATOR, DATASET, url, limit=4)
    assert report.summary["llm_errors"].get("needs_jinja", 0) >= 1
    assert "needs_jinja" in report.summary["stopped_early"]
    assert sum("restart llama-server with --jinja" in line for line in report.model_lines) == 1


def test_the_real_server_as_a_judge_gives_a_verdict_or_a_judge_error() -> None:
    """llama.cpp as the judge (docs/judges.md): at temperature 0 with a seed, in JSON mode, a
    verdict with one score in [0, 1] and one reason per criterion, or, if the small model cannot
    keep the shape even after the repair request, a ``JudgeError`` of kind ``verdict``: never a
    made-up score."""
    from osmosis_rollout.errors import JudgeError
    from osmosis_rollout.judging import Criterion, Judge, JudgeSettings, Rubric

    rubric = Rubric(
        [Criterion("correct", "The answer names the right city."), Criterion("brief", "Short.")],
        reference="Paris",
    )
    chat = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]

    async def judge(url: str) -> object:
        judge = Judge(
            JudgeSettings(url=url, model="qwen", timeout_s=300, max_tokens=256),
            extra_body={"response_format": {"type": "json_object"}},
        )
        try:
            return await judge.score(rubric, chat)
        except JudgeError as exc:
            return exc
        finally:
            await judge.aclose()

    with serve_llama("--jinja") as url:
        outcome = asyncio.run(judge(url))
    if isinstance(outcome, JudgeError):
        assert outcome.kind == "verdict", outcome
        return
    from osmosis_rollout.judging import Verdict

    assert isinstance(outcome, Verdict)
    assert 0.0 <= outcome.score <= 1.0
    assert set(outcome.reasons) == {"correct", "brief"}
    assert outcome.calls in (1, 2)
