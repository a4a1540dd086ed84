"""``osmosis test --launch CMD`` end to end, on a server written with nothing but Starlette
(``tests/assets/foreign/starlette_health.py``): the command line, ``[tool.osmosis] launch``, the
wire asked of ``/health``, and Ctrl-C, which must never leave the launched server running."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from .processes import clean_env, stop_process
from .support import ASSETS

SERVER = ASSETS / "foreign" / "starlette_health.py"
_LAUNCHED = re.compile(r"\(pid (\d+)\)")


def _command(mode: str = "accept") -> str:
    return shlex.join([sys.executable, str(SERVER), mode])


def _rows(tmp_path: Path) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"user_prompt": "hi", "ground_truth": "4"}) + "\n")
    return rows


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text().lower()
    except OSError:
        return False


def _ignore_sigint() -> None:
    """What a shell without job control does to a background job (``cmd &`` in a script)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _osmosis(*args: str, cwd: Path, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "osmosis_rollout", *args],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )


def _launched_pid(proc: subprocess.Popen[str], seen: list[str]) -> int:
    """The launched server's pid, read from the run's opening lines."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        found = _LAUNCHED.search("".join(seen[-3:]))
        if found:
            return int(found.group(1))
    raise AssertionError("no launched pid in:\n" + "".join(seen))


def test_ctrl_c_stops_the_launched_server(tmp_path: Path) -> None:
    proc = _osmosis(
        "test", "--launch", _command(), "-d", str(_rows(tmp_path)), "--protocol", "v2",
        "--timeout", "120", cwd=tmp_path,
    )  # fmt: skip
    try:
        seen: list[str] = []
        pid = _launched_pid(proc, seen)
        assert _alive(pid)
        time.sleep(1.0)  # the rollout is started and waits on a server that never ends it
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        stop_process(proc)  # type: ignore[arg-type]
    assert proc.returncode == 130, "".join(seen) + err
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the launched server outlived osmosis test"


def test_sigterm_in_a_background_job_stops_the_run_and_the_launched_server(
    tmp_path: Path,
) -> None:
    """`osmosis test --launch CMD & ... kill -TERM $!` in a script (SIGINT ignored): exit 130,
    the results file ends with the partial summary, and the launched server is stopped."""
    out = tmp_path / "results.jsonl"
    proc = _osmosis(
        "test", "--launch", _command(), "-d", str(_rows(tmp_path)), "--protocol", "v2",
        "--timeout", "120", "--no-conformance", "-o", str(out), cwd=tmp_path,
        sigint_ignored=True,
    )  # fmt: skip
    try:
        seen: list[str] = []
        pid = _launched_pid(proc, seen)
        time.sleep(1.0)  # the rollout is started and waits on a server that never ends it
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        stop_process(proc)  # type: ignore[arg-type]
    assert proc.returncode == 130, "".join(seen) + err
    last = json.loads(out.read_text().splitlines()[-1])
    assert last["stopped_early"] == "interrupted (SIGTERM)"
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the launched server outlived osmosis test"


def test_tool_osmosis_launch_names_the_server_so_no_flag_is_needed(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f"[project]\nname = 'foreign'\n\n[tool.osmosis]\nlaunch = {json.dumps(_command())}\n"
    )
    sub = tmp_path / "sub"
    sub.mkdir()
    proc = _osmosis("test", "-d", str(_rows(tmp_path)), "--timeout", "1", "--json", cwd=sub)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        stop_process(proc)  # type: ignore[arg-type]
    assert "launched" in err, err
    assert "protocol v2" in err  # asked of /health: {"status": "ok"} is the callback wire
    summary = json.loads(out)
    assert summary["rows"] == 1


def test_launch_and_a_target_together_are_refused(tmp_path: Path) -> None:
    proc = _osmosis(
        "test", "agent.py:Agent", "--launch", _command(), "-d", str(_rows(tmp_path)),
        cwd=tmp_path,
    )  # fmt: skip
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "--launch" in err
    assert "not both" in err


def test_bad_rows_and_a_refused_resume_are_found_before_the_server_starts(
    tmp_path: Path,
) -> None:
    """What needs no server is refused before one is launched (a launch can take minutes):
    a command that cannot even start shows it is never tried."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"user_prompt": "hi"}\n{"user_prompt": \n')
    proc = _osmosis("test", "--launch", "/no/such/server", "-d", str(rows), cwd=tmp_path)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "row 2" in err or "line 2" in err, err
    assert "could not start" not in err
    rows.write_text('{"user_prompt": "hi"}\n')
    out = tmp_path / "results.jsonl"
    summary = {"type": "summary", "fingerprint": {"agent": "x", "rows": "y", "options": "z"}}
    out.write_text(json.dumps(summary) + "\n")
    proc = _osmosis(
        "test", "--launch", "/no/such/server", "-d", str(rows), "-o", str(out), "--resume",
        cwd=tmp_path,
    )  # fmt: skip
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "--resume:" in err
    assert "could not start" not in err


def _failing_run(tmp_path: Path, *flags: str) -> str:
    """The stderr of a run on a server whose grader raises on its one row (a failed row)."""
    proc = _osmosis(
        "test", "--launch", _command("boom"), "-d", str(_rows(tmp_path)), "--protocol", "v2",
        "--no-conformance", *flags, cwd=tmp_path,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        stop_process(proc)  # type: ignore[arg-type]
    assert proc.returncode == 1, err
    return err


def test_verbose_shows_the_launched_servers_output_as_it_comes(tmp_path: Path) -> None:
    """--verbose: every line the launched server prints reaches stderr, marked as its own, so
    its tracebacks are seen (it showed only a row's one-line error)."""
    err = _failing_run(tmp_path, "--verbose")
    assert "server| Traceback (most recent call last):" in err
    assert "server| ValueError: boom in grader" in err
    assert re.search(r"^server\| serving on \d+", err, re.MULTILINE), err
    assert "Rerun with --verbose" not in err


def test_a_failed_launched_run_says_where_the_servers_errors_are(tmp_path: Path) -> None:
    """Without --verbose the server's output stays hidden, and the closing hint says how to
    see it, not how to start `osmosis serve` (the launched server may be anyone's)."""
    err = _failing_run(tmp_path)
    assert "server| " not in err
    assert "boom in grader" not in err
    flat = " ".join(err.split())
    assert "Rerun with --verbose to see the launched server's output (its tracebacks)" in flat
    assert "osmosis serve --debug-dir" not in flat
