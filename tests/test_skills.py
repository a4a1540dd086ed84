"""Every command AGENTS.md and the skills give a coding agent runs, in a fresh project.

A skill tells a coding agent what to type; a command that fails there sends it off course. So
each fenced block of each ``SKILL.md`` (and of each template's ``AGENTS.md``) is run the way
``tests/test_docs.py`` runs the docs' blocks (the same parser, markers and sandbox), with the
page's working folder a project ``osmosis init`` has just made, offline. The one model server a
skill names (``http://localhost:8000/v1``) is an OpenAI-compatible stub here.

The last test is a coding agent's session: a planted bug, then exactly the debug skill's
commands in its order, reading only their ``--json`` output, until the run passes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.agent_files.skills import packaged_skills
from osmosis_rollout.scaffold import list_templates

from .openai_stub import OpenAIStub
from .programs import skip_missing
from .test_docs import Block, Sandbox, parse_blocks, run_page

SKILLS_DIR = (
    Path(__file__).resolve().parents[1] / "src" / "osmosis_rollout" / "agent_files" / "skills"
)
SKILL_PAGES = sorted(SKILLS_DIR.glob("*/SKILL.md"))
#: The model server the evaluate skill names; replaced by a stub's URL when run.
MODEL_URL = "http://localhost:8000/v1"


def clean_env() -> dict[str, str]:
    """The caller's environment without its osmosis or OpenAI settings, this venv first."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OSMOSIS_", "OPENAI_", "PYTEST_")) and k != "COV_CORE_SOURCE"
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def fresh_project(base: Path, template: str = "tools") -> Path:
    """``osmosis init demo`` under ``base``, as a user would run it; ``workspace``: the tools
    template in the platform's layout, whose project is ``rollouts/demo``."""
    dest = base / "demo"
    chosen = ["--layout", "workspace"] if template == "workspace" else ["--template", template]
    subprocess.run(
        ["osmosis", "init", "demo", *chosen, "--path", str(dest), "--json"],
        check=True,
        capture_output=True,
        env=clean_env(),
    )
    return dest / "rollouts" / "demo" if template == "workspace" else dest


def run_in_project(blocks: list[Block], base: Path, project: Path) -> None:
    """``test_docs.run_page``, with the page's working folder the fresh project."""
    base.mkdir(exist_ok=True)
    original = Sandbox.__init__

    def in_project(self: Sandbox, where: Path) -> None:
        original(self, where)
        self.cwd = project

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Sandbox, "__init__", in_project)
        run_page(blocks, base)


def test_the_skill_pages_are_the_packaged_skills() -> None:
    assert [p.parent.name for p in SKILL_PAGES] == [s.name for s in packaged_skills()]


@pytest.mark.slow
@pytest.mark.parametrize("page", SKILL_PAGES, ids=lambda p: p.parent.name)
def test_every_command_of_the_skill_runs_in_a_fresh_project(page: Path, tmp_path: Path) -> None:
    blocks = parse_blocks(page)
    assert blocks, f"{page} gives no command"
    project = fresh_project(tmp_path)
    with OpenAIStub().serve() as base_url:
        blocks = [dataclasses.replace(b, text=b.text.replace(MODEL_URL, base_url)) for b in blocks]
        run_in_project(blocks, tmp_path / "box", project)


@pytest.mark.slow
@pytest.mark.parametrize("template", [*(t.name for t in list_templates()), "workspace"])
def test_every_command_of_agents_md_runs_in_its_project(template: str, tmp_path: Path) -> None:
    if template == "sandbox":
        import shutil

        if shutil.which("bwrap") is None:  # its own tests need bubblewrap
            skip_missing("bwrap", what="the sandbox template's tests")
    project = fresh_project(tmp_path, template)
    blocks = parse_blocks(project / "AGENTS.md")
    assert any("osmosis validate --json" in b.text for b in blocks)
    run_in_project(blocks, tmp_path / "box", project)


# -- a coding agent's session ------------------------------------------------------------------


def _json_objects(text: str) -> list[Any]:
    """Every JSON value printed on stdout, in order (``osmosis test`` may print several)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while True:
        at = len(text) - len(text[at:].lstrip())
        if at >= len(text):
            return found
        value, at = decoder.raw_decode(text, at)
        found.append(value)


def _commands(page: Path) -> list[str]:
    """The skill's commands, in its order: each line of each bash block."""
    lines = []
    for block in parse_blocks(page):
        if block.lang == "bash" and block.mode == "run":
            lines += [line.strip() for line in block.text.splitlines() if line.strip()]
    return lines


@pytest.mark.slow
def test_following_the_debug_skill_fixes_a_planted_bug(tmp_path: Path) -> None:
    """A tool whose schema and function disagree (the schema says string, the function needs a
    number): the debug skill's commands, in order, find it from their JSON alone, and after
    the fix the same commands report a passing run."""
    project = fresh_project(tmp_path)
    tools = project / "demo" / "tools.py"
    good = tools.read_text(encoding="utf-8")
    planted = good.replace("def multiply(a: float, b: float)", "def multiply(a: str, b: float)")
    assert planted != good
    tools.write_text(planted, encoding="utf-8")
    commands = _commands(SKILLS_DIR / "debug-agent" / "SKILL.md")
    assert [c.split()[:2] for c in commands if c.startswith("osmosis")][:3] == [
        ["osmosis", "doctor"],
        ["osmosis", "validate"],
        ["osmosis", "test"],
    ]

    env = clean_env()

    def session() -> dict[str, list[Any]]:
        seen: dict[str, list[Any]] = {}
        for command in commands:
            proc = subprocess.run(
                ["bash", "-c", command],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if "--json" in command:
                seen.setdefault(command, []).append((proc.returncode, _json_objects(proc.stdout)))
            else:
                seen.setdefault(command, []).append((proc.returncode, None))
        return seen

    before = session()
    doctor_code, (doctor,) = before["osmosis doctor --json"][0]
    assert doctor_code == 0
    assert doctor["ok"] is True
    _, (validated,) = before["osmosis validate --json"][0]
    assert validated["valid"] is True  # a schema a function disagrees with is valid JSON Schema
    _, objects = before["osmosis test --json --dataset dataset.jsonl"][0]
    summary = objects[-1]
    assert summary["type"] == "summary"
    assert summary["version"] == 1
    found = {f["code"]: f for f in summary["run_findings"]}
    assert found["tool_always_fails"]["details"]["tool"] == "multiply"
    # The code is explained in AGENTS.md, with the table's fix.
    agents = (project / "AGENTS.md").read_text(encoding="utf-8")
    assert "| `tool_always_fails` |" in agents
    traces = list((project / ".osmosis" / "traces").glob("*.jsonl"))
    assert traces, "the skill's --debug-dir command wrote a trace"
    assert "Error:" in traces[0].read_text(encoding="utf-8")
    failing_tests = before["python -m pytest -q"][0][0]
    assert failing_tests != 0  # the project's own test of multiply fails too

    tools.write_text(good, encoding="utf-8")  # the smallest fix: the type hint
    after = session()
    _, objects = after["osmosis test --json --dataset dataset.jsonl"][0]
    summary = objects[-1]
    assert summary["trainable"] is True
    assert summary["run_findings"] == []
    assert summary["findings"] == {}
    assert after["osmosis validate --json"][0][1][0]["valid"] is True
    assert after["python -m pytest -q"][0][0] == 0
