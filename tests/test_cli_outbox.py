"""``osmosis outbox list|replay`` on both backends: the files of one server, the Redis stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.server.state import open_state

from .gates import CallbackGate
from .outbox_entries import undelivered
from .support import free_port

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
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


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
    assert "ERROR/error" in table.stdout
    assert "2 undelivered callback(s)" in table.stderr
    rows = [json.loads(line) for line in lines.stdout.splitlines()]
    assert [row["rollout_id"] for row in rows] == ["r-1", "r-2"]
    assert "tg-secret" not in table.output + lines.output


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

    replayed = invoke("outbox", "replay", *where, "--api-key", "tg-secret")
    left = [
        json.loads(line) for line in invoke("outbox", "list", *where, "--json").stdout.splitlines()
    ]

    assert replayed.exit_code == 1, replayed.output
    assert "delivered good" in replayed.stderr
    assert "failed    gone: could not reach" in replayed.stderr
    assert "1 delivered, 1 still in the outbox" in replayed.stderr
    [callback] = recorder.callbacks["good"]
    assert callback.body["status"] == "ERROR"
    assert callback.authorization == "Bearer tg-secret"
    assert [row["rollout_id"] for row in left] == ["gone"]
    assert left[0]["attempts"] == 1


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
