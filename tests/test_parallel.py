"""``osmosis test --jobs N``: the same results from N worker processes, and nothing lost or left.

The runs are real ``osmosis`` processes (worker processes, signals and exit codes are the point);
the agents in ``assets/jobs_agents.py`` note their process ids so that every test can check that
no worker outlives the command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.evaluation.runner import RowResult
from osmosis_rollout.testing import Finding, read_cassette

from .openai_stub import OpenAIStub, RecordedRequest, Reply, text, tool_call
from .support import ASSETS

AGENTS = ASSETS / "jobs_agents.py"
REPLAY_AGENTS = ASSETS / "replay_agents.py"
OSMOSIS = Path(sys.executable).parent / "osmosis"
#: What changes from run to run by nature: timings and the run's id.
VOLATILE_ROW = {"rollout_id", "latency_ms", "llm_ms", "tool_ms", "other_ms", "trace"}
VOLATILE_SUMMARY = {"wall_s", "rollouts_per_s", "latency_ms_p50", "latency_ms_p95"}

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="checks processes through /proc (Linux only)"
)


#: In the environment of every command a test starts (and so of its workers), to find them.
MARK = f"JOBS_TEST_MARK=jobs-{os.getpid()}"


def osmosis_env(pids: Path | None = None, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "_OSMOSIS", "JOBS_"))
    }
    env["JOBS_TEST_MARK"] = MARK.split("=", 1)[1]
    if pids is not None:
        pids.mkdir(exist_ok=True)
        env["JOBS_PIDS"] = str(pids)
    env.update(extra)
    return env


def run_osmosis(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(OSMOSIS), "test", *args], env=env, capture_output=True, text=True, timeout=120
    )


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_results(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[-1]["type"] == "summary"
    return lines[:-1], lines[-1]


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """A results row without what differs between any two runs (timings, the run id)."""
    kept = {k: v for k, v in row.items() if k not in VOLATILE_ROW}
    kept["metrics"] = {k: v for k, v in row["metrics"].items() if not k.endswith("_ms")}
    kept["findings"] = [{**f, "rollout_id": None} for f in row["findings"]]
    return kept


def comparable_summary(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in VOLATILE_SUMMARY}


def assert_same_run(
    first: tuple[list[dict[str, Any]], dict[str, Any]],
    second: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    """Two runs' rows and summaries are the same but for timings and ids."""
    (rows1, summary1), (rows2, summary2) = first, second
    assert [comparable(r) for r in rows2] == [comparable(r) for r in rows1]
    assert comparable_summary(summary2) == comparable_summary(summary1)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def leftovers() -> list[int]:
    """Running processes started by this test session's commands (their environment says so)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if MARK.encode() in environ and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


@pytest.fixture(autouse=True)
def no_process_left() -> Iterator[None]:
    """After every test: nothing its commands started still runs (the command, a worker, or
    any helper process); what does is killed, and the test fails."""
    yield
    deadline = time.monotonic() + 10
    while (left := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running: {left}"


def worker_pids(pids: Path, command_pid: int) -> set[int]:
    return {int(p.name) for p in pids.iterdir()} - {command_pid}


def wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.05)


WORD_ROWS = [
    {"user_prompt": f"say something {i}", "ground_truth": "HELLO" if i % 3 else "bye"}
    for i in range(1, 13)
]
WORD_ROWS[4] = {"user_prompt": "this one fails", "fail": True}


# -- the same results ----------------------------------------------------------------------------


def test_jobs_2_gives_the_results_and_summary_of_jobs_1_with_the_mock_llm(tmp_path: Path) -> None:
    """Rows in dataset order, each with the same status, reward, messages and findings; the same
    summary and exit code; and the work really ran in two other processes, gone afterwards."""
    dataset = write_rows(tmp_path / "rows.jsonl", WORD_ROWS)
    runs = {}
    for jobs in ("1", "2"):
        out, pids = tmp_path / f"out{jobs}.jsonl", tmp_path / f"pids{jobs}"
        args = [f"{AGENTS}:WordAgent", "-d", str(dataset), "-o", str(out), "--json"]
        done = run_osmosis(*args, "--jobs", jobs, "--concurrency", "3", env=osmosis_env(pids))
        assert done.returncode == 1, done.stderr  # the failing row
        assert "Traceback" not in done.stderr
        rows, summary = read_results(out)
        assert json.loads(done.stdout) == summary
        runs[jobs] = (rows, summary, {int(p.name) for p in pids.iterdir()})
    (rows1, summary1, pids1), (rows2, summary2, pids2) = runs["1"], runs["2"]
    assert [r["row"] for r in rows2] == list(range(1, 13))
    assert_same_run((rows1, summary1), (rows2, summary2))
    assert summary2["passed"] == 11
    assert summary2["errors"] == 1
    assert {r["reward"] for r in rows2} == {0.0, 1.0, None}
    assert len(pids1) == 1
    assert len(pids2) == 3
    run_id = rows2[0]["rollout_id"].rsplit("-", 1)[1]
    assert all(r["rollout_id"] == f"row-{r['row']}-{run_id}" for r in rows2)
    assert not [pid for pid in pids2 if alive(pid)]


def record(tmp_path: Path, rows: int) -> tuple[Path, Path]:
    """A cassette of the replay tests' CalcAgent under the mock LLM: its tool arguments vary by
    rollout, so rows 1, 4, 7... have the same input but each its own recording."""
    dataset = write_rows(
        tmp_path / "calc.jsonl",
        [{"user_prompt": f"What is {i % 3} + 2?", "ground_truth": "2"} for i in range(rows)],
    )
    cassette = tmp_path / "cassette.jsonl"
    done = run_osmosis(
        f"{REPLAY_AGENTS}:CalcAgent", "-d", str(dataset), "--record", str(cassette),
        env=osmosis_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dataset, cassette


def divergence_lines(stdout: str) -> list[str]:
    """What ``osmosis test`` prints of each replay_diverged finding: the line and its diff."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("replay_diverged"))
    return [line.rstrip() for line in lines[start:] if line.strip()]


def test_a_replay_with_jobs_2_matches_jobs_1_and_reports_divergences_the_same(
    tmp_path: Path,
) -> None:
    """The unchanged agent replays clean, each recording once (rows with the same input
    included); a changed tool output diverges on the same rows, turns and fields, printed the
    same, exit 1."""
    _, cassette = record(tmp_path, 8)
    outputs: dict[tuple[str, str], Any] = {}
    for agent in ("CalcAgent", "ChangedToolFormatAgent"):
        for jobs in ("1", "2"):
            out = tmp_path / f"{agent}-{jobs}.jsonl"
            done = run_osmosis(
                f"{REPLAY_AGENTS}:{agent}", "--replay", str(cassette), "-o", str(out),
                "--jobs", jobs, "--concurrency", "2", env=osmosis_env(),
            )  # fmt: skip
            assert done.returncode == (0 if agent == "CalcAgent" else 1), done.stderr
            outputs[agent, jobs] = (done, *read_results(out))
    for agent in ("CalcAgent", "ChangedToolFormatAgent"):
        assert_same_run(outputs[agent, "1"][1:], outputs[agent, "2"][1:])
    clean = outputs["CalcAgent", "2"][2]
    assert clean["passed"] == 8
    assert clean["findings"] == {}
    # Rows 1, 4 and 7 have one input and three different recordings: each is replayed once.
    recorded = {row.row: json.dumps(row.final_messages()) for row in read_cassette(cassette).rows}
    replayed = {r["row"]: json.dumps(r["final_messages"]) for r in outputs["CalcAgent", "2"][1]}
    assert len({recorded[n] for n in (1, 4, 7)}) == 3
    assert sorted(replayed[n] for n in (1, 4, 7)) == sorted(recorded[n] for n in (1, 4, 7))
    done1, _, _ = outputs["ChangedToolFormatAgent", "1"]
    done2, rows2, summary2 = outputs["ChangedToolFormatAgent", "2"]
    assert summary2["findings"] == {"replay_diverged": 8}
    details = rows2[0]["findings"][0]["details"]
    assert (details["turn"], details["field"]) == (2, "messages[3].content")
    assert divergence_lines(done2.stdout) == divergence_lines(done1.stdout)
    assert "+result: " in done2.stdout


def test_a_lenient_replay_of_a_changed_dataset_gives_jobs_1_results(tmp_path: Path) -> None:
    """--replay-mode lenient with rows the cassette lacks: the command picks each row's nearest
    recording as one process does, and the answers and findings are the same."""
    _, cassette = record(tmp_path, 4)
    changed = write_rows(
        tmp_path / "changed.jsonl",
        [{"user_prompt": f"What is {i % 3} + 20?", "ground_truth": "2"} for i in range(4)],
    )
    runs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"lenient{jobs}.jsonl"
        done = run_osmosis(
            f"{REPLAY_AGENTS}:CalcAgent", "--replay", str(cassette), "--replay-mode", "lenient",
            "-d", str(changed), "-o", str(out), "--jobs", jobs, "--concurrency", "1",
            env=osmosis_env(),
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        runs.append(read_results(out))
    assert_same_run(*runs)
    summary2 = runs[1][1]
    assert summary2["findings"]["replay_diverged"] >= 4


def answer(request: RecordedRequest) -> Reply:
    """A deterministic model: call add with the question's numbers, then quote the result."""
    last = request.body["messages"][-1]
    if last["role"] == "tool":
        return text(f"The answer is {last['content']}.")
    a, b = (int(n) for n in re.findall(r"\d+", last["content"])[:2])
    return tool_call("add", {"a": a, "b": b})


def test_jobs_2_against_an_openai_compatible_server(tmp_path: Path) -> None:
    """--llm-url: every worker talks to the server with the key from its environment; results
    as with --jobs 1."""
    dataset = write_rows(
        tmp_path / "rows.jsonl",
        [{"user_prompt": f"What is {i} + 2?", "ground_truth": str(i + 2)} for i in range(6)],
    )
    stub = OpenAIStub(responder=answer)
    runs = []
    with stub.serve() as base_url:
        for jobs in ("1", "2"):
            out = tmp_path / f"out{jobs}.jsonl"
            done = run_osmosis(
                f"{REPLAY_AGENTS}:CalcAgent", "-d", str(dataset), "--llm-url", base_url,
                "--model", "stub-model", "-o", str(out), "--jobs", jobs,
                env=osmosis_env(OPENAI_API_KEY="sk-jobs-0123456789"),
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            runs.append(read_results(out))
    assert_same_run(*runs)
    summary2 = runs[1][1]
    assert summary2["passed"] == 6
    chats = [r for r in stub.requests if r.path.endswith("/chat/completions")]
    assert len(chats) == 24
    assert {r.headers.get("authorization") for r in chats} == {"Bearer sk-jobs-0123456789"}


# -- nothing lost, nothing left --------------------------------------------------------------------


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_a_worker_killed_mid_run_turns_its_rows_into_errors_and_the_run_finishes(
    tmp_path: Path, start: str
) -> None:
    """kill -9 of one worker: its unfinished rows are ERROR rows naming it, the other worker runs
    the rest, every row is in the results, exit 1, and no process is left. Both ways workers
    start: from a forkserver (Linux, macOS) and spawned (Windows)."""
    rows = [{"user_prompt": f"row {i}", "ground_truth": "HELLO"} for i in range(1, 13)]
    rows[3] = {"user_prompt": "die", "ground_truth": "HELLO"}
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    out, pids = tmp_path / "out.jsonl", tmp_path / "pids"
    done = run_osmosis(
        f"{AGENTS}:DyingAgent", "-d", str(dataset), "-o", str(out), "--jobs", "2",
        "--concurrency", "2", env=osmosis_env(pids, _OSMOSIS_JOBS_START=start),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    results, summary = read_results(out)
    assert [r["row"] for r in results] == list(range(1, 13))
    lost = [r for r in results if not r["passed"]]
    reason = re.compile(r"worker process \d \(pid \d+\) killed by SIGKILL before this row finished")
    assert 4 in [r["row"] for r in lost]
    assert all(r["status"] == "ERROR" and reason.fullmatch(r["error_message"]) for r in lost)
    assert len(lost) <= 4  # in flight (2) and handed out (<= 2): the rest ran on the other worker
    assert summary["errors"] == len(lost)
    assert summary["passed"] == 12 - len(lost)
    assert re.search(r"Warning: worker process \d \(pid \d+\) killed by SIGKILL", done.stderr)
    assert "Traceback" not in done.stderr
    assert not [pid for pid in worker_pids(pids, 0) if alive(pid)]


def test_what_an_agent_wrote_in_a_worker_to_a_file_it_never_closed_is_kept(tmp_path: Path) -> None:
    """A worker ends without the interpreter's teardown (multiprocessing exits it at once): its
    agent, in a reference cycle, must still be finalized and its open file flushed, as one
    process does at exit."""
    dataset = write_rows(tmp_path / "rows.jsonl", [{"user_prompt": f"row {i}"} for i in range(6)])
    logs = tmp_path / "logs"
    logs.mkdir()
    done = run_osmosis(
        f"{AGENTS}:FileAgent", "-d", str(dataset), "--jobs", "2",
        env=osmosis_env(JOBS_LOG_DIR=str(logs)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sum(log.read_text().count("ran ") for log in logs.iterdir()) == 6


def test_an_agent_that_cannot_import_in_the_workers_fails_every_row_clearly(
    tmp_path: Path,
) -> None:
    """Every worker fails to load the agent: no row is lost silently; each says why; exit 1."""
    dataset = write_rows(tmp_path / "rows.jsonl", WORD_ROWS[:4])
    out = tmp_path / "out.jsonl"
    env = osmosis_env(JOBS_FAIL_IN_WORKER="1")
    done = run_osmosis(
        f"{AGENTS}:WordAgent", "-d", str(dataset), "-o", str(out), "--jobs", "2", env=env
    )
    assert done.returncode == 1, done.stderr
    results, summary = read_results(out)
    assert [r["status"] for r in results] == ["ERROR"] * 4
    assert all(
        "cannot be imported in a worker process" in r["error_message"]
        and r["error_message"].startswith("not run: every worker process died")
        for r in results
    )
    assert summary["stopped_early"].startswith("every worker process died")
    assert summary["errors"] == 4
    assert "Traceback" not in done.stderr


def start_slow_run(
    tmp_path: Path, start: str = "forkserver"
) -> tuple[subprocess.Popen[str], Path, Path]:
    """``--jobs 2`` over two quick rows then slow ones; returns once both workers are busy."""
    rows = [{"user_prompt": f"row {i}"} for i in (1, 2)] + [{"user_prompt": "slow"}] * 6
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    out, pids = tmp_path / "out.jsonl", tmp_path / "pids"
    args = [str(OSMOSIS), "test", f"{AGENTS}:SlowAgent", "-d", str(dataset), "-o", str(out)]
    args += ["--jobs", "2", "--concurrency", "2", "--json"]
    proc = subprocess.Popen(
        args,
        env=osmosis_env(pids, _OSMOSIS_JOBS_START=start),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a signal to the test's group never reaches it
    )
    try:
        wait_for(lambda: len(worker_pids(pids, proc.pid)) == 2, "two workers")
        wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 2, "2 rows done")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc, out, pids


@pytest.mark.parametrize(
    ("signum", "group", "start"),
    [
        pytest.param(signal.SIGINT, False, "forkserver", id="sigint-command"),
        # A terminal's Ctrl-C reaches the whole process group; so may a CI timeout's SIGTERM.
        pytest.param(signal.SIGINT, True, "forkserver", id="sigint-group"),
        pytest.param(signal.SIGTERM, True, "forkserver", id="sigterm-group"),
        pytest.param(signal.SIGINT, True, "spawn", id="sigint-group-spawn"),
    ],
)
def test_ctrl_c_stops_every_worker_and_keeps_the_finished_rows(
    tmp_path: Path, signum: int, group: bool, start: str
) -> None:
    """Ctrl-C or SIGTERM, to the command or its whole process group: exit 130, the finished
    rows and a partial summary in -o and on stdout, like --jobs 1, no traceback from anyone;
    the workers, busy with minute-long rows, are gone at once."""
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    proc, out, pids = start_slow_run(tmp_path, start)
    workers = worker_pids(pids, proc.pid)
    try:
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert not [pid for pid in workers if alive(pid)]
    rows, summary = read_results(out)
    assert [r["row"] for r in rows] == [1, 2]
    assert summary["stopped_early"] == f"interrupted ({name})"
    assert json.loads(stdout)["stopped_early"] == f"interrupted ({name})"
    assert "Traceback" not in stderr
    assert "KeyboardInterrupt" not in stderr


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_workers_exit_on_their_own_when_the_command_is_killed(tmp_path: Path, start: str) -> None:
    """kill -9 of the command itself (nothing can clean up): its workers notice and exit."""
    proc, _, pids = start_slow_run(tmp_path, start)
    workers = worker_pids(pids, proc.pid)
    try:
        proc.kill()
        proc.communicate(timeout=60)
        wait_for(lambda: not [pid for pid in workers if alive(pid)], "workers gone", 30)
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# -- usage -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["WordAgent", "-i"], "--jobs works only in batch mode, not with --interactive"),
        (
            ["--server", "http://127.0.0.1:9000", "-d", "rows.jsonl"],
            "--jobs runs TARGET in worker processes; with --server",
        ),
        (
            ["--launch", "python server.py", "-d", "rows.jsonl"],
            "--jobs runs TARGET in worker processes; with --launch that server runs",
        ),
        (
            ["WordAgent", "-d", "rows.jsonl", "--record", "c.jsonl"],
            "record with --jobs 1, then replay it with --jobs N",
        ),
        (
            [
                "WordAgent",
                "-d",
                "rows.jsonl",
                "--llm-url",
                "http://127.0.0.1:9/v1",
                "--model",
                "m",
                "--token-check",
            ],
            "--token-check runs with --jobs 1 only",
        ),
    ],
)
def test_jobs_is_refused_where_it_cannot_work(args: list[str], message: str) -> None:
    """Exit 2 with one line that names --jobs and what to do instead."""
    args = [f"{AGENTS}:{a}" if a == "WordAgent" else a for a in args]
    result = CliRunner().invoke(app, ["test", *args, "--jobs", "2"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_a_usage_error_found_after_the_workers_started_stops_them(tmp_path: Path) -> None:
    """The workers start before the cassette is read; a bad cassette is still the one-line
    usage error (exit 2) of one process, and the workers it started are gone with it."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    args = [f"{AGENTS}:WordAgent", "--replay", str(bad), "--jobs", "2"]
    done = run_osmosis(*args, env=osmosis_env())
    assert done.returncode == 2, done.stderr
    assert "not an osmosis cassette" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["0", "-1", "many", "²"])
def test_a_jobs_value_that_is_not_a_count_is_a_usage_error(value: str) -> None:
    result = CliRunner().invoke(
        app, ["test", f"{AGENTS}:WordAgent", "-d", "rows.jsonl", f"--jobs={value}"]
    )
    assert result.exit_code == 2, result.output
    assert f"--jobs '{value}': give a number of worker processes (1 or more) or auto" in (
        " ".join(result.output.split())
    )


# -- what travels between processes ----------------------------------------------------------------


def test_every_field_of_a_row_result_survives_the_trip_from_a_worker() -> None:
    """Results come back pickled: every field (findings with details, messages, metrics, the
    row's metadata, the trace path) arrives equal, and so does the results-file row."""
    result = RowResult(
        index=7,
        rollout_id="row-7-abc",
        status="COMPLETED",
        finish_reason="stop",
        error_message="none really",
        reward=0.5,
        turns=2,
        tool_calls=3,
        prompt_tokens=120,
        response_tokens=40,
        latency_ms=12.5,
        llm_ms=3.25,
        tool_ms=4.5,
        findings=[Finding("replay_diverged", "row 7", "row-7-abc", 2, {"diff": "-a\n+b"})],
        final_messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}],
        metrics={"num_llm_calls": 2, "tool_wall_ms": 4.5},
        turn_finish_reasons=["tool_calls", "stop"],
        metadata={"ground_truth": "42", "nested": {"list": [1, 2.5, None]}},
        trace="/tmp/traces/row-7-abc.jsonl",
        llm_error="context_length",
        tool_counts={"add": [3, 1, 0]},
        tool_calls_from_history=3,
        sample=2,
        extra_fields={"reward_components": {"format": 0.2}, "judge": "v2"},
    )
    defaults = RowResult(index=0, rollout_id="", status="")
    for f in dataclasses.fields(RowResult):  # the example sets every field, new ones included
        assert getattr(result, f.name) != getattr(defaults, f.name), f.name
    arrived = pickle.loads(pickle.dumps(result))
    assert arrived == result
    assert arrived.as_dict() == result.as_dict()


def test_each_worker_row_keeps_every_run_option_but_concurrency() -> None:
    """A worker runs each row with the batch's options, concurrency 1: every field, including
    ones a subclass or a later version adds (a field-by-field copy dropped those)."""
    from osmosis_rollout.evaluation.runner import RunOptions
    from osmosis_rollout.evaluation.worker import one_row_at_a_time

    @dataclasses.dataclass(frozen=True)
    class MoreOptions(RunOptions):
        samples: int = 1

    options = MoreOptions(
        max_turns=3,
        max_tokens_total=99,
        completion_params={"temperature": 0.5},
        timeout_s=7.0,
        concurrency=16,
        samples=4,
    )
    single = one_row_at_a_time(options)
    assert isinstance(single, MoreOptions)
    assert single.concurrency == 1
    for field in dataclasses.fields(options):
        if field.name != "concurrency":
            assert getattr(single, field.name) == getattr(options, field.name), field.name


PARENT_NOTING_AGENT = '''
import os
from pathlib import Path

from osmosis_rollout import RolloutAgentLoop


class ParentNoting(RolloutAgentLoop):
    """Notes which process started the one it runs in: ``$PARENTS/<pid>`` holds the parent's."""

    name = "parent_noting"

    def __init__(self):
        Path(os.environ["PARENTS"], str(os.getpid())).write_text(str(os.getppid()))

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        return ctx.complete([*messages, result.message], reward=1.0)
'''

TWO_RUNS = """
import asyncio, json, os, sys
from osmosis_rollout.evaluation import TestOptions, run_test

options = TestOptions(target=sys.argv[1], dataset=sys.argv[2], jobs=2, concurrency=2)
for _ in range(2):
    report = asyncio.run(run_test(options))
    assert report.summary["rows"] == 4, report.summary
print(os.getpid())
"""


def test_pools_in_one_process_fork_from_one_forkserver_that_ends_with_it(tmp_path: Path) -> None:
    """Two ``--jobs 2`` runs in one process (``run_test`` twice): every worker of both is
    forked by the same forkserver, which multiprocessing keeps for the process's life (no pool
    stops it through multiprocessing's private state), and which is gone once the process is."""
    agent = tmp_path / "agent.py"
    agent.write_text(PARENT_NOTING_AGENT)
    dataset = write_rows(tmp_path / "rows.jsonl", [{"user_prompt": f"row {i}"} for i in range(4)])
    parents = tmp_path / "parents"
    parents.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", TWO_RUNS, f"{agent}:ParentNoting", str(dataset)],
        env=osmosis_env(PARENTS=str(parents)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    command = int(done.stdout.split()[-1])
    workers = {int(p.name): int(p.read_text()) for p in parents.iterdir()}
    workers.pop(command)  # the command loads the agent too
    assert len(workers) == 4  # two workers in each of the two runs
    (forkserver,) = set(workers.values())
    assert forkserver != command
    wait_for(lambda: not alive(forkserver), "the forkserver ends with its process", 10)


# -- --jobs auto: as many workers as can help ------------------------------------------------------


@pytest.mark.parametrize(
    ("cpus", "load", "rows", "machine_cpus", "count", "reason"),
    [
        # The machine: two CPUs, other work running; two workers were slower than one.
        (2, 1.2, None, None, 1, "0.8 of 2 CPUs free at load 1.2"),
        (2, 0.6, 10_000, None, 1, "1.4 of 2 CPUs free at load 0.6"),
        (2, 0.4, None, None, 2, "1.6 of 2 CPUs free"),
        (2, 0.0, None, None, 2, "2.0 of 2 CPUs free"),
        (2, None, None, None, 2, "2.0 of 2 CPUs free"),  # no load average: taken as idle
        (8, 2.0, None, None, 6, "6.0 of 8 CPUs free"),
        (4, 10.0, None, None, 1, "0.0 of 4 CPUs free at load 10.0"),  # more load than CPUs
        (1, 0.0, None, None, 1, "1 CPU"),
        # Two CPUs of an eight-CPU machine: the load is spread over all eight.
        (2, 4.0, None, 8, 1, "1.0 of 2 CPUs free at load 4.0"),
        (2, 2.0, None, 8, 2, "1.5 of 2 CPUs free"),
        # Small runs: a worker's start-up costs about what 200 rows do.
        (8, 0.0, 300, None, 1, "300 rows: workers pay off from 400"),
        (8, 0.0, 900, None, 4, "900 rows, 200 or more per worker"),
        (8, 0.0, 5_000, None, 8, "8.0 of 8 CPUs free"),
    ],
)
def test_jobs_auto_chooses_no_more_workers_than_can_help(
    cpus: int,
    load: float | None,
    rows: int | None,
    machine_cpus: int | None,
    count: int,
    reason: str,
) -> None:
    """``--jobs auto`` counts the free CPUs (ours, less the load on them), runs one process below
    1.5 of them or for a small run (issue 30: it chose 2 on two busy CPUs, slower than 1)."""
    from osmosis_rollout.evaluation.cpus import AutoJobs, auto_jobs

    chosen = auto_jobs(cpus, load, rows, machine_cpus=machine_cpus)
    assert chosen == AutoJobs(count, reason)
