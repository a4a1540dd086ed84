"""Several replicas on one Redis, as real ``osmosis serve`` processes on 127.0.0.1.

A small recording TrainGate (``CallbackGate``, uvicorn in a thread) counts every completion
callback. The done-when scenarios of shared state: duplicates split between two replicas start one
rollout; ``kill -9`` of a replica under load loses nothing, its orphans getting their ERROR
callback from the survivor.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from osmosis_rollout.server.state import LeasedRollout, open_state

from .gates import CallbackGate, init
from .processes import REPO, ServeProcess, clean_env, osmosis_serve
from .support import serve_in_thread, wait_until
from .v2_gate import CONTROLLER_KEY, V2Gate, v2_init

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

AGENT = f"{REPO / 'tests' / 'assets' / 'replica_agent.py'}:SleepAgent"
LEASE_TTL_S = 3.0


@contextlib.contextmanager
def replicas(tmp_path: Path, redis_url: str, count: int = 2) -> Iterator[list[ServeProcess]]:
    """``count`` ``osmosis serve`` processes sharing ``redis_url``, each on its own port."""
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(
                osmosis_serve(
                    tmp_path / f"replica-{i}.log",
                    AGENT,
                    "--port",
                    "0",
                    "--no-validate",
                    "--state",
                    redis_url,
                    "--lease-ttl",
                    str(LEASE_TTL_S),
                    "--outbox-dir",
                    str(tmp_path / f"outbox-{i}"),
                    env=clean_env(),
                )
            )
            for i in range(count)
        ]
        yield servers


async def test_duplicates_split_between_two_replicas_start_one_rollout(
    tmp_path: Path, redis_url: str, gate: tuple[CallbackGate, str]
) -> None:
    """50 concurrent copies of one init, alternating between two replicas: all get the same
    202, one replica runs it, one callback arrives."""
    recorder, gate_url = gate
    body = init("dup-1", gate_url, 0.5)
    with replicas(tmp_path, redis_url) as (a, b):
        responses: list[httpx2.Response] = []
        async with httpx2.AsyncClient(timeout=30) as http:

            async def send(url: str) -> None:
                responses.append(await http.post(f"{url}/v1/rollout/init", json=body))

            async with anyio.create_task_group() as tasks:
                for i in range(50):
                    tasks.start_soon(send, (a if i % 2 else b).url)
            await wait_until(lambda: recorder.count() >= 1, 20)
            await anyio.sleep(1.0)  # a second run would call back about now
            healths = [(await http.get(f"{s.url}/health")).json() for s in (a, b)]

    assert [r.status_code for r in responses] == [202] * 50
    assert len({r.content for r in responses}) == 1
    [callback] = recorder.callbacks["dup-1"]
    assert callback.body["status"] == "COMPLETED"
    assert sum(h["completed_rollouts"] for h in healths) == 1
    assert all(h["state"] == "redis" and h["state_reachable"] for h in healths)


async def test_kill_9_of_a_replica_under_load_loses_nothing(
    tmp_path: Path, redis_url: str, gate: tuple[CallbackGate, str]
) -> None:
    """200 rollouts over two replicas; replica B is killed with SIGKILL while they run. Every
    rollout ends in exactly one callback (or stream entry); B's unfinished ones get an ERROR
    callback from A once their lease lapses, within the lease TTL."""
    recorder, gate_url = gate
    total = 200
    with replicas(tmp_path, redis_url) as (a, b):
        statuses: dict[str, int] = {}
        async with httpx2.AsyncClient(timeout=30) as http:

            async def send(i: int) -> None:
                target = a if i % 2 else b
                rid = f"load-{i}"
                # B's rollouts outlive the kill; A's finish at various times around it.
                sleep_s = 30.0 if target is b else 0.2 + (i % 10) * 0.3
                response = await http.post(
                    f"{target.url}/v1/rollout/init", json=init(rid, gate_url, sleep_s)
                )
                statuses[rid] = response.status_code

            async with anyio.create_task_group() as tasks:
                for i in range(total):
                    tasks.start_soon(send, i)
            os.kill(b.proc.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            b.proc.wait(timeout=10)

            state = open_state(redis_url, outbox_dir=tmp_path / "unused")
            try:
                with anyio.fail_after(LEASE_TTL_S * 4 + 20):
                    while True:
                        kept = {e.rollout_id for e in await state.outbox_list()}
                        if len(set(recorder.callbacks) | kept) >= total:
                            break
                        await anyio.sleep(0.1)
                await anyio.sleep(LEASE_TTL_S)  # a late duplicate would arrive about now
                kept_ids = [e.rollout_id for e in await state.outbox_list()]
            finally:
                await state.close()

    assert statuses == {f"load-{i}": 202 for i in range(total)}
    with recorder.lock:
        ended = {rid: len(calls) for rid, calls in recorder.callbacks.items()}
        orphans = {
            rid: calls[0]
            for rid, calls in recorder.callbacks.items()
            if calls[0].body["status"] == "ERROR"
        }
    for rid in kept_ids:
        ended[rid] = ended.get(rid, 0) + 1
    assert ended == {f"load-{i}": 1 for i in range(total)}  # exactly one end each
    assert set(orphans) == {f"load-{i}" for i in range(0, total, 2)}  # B's, all unfinished
    for callback in orphans.values():
        assert callback.body["finish_reason"] == "error"
        assert "stopped" in callback.body["error_message"]
        assert callback.body["final_messages"][0]["content"].startswith("task ")
        # Within the lease TTL (plus the callback's own delivery on a loaded machine).
        assert callback.at - killed_at < 1.5 * LEASE_TTL_S
    survivors = [c[0].body for rid, c in recorder.callbacks.items() if rid not in orphans]
    assert all(body["status"] == "COMPLETED" for body in survivors)
    assert {body["extra_fields"]["pid"] for body in survivors} == {a.proc.pid}


# -- protocol v2 on replicas sharing Redis ------------------------------------------------------


@pytest.fixture
def v2_gate() -> Iterator[V2Gate]:
    """A v2 controller stand-in on 127.0.0.1 (uvicorn in a thread)."""
    recorder = V2Gate(replies=[{"content": "unused"}])
    with serve_in_thread(recorder.app()) as url:
        recorder.url = url
        yield recorder


def _v2_body(gate: V2Gate, rid: str, sleep_s: float) -> dict[str, object]:
    return v2_init(gate.url, rid, metadata={"sleep_s": sleep_s})


async def test_v2_status_and_cancel_from_any_replica(
    tmp_path: Path, redis_url: str, v2_gate: V2Gate
) -> None:
    """A v2 rollout running on A: B answers its status, and B's cancel reaches A, which ends it
    in a cancelled completion and a failed grader callback; B then reports it cancelled."""
    with replicas(tmp_path, redis_url) as (a, b):
        async with httpx2.AsyncClient(timeout=30) as http:
            started = await http.post(f"{a.url}/rollout", json=_v2_body(v2_gate, "v2-far", 30))
            await anyio.sleep(0.5)
            running = (await http.get(f"{b.url}/rollout/v2-far/status")).json()
            cancel = await http.post(f"{b.url}/rollout/cancel", json={"ids": ["v2-far"]})
            await wait_until(lambda: v2_gate.ended("v2-far"), 15)
            ended = (await http.get(f"{b.url}/rollout/v2-far/status")).json()
            by_prefix = await http.post(f"{b.url}/rollout/cancel", json={"prefix": "v2-"})

    assert started.status_code == 202
    assert running["status"] == "running"
    assert cancel.json() == {"dispositions": {"v2-far": "cancelled_running"}}
    assert v2_gate.completions["v2-far"][0].body["status"] == "cancelled"
    assert v2_gate.graders["v2-far"][0].body["status"] == "failure"
    assert ended["status"] == "cancelled"
    assert "cancelled by the trainer" in ended["err_message"]
    assert by_prefix.json() == {"dispositions": {}}


async def test_kill_9_of_a_v2_replica_loses_nothing(
    tmp_path: Path, redis_url: str, v2_gate: V2Gate
) -> None:
    """60 v2 rollouts over two replicas, B killed with SIGKILL while its rollouts run: each
    ends in exactly one completion and one grader callback (B's as failures, sent by A once
    their lease lapses, with the controller key), or an outbox entry holding what is missing."""
    total = 60
    with replicas(tmp_path, redis_url) as (a, b):
        async with httpx2.AsyncClient(timeout=30) as http:

            async def send(i: int) -> None:
                target = a if i % 2 else b
                sleep_s = 30.0 if target is b else 0.2 + (i % 10) * 0.2
                response = await http.post(
                    f"{target.url}/rollout", json=_v2_body(v2_gate, f"k-{i}", sleep_s)
                )
                assert response.status_code == 202

            async with anyio.create_task_group() as tasks:
                for i in range(total):
                    tasks.start_soon(send, i)
            os.kill(b.proc.pid, signal.SIGKILL)
            b.proc.wait(timeout=10)
            state = open_state(redis_url, outbox_dir=tmp_path / "unused")
            try:
                with anyio.fail_after(LEASE_TTL_S * 4 + 20):
                    while True:
                        kept = {e.rollout_id for e in await state.outbox_list()}
                        with v2_gate.lock:
                            done = set(v2_gate.graders)
                        if len(done | kept) >= total:
                            break
                        await anyio.sleep(0.1)
                await anyio.sleep(LEASE_TTL_S)  # a late duplicate would arrive about now
                kept_entries = await state.outbox_list()
            finally:
                await state.close()

    assert kept_entries == []
    with v2_gate.lock:
        completions = {rid: [c.body for c in calls] for rid, calls in v2_gate.completions.items()}
        graders = {rid: [c.body for c in calls] for rid, calls in v2_gate.graders.items()}
    assert {rid: len(c) for rid, c in completions.items()} == {f"k-{i}": 1 for i in range(total)}
    assert {rid: len(g) for rid, g in graders.items()} == {f"k-{i}": 1 for i in range(total)}
    for i in range(total):
        [completion], [grader] = completions[f"k-{i}"], graders[f"k-{i}"]
        if i % 2:  # A's: ran to the end
            assert (completion["status"], grader["status"]) == ("success", "failure")
            assert grader["err_category"] == "validation_error"  # no reward, no grade()
        else:  # B's: ended by A's sweep
            assert completion["status"] == "failure"
            assert "stopped" in completion["err_message"]
            assert grader["status"] == "failure"


async def test_a_dead_replicas_v2_rollout_gets_only_what_its_lease_says_is_due(
    tmp_path: Path, redis_url: str, v2_gate: V2Gate
) -> None:
    """A replica that died after its v2 rollout's completion was taken (its lease says only
    the grader callback is due, with the settled body): the survivor sends that grader body,
    never a second, contradicting completion; status from it then says success."""
    base = f"{v2_gate.url}/v1/rollouts/dead-1"
    grader = {
        "status": "success",
        "rollout_id": "dead-1",
        "sample": {"messages": [], "label": "7", "reward": 1.0, "remove_sample": False,
                   "metrics": {}, "extra_fields": {}},
        "err_message": None,
        "err_category": None,
    }  # fmt: skip
    lease = LeasedRollout(
        key="dead-1",
        rollout_id="dead-1",
        server_url=f"{base}/completion",
        api_key=CONTROLLER_KEY,
        messages=[{"role": "user", "content": "task dead-1"}],
        protocol="v2",
        route={
            "grader_callback_url": f"{base}/grader",
            "id_given": True,
            "label": "7",
            "pending": ["grader"],
            "bodies": {"completion": {"status": "success"}, "grader": grader},
        },
    )
    state = open_state(redis_url, outbox_dir=tmp_path / "unused")
    try:
        await state.accept(
            lease,
            digest="1",
            replica="a-replica-that-died",
            status=202,
            body=b'{"rollout_id":"dead-1"}',
            lease_ttl_s=0.5,
            queue=False,
            max_queued=10,
        )
    finally:
        await state.close()
    with replicas(tmp_path, redis_url, count=1) as (survivor,):
        await wait_until(lambda: v2_gate.ended("dead-1"), LEASE_TTL_S * 4 + 10)
        await anyio.sleep(1.0)  # a late second callback would arrive about now
        async with httpx2.AsyncClient(timeout=10) as http:
            status = (await http.get(f"{survivor.url}/rollout/dead-1/status")).json()

    assert "dead-1" not in v2_gate.completions
    [call] = v2_gate.graders["dead-1"]
    assert call.body == grader
    assert call.authorization == f"Bearer {CONTROLLER_KEY}"
    assert (status["status"], status["reward"]) == ("success", 1.0)
