"""``osmosis view``: the index over results and traces, its JSON API, and the page in Chromium."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.view import build_index, create_view_app

from .browser import Chromium, find_chromium
from .programs import skip_missing
from .support import serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
MIXED = f"{ROOT}/tests/assets/trajectory_agents.py:MixedAgent"
#: The rows: what each does, and its reward.
KINDS = [("ok", 1.0), ("ok", 0.5), ("error", 0.0), ("rewrite", 1.0), ("ok", 0.25), ("ok", 1.0)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ``osmosis test`` runs of the mixed agent over the same rows, each with its traces."""
    base = tmp_path_factory.mktemp("view-runs")
    dataset = base / "rows.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"user_prompt": f"Add {i} and {i}.", "kind": kind, "reward": reward}) + "\n"
            for i, (kind, reward) in enumerate(KINDS, start=1)
        )
    )
    for run in ("run-a", "run-b"):
        result = CliRunner().invoke(
            app,
            [
                "test",
                MIXED,
                "-d",
                str(dataset),
                "-o",
                str(base / run / "results.jsonl"),
                "--debug-dir",
                str(base / run / "traces"),
                "--seed",
                "1" if run == "run-a" else "2",
            ],
        )
        assert result.exit_code == 1, result.stdout + result.stderr  # the error and the finding
    return base


@pytest.fixture(scope="module")
def gate_run(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same rows through `osmosis test --server URL --debug-dir` over v2: the traces are the
    mock TrainGate's side of each rollout (testing/gate_trace.py)."""
    from osmosis_rollout.server import create_app

    from .support import load_asset

    base = tmp_path_factory.mktemp("view-gate-run")
    agent = load_asset("trajectory_agents").MixedAgent()
    server = create_app(agent, debug_dir=base / "server-traces")  # the server's own traces
    with serve_in_thread(server, lifespan="on") as url:
        result = CliRunner().invoke(
            app,
            [
                "test",
                "--server",
                url,
                "--protocol",
                "v2",
                "-d",
                str(runs / "rows.jsonl"),
                "-o",
                str(base / "results.jsonl"),
                "--debug-dir",
                str(base / "traces"),
            ],
        )
    assert result.exit_code == 1, result.stdout + result.stderr  # the error row
    return base


# -- the index -------------------------------------------------------------------------------


def test_index_reads_summaries_from_results_and_links_traces(runs: Path) -> None:
    """A results file gives one summary per row, each linked to its trace; the trace folder
    given too adds nothing twice."""
    index = build_index([runs / "run-a" / "results.jsonl", runs / "run-a" / "traces"])
    assert [r.row for r in index.rollouts] == [1, 2, 3, 4, 5, 6]
    assert [r.status for r in index.rollouts] == ["COMPLETED"] * 2 + ["ERROR"] + ["COMPLETED"] * 3
    assert [r.reward for r in index.rollouts] == [1.0, 0.5, None, 1.0, 0.25, 1.0]
    assert index.rollouts[3].findings == ["history_rewritten"]
    assert all(r.trace_path is not None and Path(r.trace_path).is_file() for r in index.rollouts)
    assert index.warnings == []
    full = index.load(index.rollouts[0])
    assert full["row"]["final_messages"][0]["role"] == "user"
    assert full["trajectory"]["turns"][0]["tool_calls"][0]["tool"] == "add"
    assert full["messages"] == full["row"]["final_messages"]


def test_index_of_traces_alone_summarises_each_from_its_end(runs: Path) -> None:
    """Without a results file, each trace's first line and rollout_end give its summary."""
    from_results = build_index([runs / "run-a" / "results.jsonl"])
    from_traces = build_index([runs / "run-a" / "traces"])
    by_id = {r.rollout_id: r for r in from_traces.rollouts}
    assert set(by_id) == {r.rollout_id for r in from_results.rollouts}
    for expected in from_results.rollouts:
        got = by_id[expected.rollout_id]
        assert (got.row, got.status, got.reward, got.findings, got.turns, got.tool_calls) == (
            expected.row,
            expected.status,
            expected.reward,
            expected.findings,
            expected.turns,
            expected.tool_calls,
        )


def test_index_survives_broken_lines_and_rejects_missing_paths(tmp_path: Path, runs: Path) -> None:
    """Lines that are not JSON are skipped with a warning; a missing path is a clear error."""
    results = tmp_path / "results.jsonl"
    lines = (runs / "run-a" / "results.jsonl").read_text().splitlines()
    results.write_text("\n".join([lines[0], "{not json", lines[1][:40], *lines[2:]]) + "\n")
    index = build_index([results])
    assert len(index.rollouts) == 5
    assert index.warnings == ["results.jsonl: 2 line(s) are not JSON and were skipped"]
    with pytest.raises(ConfigError, match=r"nothing\.jsonl does not exist"):
        build_index([tmp_path / "nothing.jsonl"])


def test_results_of_a_server_run_join_the_servers_traces_by_rollout_id(
    tmp_path: Path, runs: Path
) -> None:
    """An `osmosis test --server` results file names no traces (the server wrote them with its
    own --debug-dir); given with that folder, a row and its trace are one rollout, not two, and
    a trace with no row stays a rollout of its own."""
    results = tmp_path / "results.jsonl"
    with results.open("w") as out:
        for line in (runs / "run-a" / "results.jsonl").read_text().splitlines():
            record = json.loads(line)
            record.pop("trace", None)
            out.write(json.dumps(record) + "\n")
    traces = tmp_path / "server-traces"
    shutil.copytree(runs / "run-a" / "traces", traces)
    extra = {"v": 2, "ts": 1.0, "event": "rollout_start", "rollout_id": "row-9-extra"}
    (traces / "extra.jsonl").write_text(json.dumps(extra) + "\n")
    assert all(r.trace_path is None for r in build_index([results]).rollouts)

    index = build_index([results, traces])
    assert len(index.rollouts) == 7
    joined, alone = index.rollouts[:6], index.rollouts[6]
    assert [r.row for r in joined] == [1, 2, 3, 4, 5, 6]
    for summary in joined:
        assert summary.source == str(results)
        assert summary.trace_path is not None
        assert Path(summary.trace_path).parent == traces.resolve()
        assert summary.public()["has_trace"] is True
        assert summary.started is not None
        full = index.load(summary)
        assert full["row"]["rollout_id"] == summary.rollout_id
        assert full["trajectory"]["rollout_id"] == summary.rollout_id
    assert (alone.rollout_id, alone.source, alone.status) == ("row-9-extra", str(traces), "RUNNING")


def test_a_server_runs_traces_of_the_mocks_side_pair_with_its_rows(gate_run: Path) -> None:
    """`osmosis test --server --debug-dir`: each results row links the mock's trace of it, which
    reads as a trace of its own (marked as the TrainGate's side, its wire calls kept as events);
    the folder alone gives the same summaries, and the two given together are one rollout each."""
    results, traces = gate_run / "results.jsonl", gate_run / "traces"
    index = build_index([results])
    assert [r.row for r in index.rollouts] == [1, 2, 3, 4, 5, 6]
    for summary in index.rollouts:
        assert summary.trace_path is not None
        assert Path(summary.trace_path).parent == traces.resolve()
        assert summary.public()["has_trace"] is True
        full = index.load(summary)
        trajectory = full["trajectory"]
        assert trajectory["start"]["side"] == "traingate"
        assert len(trajectory["turns"]) == summary.turns > 0
        assert all(t["tools"] == ["add"] for t in trajectory["turns"])
        assert full["messages"] == full["row"]["final_messages"]
        assert [e["event"] for e in trajectory["events"]] == ["start"]  # before the first turn
        last = [e["event"] for e in trajectory["turns"][-1]["events"]]
        assert last[:2] == ["callback", "callback"]
        assert last[-1] == "status"
    alone = {r.rollout_id: r for r in build_index([traces]).rollouts}
    for expected in index.rollouts:
        got = alone[expected.rollout_id]
        assert (got.row, got.status, got.reward, got.turns, got.prompt_tokens) == (
            expected.row,
            expected.status,
            expected.reward,
            expected.turns,
            expected.prompt_tokens,
        )
    both = build_index([results, traces])
    assert [r.source for r in both.rollouts] == [str(results)] * 6
    # the server's own traces too: listed from their folder beside the rows, one per rollout,
    # so each row's "compare with" (its row's other rollouts) is its server-side trace
    server = gate_run / "server-traces"
    sides = build_index([results, server])
    assert [r.source for r in sides.rollouts] == [str(results)] * 6 + [str(server)] * 6
    for row, other in zip(sides.rollouts[:6], sides.rollouts[6:], strict=True):
        assert (other.rollout_id, other.row) == (row.rollout_id, row.row)
        assert sides.load(row)["trajectory"]["start"]["side"] == "traingate"
        assert "side" not in sides.load(other)["trajectory"]["start"]


def test_two_results_files_label_each_rollout_by_its_path(runs: Path) -> None:
    """Two runs both named results.jsonl are told apart by the path given, in the summaries
    and in the JSON the page fetches."""
    a, b = runs / "run-a" / "results.jsonl", runs / "run-b" / "results.jsonl"
    index = build_index([a, b])
    assert index.sources == [str(a), str(b)]
    assert [r.source for r in index.rollouts] == [str(a)] * 6 + [str(b)] * 6
    assert [r.public()["source"] for r in index.rollouts] == [str(a)] * 6 + [str(b)] * 6


def test_cli_names_a_missing_path_without_a_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["view", str(tmp_path / "gone.jsonl")])
    assert result.exit_code == 2
    assert "gone.jsonl does not exist" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.anyio
async def test_api_lists_rollouts_and_answers_404_for_unknown_ones(runs: Path) -> None:
    index = build_index([runs / "run-a" / "results.jsonl"])
    transport = httpx2.ASGITransport(app=create_view_app(index))
    async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        listing = (await http.get("/api/rollouts")).json()
        assert len(listing["rollouts"]) == 6
        assert "results_path" not in listing["rollouts"][0]  # no file paths in the table
        missing = await http.get("/api/rollouts/nope")
        assert missing.status_code == 404
        assert missing.json() == {"detail": "no such rollout in this index"}
        page = await http.get("/")
        assert page.status_code == 200
        assert "/static/view.js" in page.text
        for asset in ("/static/view.js", "/static/view.css"):
            assert (await http.get(asset)).status_code == 200
        # offline: nothing is loaded from another origin
        assert "http" not in page.text.replace("http-equiv", "")


# -- the page in a real browser --------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    executable = find_chromium()
    if executable is None:
        skip_missing("chromium")
        raise AssertionError("unreachable")
    with Chromium(executable, tmp_path_factory.mktemp("chromium-profile")) as chromium:
        yield chromium


def screenshots_dir(tmp_path: Path) -> Path:
    """docs/img when OSMOSIS_SCREENSHOTS=1 (CI keeps them for the README), else a temp dir."""
    return ROOT / "docs" / "img" if os.environ.get("OSMOSIS_SCREENSHOTS") == "1" else tmp_path


def change(browser: Chromium, element: str, value: str) -> None:
    """Set a filter control the way a user does, and wait until the table is redrawn."""
    browser.evaluate(
        "(() => { document.body.dataset.ready = '';"
        f" const e = document.getElementById({json.dumps(element)});"
        f" e.value = {json.dumps(value)};"
        " e.dispatchEvent(new Event('change')); })()"
    )
    browser.wait_for("document.body.dataset.ready === '1'")


def table(browser: Chromium) -> list[dict[str, Any]]:
    return list(
        browser.evaluate(
            "[...document.querySelectorAll('#rollouts tbody tr')].map(tr => ({"
            " id: tr.dataset.id, status: tr.dataset.status,"
            " cells: [...tr.children].map(td => td.textContent.trim()) }))"
        )
    )


def test_viewer_in_chromium(runs: Path, browser: Chromium, tmp_path: Path) -> None:
    """The list loads, the filters work, a transcript shows its tool calls, and two runs of a
    row sit side by side; a screenshot of each view is saved."""
    shots = screenshots_dir(tmp_path)
    index = build_index([runs / "run-a" / "results.jsonl", runs / "run-b" / "results.jsonl"])
    with serve_in_thread(create_view_app(index)) as url:
        browser.open(url + "/")
        rows = table(browser)
        assert len(rows) == 12
        assert browser.evaluate("document.getElementById('count').textContent").startswith(
            "12 of 12"
        )
        heads = browser.evaluate(
            "[...document.querySelectorAll('#rollouts th')].map(h => h.textContent)"
        )
        assert heads[-1] == "source"  # two runs: each row names its results file
        assert (
            sorted(r["cells"][-1] for r in rows)
            == ["run-a/results.jsonl"] * 6 + ["run-b/results.jsonl"] * 6
        )
        browser.screenshot(shots / "view-list.png")

        change(browser, "f-status", "ERROR")
        assert [r["status"] for r in table(browser)] == ["ERROR", "ERROR"]
        change(browser, "f-status", "")
        change(browser, "f-finding", "history_rewritten")
        assert [r["cells"][0] for r in table(browser)] == ["4", "4"]
        change(browser, "f-finding", "")
        change(browser, "f-rmin", "0.3")
        change(browser, "f-rmax", "0.9")
        assert [r["cells"][3] for r in table(browser)] == ["0.5", "0.5"]
        change(browser, "f-rmin", "")
        change(browser, "f-rmax", "")
        change(browser, "f-sort", "tokens")
        change(browser, "f-dir", "desc")
        tokens = [int(r["cells"][6]) for r in table(browser)]
        assert tokens == sorted(tokens, reverse=True)
        assert "sort=tokens" in browser.evaluate("location.hash")  # the view is a shareable URL

        first = index.rollouts[0]
        browser.go(f"#/rollout/{first.id}")
        calls = browser.evaluate(
            "[...document.querySelectorAll('.turn details.tool-call')].map(d => ({"
            " open: d.open, name: d.querySelector('.tool-name').textContent,"
            " args: d.querySelector('.arguments').textContent,"
            " result: d.querySelector('.tool-result pre')?.textContent }))"
        )
        trajectory = index.load(first)["trajectory"]
        traced = [c for t in trajectory["turns"] for c in t["tool_calls"]]
        assert len(calls) == len(traced) > 0
        for shown, call in zip(calls, traced, strict=True):
            assert shown["open"] is True
            assert shown["name"] == call["tool"] == "add"
            assert json.loads(shown["args"]) == json.loads(call["arguments"])
            assert shown["result"] == call["result"]
        turns = browser.evaluate("document.querySelectorAll('.timeline .tl-row .bar.llm').length")
        assert turns == first.turns
        browser.screenshot(shots / "view-rollout.png")

        rewritten = next(r for r in index.rollouts if r.findings)
        browser.go(f"#/rollout/{rewritten.id}")
        marked = browser.evaluate(
            "[...document.querySelectorAll('.turn .finding')].map(b =>"
            " [b.closest('.turn').dataset.turn, b.textContent])"
        )
        assert marked == [["2", "history_rewritten"]]

        other = next(r for r in index.rollouts if r.row == first.row and r.id != first.id)
        browser.go(f"#/rollout/{first.id}")
        assert browser.evaluate("document.querySelectorAll('.compare-link').length") == 1
        browser.evaluate(
            "document.body.dataset.ready = ''; document.querySelector('.compare-link').click()"
        )
        browser.wait_for("document.body.dataset.ready === '1'")
        sides = browser.evaluate(
            "[...document.querySelectorAll('.compare .transcript')].map(t => t.dataset.id)"
        )
        assert sides == [first.id, other.id]
        browser.screenshot(shots / "view-compare.png")
    for name in ("view-list.png", "view-rollout.png", "view-compare.png"):
        assert (shots / name).read_bytes().startswith(b"\x89PNG")


def test_a_trace_of_the_mocks_side_in_chromium(
    gate_run: Path, browser: Chromium, tmp_path: Path
) -> None:
    """A rollout of a --server run shows what crossed the wire, said to be seen from the mock
    TrainGate: the start before the first turn, each turn with the tools it was sent and its
    bar on the timeline, the callbacks and status answer after the last, each opening to its
    body."""
    index = build_index([gate_run / "results.jsonl"])
    first = index.rollouts[0]
    with serve_in_thread(create_view_app(index)) as url:
        browser.open(url + "/")
        assert len(table(browser)) == 6
        browser.go(f"#/rollout/{first.id}")
        note = browser.evaluate("document.querySelector('.side-note')?.textContent || ''")
        assert note.startswith("Seen from the mock TrainGate")
        assert "protocol v2" in note
        wire = browser.evaluate(
            "[...document.querySelectorAll('details.event.wire')].map(d => ({ event:"
            " d.dataset.event, label: d.querySelector('summary').textContent.trim(),"
            " turn: d.closest('.turn').dataset.turn || null,"
            " body: d.querySelector('pre').textContent }))"
        )
        assert wire[0]["label"].split()[:4] == ["start", "POST", "/rollout", "→"]
        assert wire[0]["turn"] is None  # before the first turn
        assert json.loads(wire[0]["body"])["answer"]["rollout_id"] == first.rollout_id
        after = [w for w in wire if w["turn"] == str(first.turns)]
        assert [w["label"].split()[:2] for w in after[:2]] == [
            ["completion", "callback"],
            ["grader", "callback"],
        ]
        status = f"/rollout/{first.rollout_id}/status"
        assert after[-1]["label"].split()[:5] == ["status", "GET", status, "→", "200"]
        heads = browser.evaluate(
            "[...document.querySelectorAll('.turn[data-turn] h3')].map(h => h.textContent)"
        )
        assert len(heads) == first.turns
        assert all("tools: add" in head for head in heads)
        bars = browser.evaluate("document.querySelectorAll('.timeline .tl-row .bar.llm').length")
        assert bars == first.turns
        browser.screenshot(screenshots_dir(tmp_path) / "view-gate-trace.png")


def test_chromium_is_found_where_ci_installs_it() -> None:
    """CI installs Debian's chromium; when it is there the browser tests must not skip."""
    if shutil.which("chromium") is None:
        pytest.skip("not on a machine with the Debian chromium package")
    assert find_chromium() is not None


def test_trace_summaries_find_long_and_missing_ends(tmp_path: Path) -> None:
    """A rollout_end line longer than the first chunk read from the end is still found (with the
    findings after it); a trace without one is a rollout still running."""
    big = [{"role": "tool", "tool_call_id": "c", "content": "y" * 100_000}]
    records = [
        {"v": 2, "ts": 1.0, "event": "rollout_start", "rollout_id": "row-7-abc"},
        {"v": 2, "ts": 2.0, "event": "turn", "rollout_id": "row-7-abc", "turn": 1},
        {
            "v": 2,
            "ts": 3.0,
            "event": "rollout_end",
            "rollout_id": "row-7-abc",
            "status": "COMPLETED",
            "reward": 0.75,
            "metrics": {"num_llm_calls": 1, "prompt_tokens": 5, "response_tokens": 6},
            "final_from": 0,
            "final_messages": big,
        },
        {"v": 2, "event": "findings", "rollout_id": "row-7-abc", "findings": [{"code": "x"}]},
    ]
    (tmp_path / "done.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "running.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    done, running = build_index([tmp_path]).rollouts
    assert (done.row, done.status, done.reward, done.findings, done.turns) == (
        7,
        "COMPLETED",
        0.75,
        ["x"],
        1,
    )
    assert done.prompt_tokens + done.response_tokens == 11
    assert (running.status, running.reward) == ("RUNNING", None)


def test_osmosis_view_prints_its_url_and_serves_on_loopback(tmp_path: Path, runs: Path) -> None:
    """The command as a user runs it: one URL on stdout, 127.0.0.1 only, the table behind it."""
    import subprocess
    import sys
    import urllib.request

    osmosis = Path(sys.executable).with_name("osmosis")
    proc = subprocess.Popen(
        [str(osmosis), "view", str(runs / "run-a" / "results.jsonl"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "api/rollouts", timeout=30) as response:
            listing = json.load(response)
        assert len(listing["rollouts"]) == 6
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "6 rollout(s) indexed" in err
    assert "Traceback" not in err


def test_index_of_a_crafted_file_shows_no_string_as_a_number(tmp_path: Path) -> None:
    """Strings, booleans, NaN and negatives where a results file or a trace has numbers are
    indexed (no traceback): a reward that is not a finite number is none, a count is 0."""
    markup = "<img src=x onerror=alert(1)>"
    row = {"type": "row", "row": 1, "rollout_id": "row-1-x", "status": "COMPLETED"}
    row |= {"reward": markup, "turns": markup, "tool_calls": True, "prompt_tokens": -5}
    row |= {"response_tokens": 2.0, "latency_ms": markup}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    start = {"v": 2, "ts": markup, "event": "rollout_start", "rollout_id": "row-2-y"}
    end = {"v": 2, "ts": 2.0, "event": "rollout_end", "rollout_id": "row-2-y", "reward": "NaN"}
    end["metrics"] = {"num_llm_calls": markup, "total_latency_ms": float("inf")}
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "y.jsonl").write_text(json.dumps(start) + "\n" + json.dumps(end) + "\n")
    from_row, from_trace = build_index([tmp_path / "results.jsonl", tmp_path / "traces"]).rollouts
    assert (from_row.reward, from_row.turns, from_row.tool_calls) == (None, 0, 0)
    assert (from_row.prompt_tokens, from_row.response_tokens, from_row.latency_ms) == (0, 2, 0.0)
    assert (from_trace.reward, from_trace.turns, from_trace.latency_ms) == (None, 0, 0.0)
    assert from_trace.started is None


# -- groups, tool errors and reward components ------------------------------------------------


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--samples 3`` runs: the SQLite agent (every tool call fails) and one whose reward has
    named parts."""
    base = tmp_path_factory.mktemp("view-samples")
    dataset = base / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"user_prompt": f"q{i}", "even": i % 2 == 0}) + "\n"
                               for i in range(2)))  # fmt: skip
    for name, target in (
        ("sqlite", f"{ROOT}/tests/assets/sqlite_agent.py:SqliteAgent"),
        ("parts", f"{ROOT}/tests/assets/component_agents.py:PartsAgent"),
    ):
        result = CliRunner().invoke(
            app, ["test", target, "-d", str(dataset), "--samples", "3", "-o",
                  str(base / name / "results.jsonl")],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    return base


def test_index_summaries_carry_sample_tool_errors_and_reward_parts(sampled: Path) -> None:
    index = build_index([sampled / "sqlite" / "results.jsonl", sampled / "parts" / "results.jsonl"])
    sqlite, parts = index.rollouts[:6], index.rollouts[6:]
    assert [(r.row, r.sample) for r in sqlite] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert all(r.tool_errors == r.tool_calls > 0 for r in sqlite)
    assert parts[0].reward_components == {"format": 0.2, "correctness": 1.0}
    public = parts[0].public()
    assert public["sample"] == 0
    assert public["reward_components"] == {"format": 0.2, "correctness": 1.0}


def test_viewer_shows_a_groups_samples_and_tool_errors(sampled: Path, browser: Chromium) -> None:
    """The list has a sample column and each row's failed tool calls; a rollout shows its
    group's samples side by side with their rewards, and its reward parts."""
    index = build_index([sampled / "sqlite" / "results.jsonl", sampled / "parts" / "results.jsonl"])
    with serve_in_thread(create_view_app(index)) as url:
        browser.open(url + "/")
        heads = browser.evaluate(
            "[...document.querySelectorAll('#rollouts th')].map(h => h.textContent)"
        )
        assert heads[:3] == ["row", "sample", "rollout"]
        rows = table(browser)
        assert [r["cells"][1] for r in rows[:3]] == ["0", "1", "2"]
        assert rows[0]["cells"][heads.index("tools")].endswith("err)")
        shown = index.rollouts[7]  # parts, row 1, sample 1
        browser.go(f"#/rollout/{shown.id}")
        group = browser.evaluate(
            "[...document.querySelectorAll('.group a')].map(a => a.textContent)"
        )
        assert group == ["0: 1", "1: 1", "2: 1"]
        facts = browser.evaluate("document.querySelector('.facts').textContent")
        assert "format 0.2, correctness 1" in " ".join(facts.split())


def test_items_without_a_role_show_by_their_type_in_chromium(
    tmp_path: Path, browser: Chromium
) -> None:
    """A foreign server's final messages may hold Responses API items (osmosis-ai's
    openai-agents sample keeps ``function_call`` / ``function_call_output``): the transcript
    shows each by its type with its call or output (they were empty ``?`` messages), escaped."""
    markup = "<img src=x onerror=alert(1)>"
    row = {"type": "row", "row": 1, "rollout_id": "row-1-items", "status": "COMPLETED"}
    row["final_messages"] = [
        {"role": "user", "content": "What is 6*7?"},
        {"type": "function_call", "name": "multiply", "arguments": '{"a": 6, "b": 7}'},
        {"type": "function_call_output", "call_id": "c1", "output": f"42 {markup}"},
    ]
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    index = build_index([tmp_path / "results.jsonl"])
    with serve_in_thread(create_view_app(index)) as url:
        browser.open(url + "/")
        browser.go(f"#/rollout/{index.rollouts[0].id}")
        shown = browser.evaluate(
            "[...document.querySelectorAll('.msg')].map(m => [...m.children].map(c => "
            "c.textContent.trim()).join(' '))"
        )
        images = browser.evaluate("document.querySelectorAll('.msg img').length")
    text = " | ".join(shown)
    assert 'function_call multiply({"a": 6, "b": 7})' in text, text
    assert f"function_call_output 42 {markup}" in text, text
    assert images == 0
