"""One behaviour suite for both state backends: ``memory`` and ``redis`` (a real redis-server).

The backend-level tests drive ``StateBackend`` the way two replicas would (two replica names on
one backend); the server-level tests run ``create_app`` with each backend.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx2
import pytest

from osmosis_rollout.errors import ConfigError
from osmosis_rollout.protocol import RolloutRequest, RolloutResponse, RolloutStatus
from osmosis_rollout.server.state import (
    ClaimOutcome,
    LeasedRollout,
    StateBackend,
    fingerprint,
    open_state,
)
from osmosis_rollout.server.state.memory import write_outbox

from .gates import COMPLETED
from .outbox_entries import undelivered
from .serving import TG_KEY, init_body, serving
from .support import free_port, load_asset

pytestmark = pytest.mark.anyio

agents = load_asset("srv_agents")


@pytest.fixture(params=["memory", "redis"])
def state_url(request: pytest.FixtureRequest) -> str:
    """Each test runs once per backend."""
    if request.param == "memory":
        return "memory"
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
async def state(state_url: str, tmp_path: Path) -> AsyncIterator[StateBackend]:
    """An open backend, closed after the test."""
    backend = open_state(state_url, outbox_dir=tmp_path / "outbox")
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
async def shared(redis_url: str, tmp_path: Path) -> AsyncIterator[StateBackend]:
    """The shared backend alone: init claims are its job (with one process, the server's
    registry answers duplicates; the server-level tests below cover both)."""
    backend = open_state(redis_url, outbox_dir=tmp_path / "outbox")
    try:
        yield backend
    finally:
        await backend.close()


def request_of(rollout_id: str = "r-1", **overrides: object) -> RolloutRequest:
    """A valid init body as a ``RolloutRequest``."""
    return RolloutRequest.model_validate(init_body(rollout_id, **overrides))


async def accept(
    state: StateBackend,
    request: RolloutRequest,
    *,
    replica: str = "a",
    lease_ttl_s: float = 30.0,
    queue: bool = False,
    max_queued: int = 10,
) -> bool:
    """Accept ``request`` as replica ``replica`` would, with the body ``b'202:<id>'``."""
    return await state.accept(
        LeasedRollout.of(request),
        digest=str(fingerprint(request)),
        replica=replica,
        status=202,
        body=f"202:{request.rollout_id}".encode(),
        lease_ttl_s=lease_ttl_s,
        queue=queue,
        max_queued=max_queued,
    )


async def claim(state: StateBackend, request: RolloutRequest, pending_ttl_s: float = 30.0):  # type: ignore[no-untyped-def]
    """``claim_init`` for ``request``."""
    return await state.claim_init(
        request.dedup_key,
        request.rollout_id,
        str(fingerprint(request)),
        pending_ttl_s=pending_ttl_s,
    )


# --------------------------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------------------------


async def test_first_claim_wins_and_duplicates_get_its_answer(shared: StateBackend) -> None:
    """The first init owns the key; a duplicate waits while it is pending, then gets its 202."""
    request = request_of()
    first = await claim(shared, request)
    pending = await claim(shared, request)
    assert await accept(shared, request)
    answered = await claim(shared, request)

    assert first.outcome is ClaimOutcome.CLAIMED
    assert pending.outcome is ClaimOutcome.PENDING
    assert (answered.outcome, answered.status, answered.body) == (
        ClaimOutcome.ANSWERED,
        202,
        b"202:r-1",
    )


async def test_conflicting_inits_are_refused_with_a_reason(shared: StateBackend) -> None:
    """Another id under a used key, another body under the same key and id, or a running id
    under a new key: each is a conflict that says which."""
    first = request_of("r-1", idempotency_key="k-1")
    await claim(shared, first)
    await accept(shared, first)

    other_id = await claim(shared, request_of("r-2", idempotency_key="k-1"))
    other_body = await claim(
        shared,
        request_of("r-1", idempotency_key="k-1", messages=[{"role": "user", "content": "x"}]),
    )
    other_key = await claim(shared, request_of("r-1", idempotency_key="k-2"))
    new_api_key = await claim(shared, request_of("r-1", idempotency_key="k-1", api_key="fresh"))

    assert other_id.outcome is ClaimOutcome.CONFLICT
    assert "different rollout_id" in other_id.detail
    assert other_body.outcome is ClaimOutcome.CONFLICT
    assert "different request body" in other_body.detail
    assert other_key.outcome is ClaimOutcome.CONFLICT
    assert "already running" in other_key.detail
    assert new_api_key.outcome is ClaimOutcome.ANSWERED  # a refreshed key is the same init


async def test_a_released_claim_lets_the_retry_start_anew(shared: StateBackend) -> None:
    """A refused init (get_tools failed) forgets the key and the id."""
    request = request_of()
    await claim(shared, request)
    await shared.release_init(request.dedup_key, request.rollout_id)

    assert (await claim(shared, request)).outcome is ClaimOutcome.CLAIMED


async def test_a_pending_claim_lapses_when_its_replica_dies(shared: StateBackend) -> None:
    """A claim nobody answers within its pending TTL can be claimed again."""
    request = request_of()
    await claim(shared, request, pending_ttl_s=0.05)
    await anyio.sleep(0.2)
    shared.expire()

    assert (await claim(shared, request)).outcome is ClaimOutcome.CLAIMED


async def test_finished_records_answer_duplicates_for_the_ttl_then_lapse(
    shared: StateBackend,
) -> None:
    """After finish, a duplicate still gets the 202 until the record TTL; then it runs anew."""
    request = request_of()
    await claim(shared, request)
    await accept(shared, request)
    await shared.finish(request.dedup_key, request.rollout_id, record_ttl_s=0.2)
    soon = await claim(shared, request)
    other_key = await claim(shared, request_of("r-1", idempotency_key="k-9"))
    await shared.release_init("k-9", "r-1")
    await anyio.sleep(0.4)
    shared.expire()
    later = await claim(shared, request)

    assert soon.outcome is ClaimOutcome.ANSWERED
    assert other_key.outcome is ClaimOutcome.CLAIMED  # the id no longer runs
    assert later.outcome is ClaimOutcome.CLAIMED


# --------------------------------------------------------------------------------------------
# Admission
# --------------------------------------------------------------------------------------------


async def test_the_queue_is_bounded_across_replicas(state: StateBackend) -> None:
    """max_queued counts the queued rollouts of every replica; unqueue frees a place."""
    await state.renew("a", [], 30)
    await state.renew("b", [], 30)
    results = []
    for i, replica in enumerate(["a", "b", "a", "b"]):
        request = request_of(f"q-{i}")
        await claim(state, request)
        results.append(await accept(state, request, replica=replica, queue=True, max_queued=3))
    waiting = await state.queued()
    await state.unqueue("b")
    request = request_of("q-late")
    await claim(state, request)
    after_unqueue = await accept(state, request, replica="a", queue=True, max_queued=3)

    assert results == [True, True, True, False]
    assert waiting == 3
    assert after_unqueue is True


async def test_a_refused_queue_place_leaves_the_claim_for_release(shared: StateBackend) -> None:
    """A full queue changes nothing: the claim stays pending until the server releases it."""
    request = request_of()
    await claim(shared, request)
    assert not await accept(shared, request, queue=True, max_queued=0)

    assert (await claim(shared, request)).outcome is ClaimOutcome.PENDING


# --------------------------------------------------------------------------------------------
# Leases
# --------------------------------------------------------------------------------------------


async def test_a_lapsed_lease_is_claimed_by_exactly_one_sweeper(state: StateBackend) -> None:
    """Ten concurrent sweepers: the orphan goes to one of them, with what its callback needs."""
    request = request_of(api_key="tg-secret")
    await claim(state, request)
    await accept(state, request, lease_ttl_s=0.05)
    await anyio.sleep(0.2)
    found: list[LeasedRollout] = []

    async def sweep() -> None:
        found.extend(await state.claim_orphans(10, record_ttl_s=60))

    async with anyio.create_task_group() as tasks:
        for _ in range(10):
            tasks.start_soon(sweep)

    [orphan] = found
    assert orphan.rollout_id == "r-1"
    assert orphan.server_url == request.server_url
    assert orphan.api_key == "tg-secret"
    assert orphan.messages == request.messages
    assert await state.hold(request.dedup_key, 30) is False  # the owner must not deliver now
    if state.shared:  # the record stays for duplicates (memory: the registry's job)
        assert (await claim(state, request)).outcome is ClaimOutcome.ANSWERED


async def test_renewed_and_finished_leases_are_never_orphans(state: StateBackend) -> None:
    """Renewal keeps a lease; finish drops it; neither is swept."""
    renewed, finished = request_of("renewed"), request_of("finished")
    for request in (renewed, finished):
        await claim(state, request)
        await accept(state, request, lease_ttl_s=0.3)
    await state.finish(finished.dedup_key, finished.rollout_id, record_ttl_s=60)
    for _ in range(4):
        await anyio.sleep(0.1)
        await state.renew("a", [renewed.dedup_key, finished.dedup_key], 0.3)

    assert await state.claim_orphans(10, record_ttl_s=60) == []
    assert await state.hold(renewed.dedup_key, 30) is True
    assert await state.hold(finished.dedup_key, 30) is False


# --------------------------------------------------------------------------------------------
# Outbox
# --------------------------------------------------------------------------------------------


async def test_outbox_keeps_lists_and_removes_entries(state: StateBackend) -> None:
    """put, list (oldest first, no key in the public view), retry counts, done removes."""
    await state.outbox_put(undelivered("r-1"))
    await state.outbox_put(undelivered("r-2"))
    listed = await state.outbox_list()
    await state.outbox_retry(listed[0], None, "still down")
    again = await state.outbox_list()
    await state.outbox_done(again[0])
    left = await state.outbox_list()

    assert [e.rollout_id for e in listed] == ["r-1", "r-2"]
    assert listed[0].response["error_message"] == "boom"
    assert all("tg-secret" not in json.dumps(e.public()) for e in listed)
    assert (again[0].attempts, again[0].error) == (1, "still down")
    assert [e.rollout_id for e in left] == ["r-2"]


async def test_shared_outbox_entries_come_due_for_one_replica_at_a_time(
    redis_url: str, tmp_path: Path
) -> None:
    """Redis: an entry is due after the first delay, then hidden while one replica tries it."""
    state = open_state(redis_url, outbox_dir=tmp_path)
    state.first_retry_s = 0.05  # type: ignore[attr-defined]
    try:
        await state.outbox_put(undelivered())
        early = await state.outbox_due(10, visibility_s=60)
        await anyio.sleep(0.2)
        due = await state.outbox_due(10, visibility_s=60)
        hidden = await state.outbox_due(10, visibility_s=60)
    finally:
        await state.close()

    assert early == []
    assert [e.rollout_id for e in due] == ["r-1"]
    assert due[0].api_key == "tg-secret"  # a peer can redeliver it
    assert hidden == []


async def test_memory_outbox_files_never_hold_the_key(tmp_path: Path) -> None:
    """The file outbox writes no per-rollout key (replay supplies it again)."""
    state = open_state("memory", outbox_dir=tmp_path / "outbox")
    await state.outbox_put(undelivered())

    [path] = list((tmp_path / "outbox").iterdir())
    assert "tg-secret" not in path.read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


def test_an_unknown_state_url_is_a_clear_error(tmp_path: Path) -> None:
    """Only memory and Redis URLs are accepted; the message says what is."""
    with pytest.raises(ConfigError, match=r"must be 'memory' or a Redis URL"):
        open_state("postgres://db", outbox_dir=tmp_path)


# --------------------------------------------------------------------------------------------
# The server on each backend
# --------------------------------------------------------------------------------------------


async def test_server_concurrent_duplicates_start_one_rollout(
    state_url: str, tmp_path: Path
) -> None:
    """50 concurrent identical inits: one run, one callback, the same 202 body for all."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, state=state_url) as s:
        s.gate.expect("r-1", api_key=TG_KEY)
        responses: list[httpx2.Response] = []

        async def send() -> None:
            responses.append(await s.init(init_body()))

        async with anyio.create_task_group() as tasks:
            for _ in range(50):
                tasks.start_soon(send)
        agent.release.set()
        await s.settle()

    assert [r.status_code for r in responses] == [202] * 50
    assert len({r.content for r in responses}) == 1
    assert agent.runs == ["r-1"]
    assert len(s.completions("r-1")) == 1


async def test_server_admission_and_conflicts(state_url: str, tmp_path: Path) -> None:
    """max_concurrent=1, max_queued=1: the third init is 503; a key reused for another id or
    another body is 409; the same body again gets the first 202."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, state=state_url, max_concurrent=1, max_queued=1) as s:
        first = await s.init(init_body("a"))
        await agent.started.wait()
        second = await s.init(init_body("b"))
        third = await s.init(init_body("c"))
        reused = await s.init(init_body("d", idempotency_key="a"))
        changed = await s.init(init_body("a", messages=[{"role": "user", "content": "other"}]))
        retried = await s.init(init_body("a", api_key=TG_KEY))
        health = (await s.health()).json()
        agent.release.set()
        await s.settle()

    assert [first.status_code, second.status_code, third.status_code] == [202, 202, 503]
    assert third.headers["retry-after"]
    assert reused.status_code == 409
    assert changed.status_code == 409
    assert "different request body" in changed.json()["detail"]
    assert (retried.status_code, retried.content) == (202, first.content)
    assert agent.runs == ["a", "b"]
    assert (health["state"], health["state_reachable"]) == (state_url.split(":")[0], True)
    assert len(s.raw.calls_to(COMPLETED)) == 2


def test_a_redis_url_without_the_redis_package_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the optional extra, asking for Redis is one clear error naming the extra."""
    monkeypatch.setitem(sys.modules, "redis", None)  # what a missing package looks like
    monkeypatch.delitem(sys.modules, "redis.asyncio", raising=False)
    monkeypatch.delitem(sys.modules, "osmosis_rollout.server.state.redis", raising=False)
    monkeypatch.delitem(sys.modules, "osmosis_rollout.server.state.redis_connection", raising=False)

    with pytest.raises(ConfigError, match=r"pip install 'osmosis-rollout\[redis\]'"):
        open_state("redis://127.0.0.1:6379/0", outbox_dir=tmp_path)


# --------------------------------------------------------------------------------------------
# The server on Redis: a lost store, the shared outbox
# --------------------------------------------------------------------------------------------


async def test_unreachable_redis_refuses_inits_with_503_and_health_says_so(
    tmp_path: Path,
) -> None:
    """No Redis: inits get 503 + Retry-After (never a rollout it cannot track); /health is 503
    "degraded" with the backend unreachable; no URL password in any answer."""
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    async with serving(agents.ToolAgent(), tmp_path, state=url) as s:
        response = await s.init(init_body())
        health = await s.health()

    assert response.status_code == 503
    assert response.headers["retry-after"]
    assert "unreachable" in response.json()["detail"]
    assert "hunter2" not in response.text
    assert health.status_code == 503
    assert health.json()["status"] == "degraded"
    assert (health.json()["state"], health.json()["state_reachable"]) == ("redis", False)
    assert s.raw.calls == []


async def test_an_undeliverable_callback_goes_to_the_stream_and_is_redelivered(
    tmp_path: Path, redis_url: str
) -> None:
    """Every callback attempt fails (503): the result goes to the Redis stream; a replica tries
    it again after the first delay and removes it once TrainGate takes it."""
    async with serving(agents.ToolAgent(), tmp_path, state=redis_url) as s:
        s.server.state.first_retry_s = 0.1  # type: ignore[attr-defined]
        for _ in range(4):  # the first attempt and the protocol's three retries
            s.raw.fail_next(COMPLETED, 503)
        response = await s.init(init_body())
        await s.settle()
        kept = await s.server.state.outbox_list()
        with anyio.fail_after(10):
            while not s.completions("r-1"):  # noqa: ASYNC110 - the redelivery loop is periodic
                await anyio.sleep(0.05)
        left = await s.server.state.outbox_list()

    assert response.status_code == 202
    assert [e.rollout_id for e in kept] == ["r-1"]
    assert kept[0].response["status"] == "COMPLETED"
    assert "503" in kept[0].error
    assert not (tmp_path / "outbox").exists()  # the stream, not this host's disk
    [delivered] = s.completions("r-1")
    assert delivered.status == "COMPLETED"
    assert len(s.raw.calls_to(COMPLETED)) == 5
    assert s.raw.calls_to(COMPLETED)[-1].headers["authorization"] == f"Bearer {TG_KEY}"
    assert left == []


async def test_a_burst_of_inits_waits_for_redis_connections_instead_of_failing(
    tmp_path: Path, redis_url: str
) -> None:
    """300 inits at once on Redis: every one is accepted (a burst must queue for the store's
    connections, not be refused as if the store were down), and each calls back once."""
    async with serving(agents.ToolAgent(), tmp_path, state=redis_url) as s:
        statuses: list[int] = []

        async def send(i: int) -> None:
            body = init_body(f"burst-{i}", metadata={"no_chat": True})
            statuses.append((await s.init(body)).status_code)

        async with anyio.create_task_group() as tasks:
            for i in range(300):
                tasks.start_soon(send, i)
        await s.settle()

    assert statuses == [202] * 300
    assert all(len(s.completions(f"burst-{i}")) == 1 for i in range(300))


async def test_a_replica_that_stalled_past_its_lease_does_not_send_a_second_callback(
    tmp_path: Path, redis_url: str
) -> None:
    """An agent blocks the event loop longer than the lease TTL: renewals stop, and a peer (a
    thread with its own connection) claims the orphan meanwhile, as a live replica would. When
    the server wakes it must not send its own result: the rollout ends once, by the peer."""
    claimed: list[LeasedRollout] = []

    async def peer() -> None:
        state = open_state(redis_url, outbox_dir=tmp_path / "peer")
        try:
            with anyio.move_on_after(10):
                while not claimed:
                    claimed.extend(await state.claim_orphans(10, record_ttl_s=60))
                    await anyio.sleep(0.02)
        finally:
            await state.close()

    sweeping = threading.Thread(target=anyio.run, args=(peer,), daemon=True)
    async with serving(agents.Blocking(), tmp_path, state=redis_url, lease_ttl_s=0.5) as s:
        response = await s.init(init_body(metadata={"block_s": 1.5}))
        sweeping.start()
        await s.settle()
        await anyio.to_thread.run_sync(sweeping.join, 10)

    assert response.status_code == 202
    assert [o.rollout_id for o in claimed] == ["r-1"]
    assert s.raw.calls_to(COMPLETED) == []  # the peer's ERROR is the rollout's one callback


def test_a_file_outbox_entry_never_holds_a_password_of_its_url(tmp_path: Path) -> None:
    """A server_url with ``user:password@`` is written with the password as ***."""
    response = RolloutResponse(rollout_id="pw-1", status=RolloutStatus.ERROR)
    path = write_outbox(
        tmp_path, "http://trainer:pw-hunter2@tg.test:9", response, "failed", protocol="v1"
    )
    text = path.read_text(encoding="utf-8")
    assert "pw-hunter2" not in text
    assert json.loads(text)["server_url"] == "http://trainer:***@tg.test:9"
