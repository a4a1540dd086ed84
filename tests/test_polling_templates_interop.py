"""Every template against the official controller: osmosis-ai 0.3.8's ``RolloutClient.run_rollout``
drives ``osmosis serve`` of a fresh project of each template through one row of its own dataset,
to the reward ``osmosis test --protocol polling`` gives that row offline.

The model is our mock LLM (``MockLLMBackend``) served as an OpenAI-compatible chat URL on
127.0.0.1, playing the row's ``mock_replies``: the template's tools called with the right
arguments, then the right answer. So the reward is 1.0 both ways, not a default mock's 0; the
offline run proves the script earns it, the SDK's run that the official controller sees it. The
SDK lives in its own Python 3.12+ venv (tests/peer_sdk.py; a skip names why when it cannot be
made, a failure under ``TESTS_REQUIRE_PROGRAMS=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from osmosis_rollout.evaluation.datasets import load_dataset
from osmosis_rollout.protocol import CompletionsRequest
from osmosis_rollout.scaffold import create_project, list_templates
from osmosis_rollout.testing import MockLLMBackend
from osmosis_rollout.testing.records import RolloutRecord

from .processes import REPO, clean_env, osmosis_serve
from .programs import require_program, skip_or_fail
from .support import serve_in_thread
from .test_polling_interop import sdk_python

pytestmark = pytest.mark.slow

__all__ = ["sdk_python"]  # the fixture, shared with test_polling_interop.py

ROLLOUT = REPO / "tests" / "assets" / "polling_sdk_rollout.py"
SERVER_KEY = "polling-templates-key-01"
TEMPLATES = [info.name for info in list_templates()]

_ADD = [{"tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 30}}]}, "42"]
#: Each template's first dataset row played right: its tool calls, then its answer.
SCRIPTS: dict[str, list[Any]] = {
    "minimal": ["Paris"],
    "tools": _ADD,
    "openai-sdk": _ADD,
    "openai-agents": _ADD,
    "sandbox": [
        {"tool_calls": [{"name": "run_python", "arguments": {"code": "print(sum(range(101)))"}}]},
        "5050",
    ],
    # The row's gold answer; the project's own mock judge (url = "mock") grades it, offline and
    # under osmosis serve alike.
    "judge": [
        "Air molecules scatter short blue wavelengths of sunlight much more than red ones, so "
        "blue light reaches our eyes from every direction of the sky."
    ],
}


@dataclass
class MockChat:
    """``MockLLMBackend`` as an OpenAI-compatible ``/v1/rollouts/{rid}/chat/completions``, one
    record per rollout id, each bound to its row's scripted replies (thread-safe: uvicorn runs
    in a thread)."""

    replies: list[Any]
    backend: MockLLMBackend = field(default_factory=MockLLMBackend)
    records: dict[str, RolloutRecord] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def _chat(self, request: Request) -> Response:
        rid = request.path_params["rid"]
        body = json.loads(await request.body())
        chat = CompletionsRequest.model_validate({**body, "rollout_id": rid})
        with self.lock:
            record = self.records.get(rid)
            if record is None:
                record = self.records[rid] = RolloutRecord(rollout_id=rid)
                self.backend.bind_rollout(rid, rid, self.replies)
        reply = await self.backend.complete(chat, record)
        with self.lock:
            record.chats.append(chat)
            record.replies.append(reply)
        return JSONResponse(reply.model_dump(mode="json", exclude_none=True))

    def app(self) -> Starlette:
        """The chat route."""
        return Starlette(
            routes=[Route("/v1/rollouts/{rid}/chat/completions", self._chat, methods=["POST"])]
        )


def _project(tmp_path: Path, template: str) -> tuple[Path, Path]:
    """A fresh project of ``template`` and a dataset of its first row with ``mock_replies``."""
    name = f"demo-{template}"
    project = tmp_path / name
    create_project(project, name=name, template=template)
    first = (project / "dataset.jsonl").read_text(encoding="utf-8").splitlines()[0]
    row = {**json.loads(first), "mock_replies": SCRIPTS[template]}
    dataset = project / "interop.jsonl"
    dataset.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return project, dataset


def _require_sandbox(project: Path) -> None:
    """Skip (fail in CI) where bubblewrap is missing or cannot confine code on this machine,
    with the template's own reason."""
    require_program("bwrap")
    probe = "from demo_sandbox.bwrap import sandbox_problem; print(sandbox_problem() or '')"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    if done.stdout.strip():
        skip_or_fail(f"the sandbox cannot run here: {done.stdout.strip()}")


def _offline_reward(project: Path, dataset: Path) -> float:
    """The reward ``osmosis test --protocol polling`` gives the row, offline."""
    out = project / "offline.json"
    options = ["--protocol", "polling", "--dataset", str(dataset), "-o", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", "test", *options],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    (result,) = json.loads(out.read_text(encoding="utf-8"))["results"]
    assert result["status"] == "COMPLETED", result
    return float(result["reward"])


def test_every_template_is_scripted() -> None:
    """A new template gets its script here, else the interop test below would not cover it."""
    assert sorted(SCRIPTS) == sorted(TEMPLATES)


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_official_client_runs_each_template_to_its_reward(
    sdk_python: Path, tmp_path: Path, template: str
) -> None:
    """The SDK's ``run_rollout`` ends ``success`` with the reward the offline run gives, the
    template's tool having run in the served project and its result reached the model."""
    project, dataset = _project(tmp_path, template)
    if template == "sandbox":
        _require_sandbox(project)
    offline = _offline_reward(project, dataset)
    assert offline == 1.0  # the script plays the row right

    (row,) = load_dataset(dataset)
    rollout_id = f"{template}-row-{row.number}"
    spec = {
        "rollout_id": rollout_id,
        "initial_messages": row.messages,
        "label": row.ground_truth,
        "metadata": row.metadata,
    }
    spec_file = tmp_path / "rollout.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    chat = MockChat(replies=list(row.replies or []))
    env = clean_env(OSMOSIS_API_KEY=SERVER_KEY)
    args = ["--port", "0", "--log-level", "debug"]
    with (
        serve_in_thread(chat.app()) as chat_url,
        osmosis_serve(tmp_path / "serve.log", *args, env=env, cwd=project) as served,
    ):
        chat_base = f"{chat_url}/v1/rollouts/{rollout_id}"
        run = subprocess.run(
            [str(sdk_python), str(ROLLOUT), served.url, SERVER_KEY, chat_base, str(spec_file)],
            capture_output=True,
            text=True,
            timeout=240,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
        )
        log = served.output()
    assert run.returncode == 0, f"{run.stderr}\n--- server log ---\n{log}"
    result = json.loads(run.stdout.strip().splitlines()[-1])

    assert result["status"] == "success", f"{result}\n--- server log ---\n{log}"
    assert result["err_category"] is None
    assert result["sample"]["reward"] == offline
    # the model was ours, every scripted turn played (the tool calls too)
    record = chat.records[rollout_id]
    assert len(record.replies) == len(SCRIPTS[template])
    if len(SCRIPTS[template]) > 1:  # a tool turn: its result came back in the next chat
        last = record.chats[-1].messages
        tool_results = [str(m.get("content")) for m in last if m.get("role") == "tool"]
        assert any(SCRIPTS[template][-1] in text for text in tool_results), last
    assert SERVER_KEY not in log
