"""``osmosis test --resume``: after a Ctrl-C the resumed run's results file equals an
uninterrupted run's (the mock LLM's replies depend on row, sample and seed only), also with
``--jobs`` and ``--samples``; a file made by other code, rows or options is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app

ASSETS = Path(__file__).parent / "assets"
VOLATILE_ROW = {"rollout_id", "latency_ms", "llm_ms", "tool_ms", "other_ms", "trace"}
# How many rows a run kept from the file (``resumed``) differs by design, like its timings.
VOLATILE_SUMMARY = {"wall_s", "rollouts_per_s", "latency_ms_p50", "latency_ms_p95", "resumed"}
ROWS = [
    {"user_prompt": f"What is {i} + {i}?", "ground_truth": str(2 * i), "wait": i > 3}
    for i in range(1, 8)
]


def comparable(line: dict[str, Any]) -> dict[str, Any]:
    """A results line without what differs between any two runs (timings, the run id)."""
    if line["type"] == "summary":
        return {k: v for k, v in line.items() if k not in VOLATILE_SUMMARY}
    if line["type"] != "row":
        return line
    kept = {k: v for k, v in line.items() if k not in VOLATILE_ROW}
    kept["metrics"] = {k: v for k, v in line["metrics"].items() if not k.endswith("_ms")}
    kept["findings"] = [{**f, "rollout_id": None} for f in line["findings"]]
    return kept


def read(path: Path) -> list[dict[str, Any]]:
    return [comparable(json.loads(line)) for line in path.read_text().splitlines()]


def osmosis(folder: Path, *args: str, gate: Path) -> list[str]:
    target = f"{ASSETS}/resume_agent.py:GatedCalculator"
    return [sys.executable, "-m", "osmosis_rollout", "test", target,
            "-d", str(folder / "rows.jsonl"), *args]  # fmt: skip


def env(gate: Path) -> dict[str, str]:
    return {**os.environ, "RESUME_GATE": str(gate), "COLUMNS": "200"}


def interrupted_run(folder: Path, out: Path, args: list[str], gate: Path, rows: int) -> None:
    """Run until ``rows`` lines are in ``out``, then Ctrl-C; the run exits 130."""
    proc = subprocess.Popen(
        [*osmosis(folder, *args, gate=gate), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(gate),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().count("\n") >= rows):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the first rows never finished"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr.decode()


@pytest.mark.parametrize(
    "args",
    [[], ["--jobs", "2"], ["--samples", "2"]],
    ids=["one-process", "jobs", "samples"],
)
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    gate = tmp_path / "gate"
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    kept = 3 * (2 if "--samples" in args else 1)
    interrupted_run(tmp_path, resumed, args, gate, rows=kept)
    partial = [json.loads(line) for line in resumed.read_text().splitlines()]
    assert partial[-1]["stopped_early"] == "interrupted (Ctrl-C)"
    assert len([line for line in partial if line["type"] == "row"]) == kept
    gate.touch()
    again = subprocess.run(
        [*osmosis(tmp_path, *args, gate=gate), "-o", str(resumed), "--resume"],
        capture_output=True, text=True, env=env(gate), timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert (
        f"{len(ROWS) * (2 if '--samples' in args else 1) - kept}/" in again.stderr
    )  # ran the rest
    full = subprocess.run(
        [*osmosis(tmp_path, *args, gate=gate), "-o", str(whole)],
        capture_output=True, text=True, env=env(gate), timeout=120,
    )  # fmt: skip
    assert full.returncode == 0, full.stderr
    assert read(resumed) == read(whole)


def test_resume_refuses_a_file_made_otherwise(tmp_path: Path) -> None:
    """Other options, other rows or other agent code: a clear error naming which, exit 2."""
    from .support import CALCULATOR

    agent = tmp_path / "agent.py"
    shutil.copy(CALCULATOR.rsplit(":", 1)[0], agent)
    target = f"{agent}:CalculatorAgent"
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    out = tmp_path / "out.jsonl"

    def run(*args: str) -> Any:
        return CliRunner().invoke(app, ["test", target, "-d", str(rows), "-o", str(out), *args])

    assert run().exit_code == 0
    same = run("--resume")
    assert same.exit_code == 0, same.output
    assert "0/0" in same.stderr  # nothing left to run
    seeded = run("--resume", "--seed", "4")
    assert seeded.exit_code == 2
    assert "--resume: the run's options (--seed) differ from those" in " ".join(
        seeded.stderr.split()
    )
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS[1:4]))
    other_rows = run("--resume")
    assert other_rows.exit_code == 2
    assert "the dataset rows differ" in " ".join(other_rows.stderr.split())
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    agent.write_text(agent.read_text() + "\n# changed\n")
    other_code = run("--resume")
    assert other_code.exit_code == 2
    assert "the agent's code differ" in " ".join(other_code.stderr.split())


def test_resume_needs_a_file_with_a_fingerprint(tmp_path: Path) -> None:
    from .support import CALCULATOR, DATASET

    out = tmp_path / "out.jsonl"
    out.write_text('{"type": "row", "row": 1}\n')
    result = CliRunner().invoke(
        app, ["test", CALCULATOR, "-d", DATASET, "-o", str(out), "--resume"]
    )
    assert result.exit_code == 2
    assert "has no closing summary with the run's fingerprint" in " ".join(result.stderr.split())
    no_output = CliRunner().invoke(app, ["test", CALCULATOR, "-d", DATASET, "--resume"])
    assert no_output.exit_code == 2
    assert "--resume continues the results file of --output" in no_output.stderr


def test_resume_without_a_file_runs_everything(tmp_path: Path) -> None:
    from .support import CALCULATOR, DATASET

    out = tmp_path / "new.jsonl"
    result = CliRunner().invoke(
        app, ["test", CALCULATOR, "-d", DATASET, "-o", str(out), "--resume"]
    )
    assert result.exit_code == 0, result.output
    rows = len(Path(DATASET).read_text().splitlines())
    assert json.loads(out.read_text().splitlines()[-1])["rows"] == rows


def test_a_resumed_recording_holds_every_row_and_replays(tmp_path: Path) -> None:
    """``--record`` with ``--resume``: the cassette keeps the rows recorded before the Ctrl-C
    and adds the rest; it replays every row without a divergence, and the results file equals
    an uninterrupted recording run's."""
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    gate = tmp_path / "gate"
    resumed, whole = tmp_path / "resumed.jsonl", tmp_path / "whole.jsonl"
    cassette, whole_cassette = tmp_path / "resumed.cassette", tmp_path / "whole.cassette"
    interrupted_run(tmp_path, resumed, ["--record", str(cassette)], gate, rows=3)
    gate.touch()
    for out, tape, extra in ((resumed, cassette, ["--resume"]), (whole, whole_cassette, [])):
        done = subprocess.run(
            [*osmosis(tmp_path, "--record", str(tape), *extra, gate=gate), "-o", str(out)],
            capture_output=True, text=True, env=env(gate), timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert read(resumed) == read(whole)
    target = f"{ASSETS}/resume_agent.py:GatedCalculator"
    replayed = subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", "test", target, "--replay", str(cassette),
         "--json"],
        capture_output=True, text=True, env=env(gate), timeout=120,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    summary = json.loads(replayed.stdout)
    assert summary["rows"] == len(ROWS)
    assert summary["findings"] == {}


def test_a_run_that_resumes_everything_says_so_instead_of_a_throughput(tmp_path: Path) -> None:
    """Every row already in the file: nothing runs, and the summary says how many were kept,
    not a rollouts/s figure of rows run before (it showed 47525.7 rollouts/s over 0 ms)."""
    from .support import CALCULATOR, DATASET

    out = tmp_path / "whole.jsonl"
    args = ["test", CALCULATOR, "-d", DATASET, "-o", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    again = CliRunner().invoke(app, [*args, "--resume", "--json"])
    assert again.exit_code == 0, again.output
    rows = len(Path(DATASET).read_text().splitlines())
    summary = json.loads(again.stdout)
    assert summary["resumed"] == rows
    assert summary["rollouts_per_s"] == 0
    shown = CliRunner().invoke(app, [*args, "--resume"], env={"COLUMNS": "200"})
    assert f"none run: all {rows} kept from the results file (--resume)" in shown.output


@pytest.mark.anyio
async def test_resume_of_a_launched_server_checks_its_folders_source(tmp_path: Path) -> None:
    """With --launch the bench has no agent object: the server's code is the source files
    where it runs. The same command resumes; an edited source file, or a command spelled
    otherwise, is refused, naming which (it said "the run's options" only, or nothing)."""
    import dataclasses
    import shlex

    from osmosis_rollout.errors import ConfigError
    from osmosis_rollout.evaluation import TestOptions, run_test
    from osmosis_rollout.evaluation.launch import LaunchSpec

    folder = tmp_path / "server"
    folder.mkdir()
    server = folder / "main.py"
    shutil.copy(ASSETS / "foreign" / "starlette_health.py", server)
    (folder / ".venv").mkdir()  # an environment beside it is not its code
    (folder / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"user_prompt": f"Say {w}.", "ground_truth": w}) + "\n"
                            for w in ("yes", "no")))  # fmt: skip
    out = tmp_path / "results.jsonl"
    spec = LaunchSpec(shlex.join([sys.executable, "main.py", "rollout"]), cwd=folder)
    options = TestOptions(
        launch=spec, dataset=rows, protocol="v2", output=out, timeout=30, conformance=False
    )
    first = await run_test(options)
    assert [r.status for r in first.rows] == ["COMPLETED", "COMPLETED"]
    (folder / ".venv" / "changed.py").write_text("x = 1\n")
    again = await run_test(dataclasses.replace(options, resume=True))
    assert again.summary["resumed"] == 2
    server.write_text(server.read_text() + "\n# changed\n")
    with pytest.raises(ConfigError, match=r"the server's code \(the source files where"):
        await run_test(dataclasses.replace(options, resume=True))
    server.write_text(server.read_text().removesuffix("\n# changed\n"))
    spelled = LaunchSpec(shlex.join([sys.executable, "./main.py", "rollout"]), cwd=folder)
    with pytest.raises(ConfigError, match=r"the run's options \(--launch\) differ"):
        await run_test(dataclasses.replace(options, launch=spelled, resume=True))
