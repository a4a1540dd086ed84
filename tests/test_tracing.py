"""Debug traces: safe file names for hostile rollout ids, ordered writes, flushing, redaction."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from osmosis_rollout.client import TrainGateClient
from osmosis_rollout.protocol import RolloutRequest, RolloutStatus
from osmosis_rollout.redaction import REDACTED
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.testing import MockTrainGate
from osmosis_rollout.tracing import Tracer, safe_trace_name, secret_free_json

from .support import load_asset

SECRET = "tg-secret-0123456789"

HOSTILE_IDS = [
    "../x",
    "../../etc/passwd",
    "/abs",
    "/etc/cron.d/evil",
    "a/b",
    "a\\b",
    "..\\..\\windows",
    ".",
    "..",
    "...",
    ".hidden",
    "\x00",
    "a\x00b",
    "abc\n",
    "a" * 256,
    "/" * 256,
    "é" * 256,
    "ünïcødé-ид-标识",
    "🚀",
    "con",
    "CON",
    "nul.txt",
    "lpt1",
    "-rf",
    " ",
    "~",
    "$HOME",
    "a:b",
    "a b",
]

#: Ids that differ only in characters a file name cannot keep, or that mimic a hashed name.
LOOKALIKES = [
    "a/b",
    "a:b",
    "a\\b",
    "a b",
    "a?b",
    "a*b",
    "a|b",
    "a\x00b",
    "a_b",
    "a-b",
    "abc",
    "abc\n",
    "x/",
    "x-" + safe_trace_name("x/")[2:18],
    "con",
    "con-" + safe_trace_name("con").removesuffix(".jsonl").rsplit("-", 1)[1],
]


def only_children(directory: Path, root: Path) -> None:
    """Assert ``root`` holds nothing but ``directory``, which holds only plain files."""
    assert [p for p in root.rglob("*") if p != directory and p.parent != directory] == []
    assert all(p.is_file() for p in directory.iterdir())


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON events of one trace file, in order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- file names -------------------------------------------------------------------------------


@pytest.mark.parametrize("rollout_id", HOSTILE_IDS, ids=repr)
def test_hostile_rollout_id_stays_inside_the_debug_dir(tmp_path: Path, rollout_id: str) -> None:
    """Whatever the id, its trace is one plain file directly inside the debug directory."""
    debug = tmp_path / "debug"
    tracer = Tracer(debug)
    path = tracer.path_for(rollout_id)
    assert path.parent == debug.resolve()
    tracer.sink(rollout_id)({"event": "hello", "rollout_id": rollout_id})
    tracer.close()
    only_children(debug, tmp_path)
    (written,) = debug.iterdir()
    assert written.resolve() == path
    assert read_events(path)[0]["rollout_id"] == rollout_id


def test_plain_rollout_ids_keep_their_name() -> None:
    """Ordinary ids map to ``<id>.jsonl`` so traces are easy to find."""
    for rollout_id in ["r-1", "run_42.a", "ABC-def_0", "x" * 128]:
        assert safe_trace_name(rollout_id) == f"{rollout_id}.jsonl"


@pytest.mark.parametrize("rollout_id", ["con", "CON", "Aux", "nul.txt", "lpt1", "com9.log"])
def test_windows_device_names_are_not_used_verbatim(rollout_id: str) -> None:
    """Names Windows reserves for devices (``con.jsonl`` is the console) are hashed."""
    name = safe_trace_name(rollout_id)
    assert name.split(".")[0].lower() not in {"con", "aux", "nul", "lpt1", "com9"}


def test_distinct_lookalike_ids_get_distinct_files(tmp_path: Path) -> None:
    """Ids differing only by unsafe characters, or mimicking a hashed name, never share a file."""
    ids = sorted(set(LOOKALIKES + HOSTILE_IDS))
    names = {safe_trace_name(i) for i in ids}
    assert len(names) == len(ids)
    tracer = Tracer(tmp_path)
    for rollout_id in ids:
        tracer.sink(rollout_id)({"event": "e", "rollout_id": rollout_id})
    tracer.close()
    assert len(list(tmp_path.iterdir())) == len(ids)
    for rollout_id in ids:
        assert [e["rollout_id"] for e in read_events(tracer.path_for(rollout_id))] == [rollout_id]


@given(st.text(min_size=1, max_size=256))
def test_any_rollout_id_gives_a_safe_file_name(rollout_id: str) -> None:
    """Every id maps to a short name of safe characters that is not hidden or a parent ref."""
    name = safe_trace_name(rollout_id)
    assert name.endswith(".jsonl")
    assert name == name.strip()
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    assert not name.startswith((".", "-"))
    assert (Path("/debug") / name).resolve().parent == Path("/debug")
    assert len(name.encode()) <= 255


@given(st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=8, unique=True))
def test_distinct_rollout_ids_give_distinct_file_names(ids: list[str]) -> None:
    """No two different ids share a trace file."""
    assert len({safe_trace_name(i) for i in ids}) == len(ids)


# -- writing --------------------------------------------------------------------------------


def test_events_are_written_in_order(tmp_path: Path) -> None:
    """Events interleaved across rollouts land in each file in emission order."""
    tracer = Tracer(tmp_path)
    sinks = {rid: tracer.sink(rid) for rid in ("r-1", "r-2", "../r-3")}
    for seq in range(300):
        for rid, sink in sinks.items():
            sink({"event": "step", "rollout_id": rid, "seq": seq})
    tracer.close()
    for rid in sinks:
        events = read_events(tracer.path_for(rid))
        assert [e["seq"] for e in events] == list(range(300))
        assert all(e["rollout_id"] == rid for e in events)
        timestamps = [e["ts"] for e in events]
        assert timestamps == sorted(timestamps)


def test_close_flushes_everything_queued(tmp_path: Path) -> None:
    """After close() returns, every emitted event is on disk, with no wait needed."""
    tracer = Tracer(tmp_path)
    sink = tracer.sink("r-1")
    for seq in range(2000):
        sink({"event": "step", "seq": seq, "pad": "x" * 100})
    tracer.close()
    assert len(read_events(tracer.path_for("r-1"))) == 2000


def test_close_is_idempotent_and_the_tracer_reusable(tmp_path: Path) -> None:
    """close() twice, or on an unused tracer, is harmless; events after close still land."""
    Tracer(tmp_path / "unused").close()
    tracer = Tracer(tmp_path)
    sink = tracer.sink("r-1")
    sink({"event": "first"})
    tracer.close()
    tracer.close()
    sink({"event": "second"})
    tracer.close()
    assert [e["event"] for e in read_events(tracer.path_for("r-1"))] == ["first", "second"]


def test_events_are_appended_to_an_existing_trace(tmp_path: Path) -> None:
    """A new tracer on the same directory appends rather than truncates."""
    for event in ("one", "two"):
        tracer = Tracer(tmp_path)
        tracer.sink("r-1")({"event": event})
        tracer.close()
    assert [e["event"] for e in read_events(tmp_path / "r-1.jsonl")] == ["one", "two"]


def test_unwritable_trace_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """If the directory disappears, the writer logs an error and keeps running."""
    debug = tmp_path / "debug"
    tracer = Tracer(debug)
    debug.rmdir()
    tracer.sink("r-1")({"event": "lost"})
    tracer.close()
    assert any(
        r.levelno == logging.ERROR and "could not write debug trace" in r.getMessage()
        for r in caplog.records
    )


def test_non_json_values_are_stringified(tmp_path: Path) -> None:
    """Values json cannot encode (paths, sets...) are written as text instead of failing."""
    tracer = Tracer(tmp_path)
    tracer.sink("r-1")({"event": "odd", "path": Path("/x"), "when": {1}})
    tracer.close()
    (event,) = read_events(tracer.path_for("r-1"))
    assert event["path"] == "/x"
    assert event["when"] == "{1}"


# -- secrets -----------------------------------------------------------------------------------


def test_secret_keys_and_values_never_reach_the_file(tmp_path: Path) -> None:
    """``api_key``/``authorization`` keys are redacted at any depth, the value everywhere."""
    tracer = Tracer(tmp_path)
    sink = tracer.sink("r-1", secrets=[SECRET, None])
    sink(
        {
            "event": "request",
            "api_key": SECRET,
            "API_KEY": "other-key-value",
            "headers": {"Authorization": "Bearer something-else", "X-Api-Key": "k2"},
            "calls": [{"nested": [{"authorization": "Basic abc"}]}],
            "messages": [{"role": "user", "content": f"here is my key: {SECRET}!"}],
            "note": SECRET,
        }
    )
    tracer.close()
    text = tracer.path_for("r-1").read_text()
    for leaked in (SECRET, "other-key-value", "something-else", "k2", "Basic abc"):
        assert leaked not in text
    (event,) = read_events(tracer.path_for("r-1"))
    assert event["api_key"] == "**********"
    assert event["headers"]["Authorization"] == "**********"
    assert event["calls"][0]["nested"][0]["authorization"] == "**********"
    assert event["messages"][0]["content"] == "here is my key: **********!"
    assert event["note"] == "**********"


@pytest.mark.anyio
async def test_rollout_trace_never_holds_the_api_key(
    mock_client: tuple[MockTrainGate, TrainGateClient], tmp_path: Path
) -> None:
    """An agent that logs its own key, by name and inside messages, leaves no trace of it."""
    gate, client = mock_client
    agent = load_asset("fnd_faulty").LeakyLoggerAgent()
    request = RolloutRequest(
        rollout_id="../leaky",
        server_url="http://traingate.test",
        messages=[{"role": "user", "content": "hi"}],
        completion_params={},
        api_key=SECRET,
    )
    gate.expect(request.rollout_id, api_key=SECRET)
    tracer = Tracer(tmp_path / "debug")

    response = await run_rollout(agent, request, client.channel(request), tracer=tracer)
    tracer.close()

    assert response.status is RolloutStatus.COMPLETED
    only_children(tmp_path / "debug", tmp_path)
    path = tracer.path_for("../leaky")
    assert SECRET not in path.read_text()
    events = read_events(path)
    assert [e["event"] for e in events] == [
        "rollout_start",
        "debug",
        "http",
        "turn",
        "history",
        "rollout_end",
    ]
    assert all(e["rollout_id"] == "../leaky" for e in events)
    assert events[1]["note"] == "calling with key=**********"
    assert events[4]["messages"][-1]["content"] == "my key is **********"


def test_trace_files_are_written_on_the_writer_thread_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emitting an event never touches the disk on the caller's thread (the event loop's)."""
    import threading

    from osmosis_rollout import tracing

    opened_on: list[str] = []
    original = Path.open
    original_private = tracing.open_private

    def spy(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened_on.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    def spy_private(path: Path, **kwargs: Any) -> Any:
        opened_on.append(threading.current_thread().name)
        return original_private(path, **kwargs)

    # Traces are created private (0600) through private_files.open_private: both doors spied.
    monkeypatch.setattr(Path, "open", spy)
    monkeypatch.setattr(tracing, "open_private", spy_private)
    tracer = Tracer(tmp_path)
    sink = tracer.sink("r-1")
    for seq in range(50):
        sink({"event": "step", "seq": seq})
    tracer.close()
    assert opened_on
    assert set(opened_on) == {"osmosis-tracer"}


def test_secret_keys_are_redacted_at_any_depth_beside_plain_numbers() -> None:
    """Lists of token ids and logprobs skip the per-number walk; secrets under them do not."""

    record = {
        "token_ids": list(range(50)),
        "logprobs": [-0.5, -1.25, None, True],
        "nested": [1, "two", {"api_key": "k-1"}, [{"Authorization": "Bearer k-2"}], ("x", 3)],
        "password": 7,
    }
    data = json.loads(secret_free_json(record))
    assert data["token_ids"] == list(range(50))
    assert data["logprobs"] == [-0.5, -1.25, None, True]
    assert data["nested"] == [
        1,
        "two",
        {"api_key": REDACTED},
        [{"Authorization": REDACTED}],
        ["x", 3],
    ]
    assert data["password"] == REDACTED
