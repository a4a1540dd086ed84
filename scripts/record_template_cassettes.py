"""Re-record the small cassette every ``osmosis init`` template ships in tests/cassettes/.

Run it after changing a template's agent, tools or dataset (the template's replay test fails
until you do): for each template, a project is created in a temporary folder and its first rows
are recorded with a deterministic model: the built-in mock LLM, or for ``sandbox`` a script of
correct programs (the mock's random code would print tracebacks naming a temporary folder,
which differs on every run). The cassette's agent target is written as its placeholder.

    .venv/bin/python scripts/record_template_cassettes.py [--rows 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from osmosis_rollout.evaluation.recording import CassetteRecorder, describe_llm
from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch
from osmosis_rollout.loader import load_agent
from osmosis_rollout.protocol import CompletionsRequest, CompletionsResponse
from osmosis_rollout.scaffold import create_project, list_templates, project_names
from osmosis_rollout.testing import (
    Harness,
    MockLLMBackend,
    MockTrainGate,
    RolloutRecord,
    completion_from_message,
    load_dataset,
)

ROOT = Path(__file__).resolve().parents[1]
CASSETTE = Path("tests") / "cassettes" / "recorded.jsonl"
#: What the sandbox template's "model" runs for each question of its dataset.
PROGRAMS = {
    "What is the sum of the integers from 1 to 100?": "print(sum(range(1, 101)))",
    "How many primes are there below 100?": (
        "print(len([n for n in range(2, 100) if all(n % d for d in range(2, n))]))"
    ),
}


class ProgramModel:
    """Turn 1: run the question's program; turn 2: answer with what it printed."""

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        turn = len(record.replies)
        last = request.messages[-1]
        if turn == 0:
            code = PROGRAMS[str(last.get("content"))]
            call = {"name": "run_python", "arguments": f'{{"code": "{code}"}}'}
            message: dict[str, Any] = {
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
            }
        else:
            message = {"content": str(last.get("content", "")).strip()}
        return completion_from_message(request, message, turn=turn)


async def record(template: str, rows: int, work: Path) -> None:
    """Record ``template``'s first ``rows`` rows into the template's cassette."""
    name = f"demo-{template}"
    project = work / name
    create_project(project, name=name, template=template, templates_dir=ROOT / "templates")
    sys.path.insert(0, str(project))
    agent = load_agent(project_names(name).target)
    backend: Any = ProgramModel() if template == "sandbox" else MockLLMBackend()
    dataset = [
        RowInput(index=r.number, messages=r.messages, metadata=r.metadata)
        for r in load_dataset(project / "dataset.jsonl", limit=rows)
    ]
    gate = MockTrainGate(backend)
    options = RunOptions()
    destination = ROOT / "templates" / template / CASSETTE
    recorder = CassetteRecorder(
        destination, gate, options, agent="__TARGET__", llm=describe_llm(backend)
    )
    async with Harness(agent, gate=gate) as harness:
        report = await run_batch(harness, dataset, options, on_result=recorder.row_finished)
    recorder.close()
    failed = [r.index for r in report.rows if not r.passed]
    print(f"{destination.relative_to(ROOT)}: {len(report.rows)} row(s), failing: {failed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2, help="rows recorded per template")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for info in list_templates(ROOT / "templates"):
            asyncio.run(record(info.name, args.rows, Path(tmp)))


if __name__ == "__main__":
    main()
