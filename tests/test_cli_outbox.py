"""``osmosis outbox list|replay`` on both backends: the files of one server, the Redis stream."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.server.state import open_state

from .gates import CallbackGate
from .outbox_entries import undelivered
from .support import free_port, serve_in_thread
from .v2_gate import CONTROLLER_KEY, V2Gate

runner = CliRunner()


@pytest.fixture(params=["memory", "redis"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """The command-line options that name one backend's outbox."""
    if request.param == "memory":
        return ["--outbox-dir", str(tmp_path / "outbox")]
    return ["--state", str(request.getfixturevalue("redis_url"))]


def keep(options: list[str], *entries: Any) -> None:
    """Put ``entries`` in the outbox that ``options`` name, as a server would."""
    url = options[1] if options[0] == "--state" else "memory"
    outbox = Path(options[1]) if options[0] == "--outbox-dir" else Path("unused")

    async def put() -> None:
        state = open_state(url, outbox_dir=outbox)
        try:
            for entry in entries:
                await state.outbox_put(entry)
        finally:
            await state.close()

    anyio.run(put)


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": "80"})


@pytest.fixture
def clean_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in an empty folder: no pyproject.toml settings, no stray .osmosis/outbox."""
    monkeypatch.chdir(tmp_path)
    for name in ("OSMOSIS_STATE", "OSMOSIS_OUTBOX_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("clean_cwd")
def test_list_shows_each_entry_without_the_key(where: list[str]) -> None:
    """A table (or JSON lines) of the kept callbacks, oldest first; the key never shows."""
    keep(where, undelivered("r-1"), undelivered("r-2"))
    table = invoke("outbox", "list", *where)
    lines = invoke("outbox", "list", *where, "--json")

    assert table.exit_code == 0, table.output
    assert "r-1" in table.stdout
    assert "2 undelivered callback(s)" in table.stderr
    rows = [json.loads(line) for line in lines.stdout.splitlines()]
    assert [row["rollout_id"] for row in rows] == ["r-1", "r-2"]
    assert "tg-secret" not in table.output + lines.output


REFUSED = (
    "could not reach http://127.0.0.1:9/tg/v1/rollout/completed after 4 attempt(s): "
    "ConnectError: [Errno 111] Connect call failed ('127.0.0.1', 9): Connection refused"
)


def refused(rollout_id: str) -> Any:
    """An entry as a server keeps it when TrainGate was down through all its retries."""
    entry = undelivered(rollout_id)
    entry.error = REFUSED
    return entry


@pytest.mark.usefixtures("clean_cwd")
def test_list_is_one_line_per_entry_at_80_columns(where: list[str]) -> None:
    """Id, rollout id, age, tries and the error's start, one line each within 80 columns; the
    tries agree with the error's "after 4 attempt(s)" (not "attempts 0"), and the error is
    cut with an ellipsis, not in the middle of "[Errno 111]" with nothing to say so."""
    keep(where, refused("r-1"), refused("0b5e2c1a-94f1-4d53-9a51-3c6f2b8e7d10"))
    listed = invoke("outbox", "list", *where)
    ids = [
        json.loads(line)["id"]
        for line in invoke("outbox", "list", *where, "--json").stdout.splitlines()
    ]

    assert listed.exit_code == 0, listed.output
    header, *entries = listed.stdout.splitlines()
    assert header.split() == ["ID", "ROLLOUT", "AGE", "TRAINGATE", "TRIES", "ERROR"]
    assert len(entries) == 2
    for line, entry_id in zip(entries, ids, strict=True):
        assert len(line) <= 80, line
        # A file's id is shown without its rollout id and .json; show and replay take it.
        shown = entry_id if where[0] == "--state" else ".".join(entry_id.split(".")[-3:-1])
        assert line.startswith(shown + "  ")
        assert line.endswith("…")
        assert "  0s   127.0.0.1:9  " in line  # where replay would send it
        # The TRAINGATE column leaves the error less room at 80 columns: it is cut between
        # words, with the ellipsis saying so.
        assert "  4      ConnectError: " in line
        assert line.endswith(" …")
    assert "r-1" in entries[0]
    assert "0b5e2c1a-94f1…" in entries[1]
    short = entries[1].split()[0]
    assert "0b5e2c1a-94f1-4d53-9a51-3c6f2b8e7d10" in invoke("outbox", "show", *where, short).stdout


@pytest.mark.usefixtures("clean_cwd")
def test_list_names_the_store_the_entries_are_in(where: list[str], tmp_path: Path) -> None:
    """Files on disk are the file outbox in their folder, not "memory"; Redis is its stream."""
    empty = invoke("outbox", "list", *where)
    keep(where, undelivered("r-1"))
    listed = invoke("outbox", "list", *where)

    if where[0] == "--outbox-dir":
        store = f"the file outbox in {tmp_path / 'outbox'}"
    else:
        store = f"the Redis stream osmosis:outbox at {where[1]}"
    assert "memory" not in empty.stderr + listed.stderr
    assert f"The {store.removeprefix('the ')} is empty." in " ".join(empty.stderr.split())
    assert (
        f"1 undelivered callback(s) in {store}; the whole of one with osmosis outbox show ID"
        in (" ".join(listed.stderr.split()))
    )


def _clockless(text: str) -> str:
    """``text`` with its relative times ("12 s ago", "in 3 s") written as N."""
    return re.sub(r"\b\d+ s\b", "N s", text)


@pytest.mark.usefixtures("clean_cwd")
def test_show_gives_an_entry_whole(where: list[str]) -> None:
    """Every field and the entire error, by entry id or rollout id; an unknown id exits 2."""
    keep(where, refused("r-1"))
    [row] = [
        json.loads(line) for line in invoke("outbox", "list", *where, "--json").stdout.splitlines()
    ]
    by_id = invoke("outbox", "show", *where, row["id"])
    by_rollout = invoke("outbox", "show", *where, "r-1")
    as_json = invoke("outbox", "show", *where, "r-1", "--json")
    missing = invoke("outbox", "show", *where, "r-9")

    assert by_id.exit_code == 0, by_id.output
    # The same entry both ways; "(N s ago)" and "in N s" are read from the clock at each call,
    # so two calls under load may straddle a second.
    assert _clockless(by_id.stdout) == _clockless(by_rollout.stdout)
    assert f"error:     {REFUSED}\n" in by_id.stdout
    assert "result:    ERROR/error\n" in by_id.stdout
    assert "tries:     4 (4 POST(s) by the server, none since)\n" in by_id.stdout
    if where[0] == "--outbox-dir":  # files wait for a replay; a replica retries the stream
        assert "next try:  on replay (osmosis outbox replay)\n" in by_id.stdout
    else:
        assert re.search(r"next try:  in \d+ s, by a replica\n", by_id.stdout)
    assert "tg-secret" not in by_id.output + as_json.output
    assert json.loads(as_json.stdout) == row
    assert missing.exit_code == 2
    assert "has the id or rollout id r-9" in missing.stderr


@pytest.mark.usefixtures("clean_cwd")
def test_replay_delivers_and_removes_and_keeps_what_fails(
    where: list[str], gate: tuple[CallbackGate, str]
) -> None:
    """Deliverable entries reach TrainGate (with the key) and leave the outbox; one whose
    TrainGate is gone stays, its attempt counted, and the command exits 1."""
    recorder, gate_url = gate
    good = undelivered("good")
    good.server_url = gate_url
    gone = undelivered("gone")
    gone.server_url = f"http://127.0.0.1:{free_port()}"
    keep(where, good, gone)

    replayed = invoke(
        "outbox", "replay", *where, "--api-key", "tg-secret", "--traingate", "127.0.0.1", "--json"
    )
    left = [
        json.loads(line) for line in invoke("outbox", "list", *where, "--json").stdout.splitlines()
    ]

    assert replayed.exit_code == 1, replayed.output
    report = json.loads(replayed.stdout)  # --json: the same outcome, for a script
    assert report["version"] == 1
    assert report["delivered"] == ["good"]
    assert [f["rollout_id"] for f in report["failed"]] == ["gone"]
    assert "tg-secret" not in replayed.stdout
    assert "delivered good" in replayed.stderr
    assert "failed    gone: could not reach" in replayed.stderr
    assert "1 delivered, 1 still in the outbox" in replayed.stderr
    [callback] = recorder.callbacks["good"]
    assert callback.body["status"] == "ERROR"
    assert callback.authorization == "Bearer tg-secret"
    assert [row["rollout_id"] for row in left] == ["gone"]
    assert left[0]["attempts"] == 1
    # The replay's own two POSTs plus the server's round: at least 3, never "attempts 1"
    # beside "after 2 attempt(s)".
    shown = invoke("outbox", "show", *where, "gone").stdout
    assert "after 2 attempt(s)" in shown
    assert "tries:     3+ (at least 3: 1 round(s) since the server's, the last with 2 POST(s))" in (
        shown
    )


@pytest.mark.usefixtures("clean_cwd")
def test_replay_takes_the_id_that_list_shows(where: list[str]) -> None:
    """The short id of a file (or a stream entry's id) picks that entry, and only it."""
    gone, other = undelivered("gone"), undelivered("other")
    gone.server_url = other.server_url = f"http://127.0.0.1:{free_port()}"
    keep(where, gone, other)
    _, first, _ = invoke("outbox", "list", *where).stdout.splitlines()
    assert " gone " in first

    replayed = invoke("outbox", "replay", *where, first.split()[0])

    assert replayed.exit_code == 1, replayed.output
    assert "failed    gone: could not reach" in replayed.stderr
    assert "other" not in replayed.stderr
    assert "0 delivered, 1 still in the outbox" in replayed.stderr


@pytest.mark.usefixtures("clean_cwd")
def test_replay_of_chosen_ids_and_an_empty_outbox(where: list[str]) -> None:
    """Ids that match nothing replay nothing; an empty outbox says so; both exit 0."""
    chosen = invoke("outbox", "replay", *where, "no-such-rollout")
    empty = invoke("outbox", "list", *where)

    assert (chosen.exit_code, empty.exit_code) == (0, 0)
    assert "Nothing to replay" in chosen.stderr
    assert "is empty" in empty.stderr


@pytest.mark.usefixtures("clean_cwd")
def test_an_unreachable_store_and_a_bad_url_are_one_line_errors() -> None:
    """No traceback: which store, and why."""
    down = invoke("outbox", "list", "--state", f"redis://127.0.0.1:{free_port()}/0")
    bad = invoke("outbox", "list", "--state", "mysql://db")

    assert down.exit_code == 2
    assert "is unreachable" in down.stderr
    assert bad.exit_code == 2
    assert "must be 'memory' or a Redis URL" in bad.stderr
    assert "Traceback" not in down.output + bad.output


@pytest.mark.usefixtures("clean_cwd")
def test_replay_with_a_key_sends_it_only_where_it_was_told(
    where: list[str], gate: tuple[CallbackGate, str]
) -> None:
    """``--api-key REAL-KEY`` used to go to whatever host a hostile init named. Now, without
    ``--server-url`` or ``--traingate``, it is a usage error; with ``--traingate`` an entry
    bound elsewhere is refused and kept; with ``--server-url`` every entry goes there."""
    recorder, gate_url = gate
    hostile = undelivered("hostile")
    hostile.server_url = "http://evil.example:8080/collect"
    keep(where, hostile)

    bare = invoke("outbox", "replay", *where, "--api-key", "REAL-KEY")
    listed = invoke(
        "outbox", "replay", *where, "--api-key", "REAL-KEY", "--traingate", "tg.internal"
    )
    redirected = invoke(
        "outbox", "replay", *where, "--api-key", "REAL-KEY", "--server-url", gate_url
    )

    assert bare.exit_code == 2, bare.output
    assert "--server-url URL, or --traingate HOST" in " ".join(bare.stderr.split())
    assert listed.exit_code == 1, listed.output
    assert "refused hostile: not sent to http://evil.example:8080/collect" in " ".join(
        listed.stderr.split()
    )
    assert "0 delivered, 1 still in the outbox" in listed.stderr
    assert redirected.exit_code == 0, redirected.output
    [callback] = recorder.callbacks["hostile"]
    # --api-key is for entries without their own key: files never keep one, the stream does.
    own = where[0] == "--state"
    assert callback.authorization == ("Bearer tg-secret" if own else "Bearer REAL-KEY")


@pytest.mark.usefixtures("clean_cwd")
def test_list_and_show_redact_the_destination(where: list[str]) -> None:
    """An entry kept before inits were checked may name a password or a query: list shows
    the host, show and --json the URL with both redacted."""
    old = undelivered("old")
    old.server_url = "http://user:hunter2@tg.example:8000/base?token=abc"
    keep(where, old)

    listed = invoke("outbox", "list", *where)
    shown = invoke("outbox", "show", *where, "old")
    as_json = invoke("outbox", "list", *where, "--json")

    assert "tg.example:8000" in listed.stdout
    assert "traingate: http://user:***@tg.example:8000/base?***\n" in shown.stdout
    assert json.loads(as_json.stdout)["server_url"] == "http://user:***@tg.example:8000/base?***"
    for output in (listed.output, shown.output, as_json.output):
        assert "hunter2" not in output
        assert "token=abc" not in output


@pytest.mark.usefixtures("clean_cwd")
def test_a_blank_server_key_in_the_environment_does_not_stop_outbox_commands(
    where: list[str],
) -> None:
    """``OSMOSIS_API_KEY=""`` is refused by ``serve``; ``outbox`` never uses the server key."""
    keep(where, undelivered("r-1"))
    listed = runner.invoke(
        app, ["outbox", "list", *where], env={"COLUMNS": "80", "OSMOSIS_API_KEY": ""}
    )

    assert listed.exit_code == 0, listed.output
    assert "r-1" in listed.stdout


@pytest.mark.usefixtures("clean_cwd")
def test_a_v2_entry_shows_its_pending_part_and_replay_sends_only_that(where: list[str]) -> None:
    """A protocol v2 entry whose completion was delivered: ``list`` says only the grader
    callback is due, and ``replay`` posts just that to its grader URL, with the key given."""
    gate = V2Gate()
    with serve_in_thread(gate.app()) as url:
        base = f"{url}/v1/rollouts/v2-r"
        grader = {"status": "failure", "rollout_id": "v2-r", "sample": None,
                  "err_message": "boom", "err_category": "agent_error"}  # fmt: skip
        entry = undelivered("v2-r")
        entry.server_url = f"{base}/completion"
        entry.protocol = "v2"
        entry.api_key = CONTROLLER_KEY  # kept by the stream, given again for the files
        entry.route = {
            "grader_callback_url": f"{base}/grader",
            "id_given": True,
            "label": None,
            "pending": ["grader"],
            "bodies": {"completion": {"status": "failure"}, "grader": grader},
        }
        keep(where, entry)
        listed = invoke("outbox", "list", *where)
        # --server-url names v1's base URL: a v2 entry is never redirected by it, nor sent
        # to its own URLs unchecked with the key (it stays in the outbox).
        redirected = invoke(
            "outbox", "replay", *where, "--api-key", CONTROLLER_KEY, "--server-url", url
        )
        replayed = invoke(
            "outbox", "replay", *where, "--api-key", CONTROLLER_KEY, "--traingate", "127.0.0.1"
        )

    assert "[v2: grader]" in listed.stdout
    assert redirected.exit_code == 1, redirected.output
    assert "--server-url applies to v1 entries" in " ".join(redirected.stderr.split())
    assert replayed.exit_code == 0, replayed.output
    assert "v2-r" not in gate.completions
    [call] = gate.graders["v2-r"]
    assert call.body == grader
    assert call.authorization == f"Bearer {CONTROLLER_KEY}"
