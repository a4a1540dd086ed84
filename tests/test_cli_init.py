"""`osmosis init`: the command, and every template's project passing validate, test and pytest.

The end-to-end part runs each step as a subprocess in the generated project, as a user would,
all offline. The templates run concurrently to keep the suite fast.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.scaffold import list_templates

from .processes import clean_env

TEMPLATES = [info.name for info in list_templates()]
#: Each template's project, and the default template in the platform's workspace layout.
PROJECTS = [*TEMPLATES, "workspace"]
STEPS = ["validate", "test", "pytest", "ruff check", "ruff format"]
runner = CliRunner()


def one_line(text: str) -> str:
    """Output with Rich's line wrapping undone, for matching sentences."""
    return " ".join(text.split())


# -- the command -----------------------------------------------------------------------------


def test_list_templates() -> None:
    """--list-templates names every template with its description, the default marked."""
    result = runner.invoke(app, ["init", "--list-templates"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == TEMPLATES
    assert lines[0].startswith("tools")
    assert lines[0].endswith("(default)")


def test_init_prints_the_files_and_the_next_three_commands(tmp_path: Path) -> None:
    """Success lists each file created and ends with cd, validate and test."""
    dest = tmp_path / "my-agent"
    result = runner.invoke(app, ["init", "my-agent", "--path", str(dest)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "  my_agent/agent.py" in lines
    assert "  dataset.jsonl" in lines
    assert lines[-3].startswith("  cd ")
    assert Path(shlex.split(lines[-3])[1]).absolute() == dest
    assert lines[-5:] == [
        "Its agent, my_agent.agent:MyAgent, is named in pyproject.toml ([tool.osmosis] agent).",
        "Next:",
        lines[-3],
        "  osmosis validate",  # the project's [tool.osmosis] agent: no TARGET to type
        "  osmosis test --dataset dataset.jsonl",
    ]
    assert (dest / "my_agent" / "agent.py").is_file()


def test_init_with_a_template(tmp_path: Path) -> None:
    """--template picks the template; the minimal one has no tools module."""
    dest = tmp_path / "tiny"
    result = runner.invoke(app, ["init", "tiny", "-t", "minimal", "-p", str(dest)])
    assert result.exit_code == 0, result.output
    assert "from the minimal template" in result.stdout
    assert (dest / "tiny" / "agent.py").is_file()
    assert not (dest / "tiny" / "tools.py").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["init", "123abc"], "'123abc' cannot name an agent project"),
        (["init", "class"], "try 'class-agent'"),
        (["init", "x", "--template", "nope"], "unknown template 'nope'; choose one of: tools"),
        (["init"], "missing NAME"),
    ],
)
def test_usage_errors_exit_2_with_one_clear_message(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """A bad name, an unknown template or no name: exit 2, an error line, no traceback."""
    result = runner.invoke(app, [*args, "--path", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in one_line(result.stderr)
    assert one_line(result.stderr).startswith("Error:")
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_an_existing_project_is_not_overwritten(tmp_path: Path) -> None:
    """init into a non-empty folder exits 2 and leaves the folder alone."""
    dest = tmp_path / "agent"
    dest.mkdir()
    (dest / "agent.py").write_text("# mine\n")
    result = runner.invoke(app, ["init", "agent", "--path", str(dest)])
    assert result.exit_code == 2
    assert "already exists and is not empty" in one_line(result.stderr)
    assert sorted(p.name for p in dest.iterdir()) == ["agent.py"]
    assert (dest / "agent.py").read_text() == "# mine\n"


def test_init_help_names_the_real_default_template() -> None:
    """`osmosis init --help` shows scaffold's default template without importing scaffold."""
    from osmosis_rollout.cli import init as init_command
    from osmosis_rollout.scaffold import DEFAULT_TEMPLATE

    assert init_command._DEFAULT_TEMPLATE == DEFAULT_TEMPLATE


def test_the_workspace_layout_is_the_platforms(tmp_path: Path) -> None:
    """--layout workspace: the project under rollouts/NAME with the main.py the platform starts,
    and the eval and training configs naming it; cd leads into the project."""
    dest = tmp_path / "ws"
    result = runner.invoke(app, ["init", "calc", "--layout", "workspace", "-p", str(dest)])
    assert result.exit_code == 0, result.output
    project = dest / "rollouts" / "calc"
    for part in ("main.py", "pyproject.toml", "dataset.jsonl", "calc/agent.py", "tests"):
        assert (project / part).exists(), part
    for config in ("configs/eval/calc.toml", "configs/training/calc.toml"):
        text = (dest / config).read_text()
        assert 'rollout = "calc"' in text
        assert 'entrypoint = "main.py"' in text
    assert "osmosis_rollout" in (project / "main.py").read_text()
    lines = result.stdout.splitlines()
    assert Path(shlex.split(lines[lines.index("Next:") + 1])[1]).absolute() == project
    # the dataset the eval config names is in the workspace, as the platform keeps one
    assert (dest / "data" / "calc.jsonl").read_text() == (project / "dataset.jsonl").read_text()


def test_the_workspaces_eval_config_runs_as_it_is(tmp_path: Path) -> None:
    """`osmosis test --config configs/eval/NAME.toml` from the workspace's root, as its README
    says: the main.py is launched, the rows of data/NAME.jsonl run, and the run passes."""
    dest = tmp_path / "ws"
    made = runner.invoke(app, ["init", "calc", "--layout", "workspace", "-p", str(dest)])
    assert made.exit_code == 0, made.output
    assert (
        "osmosis-rollout test --config configs/eval/calc.toml" in (dest / "README.md").read_text()
    )
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", "test", "--config", "configs/eval/calc.toml"],
        cwd=dest, env=clean_env(NO_COLOR="1"), capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = len((dest / "data" / "calc.jsonl").read_text().splitlines())
    assert f"{rows}/{rows}" in done.stdout


@pytest.mark.parametrize(
    ("command", "hint"),
    [
        ("validate", "cd rollouts/calc && osmosis validate"),
        ("test", "cd rollouts/calc && osmosis test -d dataset.jsonl"),
        ("doctor", "cd rollouts/calc && osmosis doctor"),
    ],
)
def test_a_command_at_a_workspaces_root_points_at_its_rollouts(
    tmp_path: Path, command: str, hint: str
) -> None:
    """A cold trial: at the workspace's root `osmosis validate` said `missing TARGET` with a
    hint to write `agent.py:MyAgent`, and `osmosis doctor` to run `osmosis init NAME`. Each
    names the rollout folders and the command to run in one (and `test` the eval config)."""
    dest = tmp_path / "ws"
    made = runner.invoke(app, ["init", "calc", "--layout", "workspace", "-p", str(dest)])
    assert made.exit_code == 0, made.output
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", command, "--json"],
        cwd=dest, env=clean_env(NO_COLOR="1"), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert hint in done.stdout, done.stdout + done.stderr
    assert "rollouts/ (calc)" in done.stdout
    if command == "test":
        assert "osmosis test --config configs/eval/calc.toml" in done.stdout
        assert done.returncode == 2


def test_an_unknown_layout_is_a_usage_error(tmp_path: Path) -> None:
    """A typo in --layout names the layouts; nothing is written."""
    result = runner.invoke(app, ["init", "x", "--layout", "platform", "-p", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "unknown layout 'platform'; choose one of: project, workspace" in one_line(result.stderr)
    assert not (tmp_path / "x").exists()


# -- every template, end to end --------------------------------------------------------------


@dataclass
class Pipeline:
    """One template's project and what each step printed and returned."""

    template: str
    project: Path | None = None
    commands: dict[str, list[str]] = field(default_factory=dict)
    steps: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)


def _environment() -> dict[str, str]:
    # A wide terminal so Rich does not wrap; the parent's environment is only copied.
    return {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _init(template: str, base: Path) -> Pipeline:
    """Run init as the user would and follow its output: the folder to cd into, the commands."""
    done = Pipeline(template)
    chosen = ["--layout", "workspace"] if template == "workspace" else ["-t", template]
    init = _run(["-m", "osmosis_rollout", "init", f"demo-{template}", *chosen], base)
    done.steps["init"] = init
    if init.returncode == 0:
        lines = init.stdout.splitlines()
        cd, *commands = (line.strip() for line in lines[lines.index("Next:") + 1 :])
        done.project = base / shlex.split(cd)[1]
        done.commands = {c.split()[1]: ["-m", "osmosis_rollout", *c.split()[1:]] for c in commands}
    return done


def _step_args(done: Pipeline, step: str) -> list[str]:
    if step in done.commands:  # validate and test: exactly what init printed
        return done.commands[step]
    return {
        "pytest": [
            "-m",
            "pytest",
            "-W",
            "error",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
        ],
        "ruff check": ["-m", "ruff", "check", "--no-cache", "."],
        "ruff format": ["-m", "ruff", "format", "--no-cache", "--check", "."],
    }[step]


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pipeline]:
    """Every template through init, then validate, test, pytest and ruff, concurrently."""
    base = tmp_path_factory.mktemp("init-e2e")
    with ThreadPoolExecutor(max_workers=max(4, os.cpu_count() or 1)) as pool:
        done = {p.template: p for p in pool.map(lambda t: _init(t, base), PROJECTS)}
        jobs = {
            (template, step): pool.submit(_run, _step_args(p, step), p.project)
            for template, p in done.items()
            if p.project is not None
            for step in STEPS
        }
        for (template, step), job in jobs.items():
            done[template].steps[step] = job.result()
    return done


def _report(step: subprocess.CompletedProcess[str]) -> str:
    out, err = step.stdout[-3000:], step.stderr[-3000:]
    return f"{step.args}: exit {step.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


@pytest.mark.slow
@pytest.mark.parametrize("template", PROJECTS)
def test_init_creates_the_project(pipelines: dict[str, Pipeline], template: str) -> None:
    """`osmosis init` exits 0 and the printed cd target is the new project."""
    done = pipelines[template]
    assert done.steps["init"].returncode == 0, _report(done.steps["init"])
    assert done.project is not None
    assert (done.project / "pyproject.toml").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("template", PROJECTS)
def test_generated_project_passes(pipelines: dict[str, Pipeline], template: str, step: str) -> None:
    """In the new project: validate, test on its dataset, its pytest and ruff all exit 0."""
    done = pipelines[template]
    assert step in done.steps, f"init failed: {_report(done.steps['init'])}"
    assert done.steps[step].returncode == 0, _report(done.steps[step])


@pytest.mark.slow
def test_generated_project_serves_from_its_settings(pipelines: dict[str, Pipeline]) -> None:
    """`osmosis serve` with no TARGET serves the agent named in [tool.osmosis]."""
    project = pipelines["tools"].project
    assert project is not None
    process = subprocess.Popen(
        [sys.executable, "-m", "osmosis_rollout", "serve", "--port", "0", "--host", "127.0.0.1"],
        cwd=project,
        env=_environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process, lines), daemon=True)
    reader.start()
    try:
        url = _wait_for_url(lines)
        health = httpx2.get(f"{url}/health", timeout=10.0)
        assert health.status_code == 200
        assert health.json()["agent_loop"] == "demo-tools"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=10)  # the pipe ends with the process
        assert process.stderr is not None
        process.stderr.close()


def _read_lines(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Copy serve's stderr into ``lines`` on a thread, so a silent server cannot hang the test."""
    assert process.stderr is not None
    for line in iter(process.stderr.readline, ""):
        lines.put(line)
    lines.put(None)


def _wait_for_url(lines: queue.Queue[str | None]) -> str:
    """The URL from serve's banner."""
    seen = []
    for line in _until_closed(lines):
        seen.append(line)
        match = re.search(r"listening on\s+(http://127\.0\.0\.1:\d+)", line)
        if match:
            return match.group(1)
    raise AssertionError("serve printed no URL:\n" + "".join(seen))


def _until_closed(lines: queue.Queue[str | None]) -> Iterator[str]:
    while True:
        line = lines.get(timeout=60)
        if line is None:
            return
        yield line
