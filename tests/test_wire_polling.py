"""The polling wire (osmosis-ai 0.3.3+) on ``osmosis serve``'s app, real sockets on 127.0.0.1.

The server (``create_app`` under uvicorn, in a thread) serves v1, v2 and polling at once; the
chat turns go to ``tests/v2_gate.py``'s gate. Checked: the 202 and result bodies, the long
poll (early on a status change, the status at the wait's end), the lease (each poll renews
it, a wrong one is a 403, one that runs out ends the rollout ``lease_expired`` and frees its
slot), repeated reads, cancel, ``grade: false``, the shared ``POST /rollout`` rule, the bounded
422s and ``/health``'s lifecycle.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from pydantic import SecretStr

from osmosis_rollout import RolloutContext, RolloutResult
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.server import create_app
from osmosis_rollout.server.core import RolloutServer
from osmosis_rollout.server.wire.polling import Polling

from .gates import ADD_CALL, ANSWER
from .processes import REPO, clean_env, osmosis_serve
from .support import load_asset, serve_in_thread, wait_until
from .v2_gate import LLM_KEY, V2Gate, v2_init

pytestmark = pytest.mark.anyio

agents = load_asset("srv_agents")
SERVER_KEY = "server-key-poll-0001"
AUTH = {"Authorization": f"Bearer {SERVER_KEY}"}
LEASE = "X-Osmosis-Rollout-Lease"
RESULT_KEYS = {"rollout_id", "status", "sample", "err_message", "err_category"}


class GradedAgent(agents.ToolAgent):  # type: ignore[name-defined,misc]
    """The tool agent with a grader: 1.0 when the answer holds the label."""

    name = "poll-graded"

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> float:
        meta = ctx.request.metadata
        if meta.get("grade_raises"):
            raise ValueError("the grader broke")
        answer = str(result.final_messages[-1].get("content") or "")
        return 1.0 if str(meta.get("ground_truth")) in answer else 0.0


def polling_init(gate_url: str, rollout_id: str, **overrides: Any) -> dict[str, Any]:
    """What ``RolloutClient.run_rollout`` posts: v2's body without callbacks or controller key."""
    body = v2_init(gate_url, rollout_id, grade=True, extra_fields=None)
    for name in ("controller_api_key", "completion_callback_url", "grader_callback_url"):
        del body[name]
    body.update(overrides)
    return body


@dataclass
class Setup:
    url: str
    gate: V2Gate
    http: httpx2.AsyncClient
    server: RolloutServer

    async def start(self, rid: str, **overrides: Any) -> httpx2.Response:
        body = polling_init(self.gate.url, rid, **overrides)
        return await self.http.post(f"{self.url}/rollout", json=body, headers=AUTH)

    async def lease(self, rid: str, **overrides: Any) -> str:
        response = await self.start(rid, **overrides)
        assert response.status_code == 202, response.text
        return str(response.json()["polling_lease_token"])

    async def poll(self, rid: str, lease: str | None, **headers: str) -> httpx2.Response:
        sent = {**AUTH, **headers}
        if lease is not None:
            sent[LEASE] = lease
        return await self.http.get(f"{self.url}/rollout/{rid}/result", headers=sent)

    async def result(self, rid: str, lease: str, timeout_s: float = 15) -> dict[str, Any]:
        """Poll until the rollout ends, as the SDK's client does (a 503 is retried); the final
        body."""
        with anyio.fail_after(timeout_s):
            while True:
                response = await self.poll(rid, lease)
                if response.status_code == 503:
                    await anyio.sleep(0.25)
                    continue
                assert response.status_code == 200, response.text
                body = dict(response.json())
                assert set(body) == RESULT_KEYS
                if body["status"] in ("success", "failure", "cancelled"):
                    return body

    def polling(self) -> Polling:
        return next(w for w in self.server.wires if isinstance(w, Polling))


@contextlib.asynccontextmanager
async def served(
    agent: Any = None, *, replies: list[dict[str, Any]] | None = None, **options: Any
) -> AsyncIterator[Setup]:
    gate = V2Gate(replies=list(replies or [ADD_CALL, ANSWER]))
    values: dict[str, Any] = {"api_key": SecretStr(SERVER_KEY), "shutdown_grace_s": 0.0}
    values.update(options)
    app = create_app(agent or GradedAgent(), settings=ServerSettings(**values))
    with serve_in_thread(gate.app()) as gate_url, serve_in_thread(app, lifespan="on") as url:
        gate.url = gate_url
        async with httpx2.AsyncClient(timeout=20) as http:
            yield Setup(url, gate, http, app.state.rollout_server)


async def test_success_answers_the_sdk_shapes_and_a_repeated_read_is_the_same() -> None:
    async with served() as s:
        response = await s.start("ok-1")
        accepted = response.json()
        final = await s.result("ok-1", accepted["polling_lease_token"])
        again = await s.poll("ok-1", accepted["polling_lease_token"])

    assert response.status_code == 202
    assert set(accepted) == {
        "rollout_id", "status", "polling_lease_token", "result_wait_timeout_sec",
        "polling_lease_timeout_sec",
    }  # fmt: skip
    assert accepted["rollout_id"] == "ok-1"
    assert accepted["status"] == "queued"
    assert accepted["polling_lease_timeout_sec"] > accepted["result_wait_timeout_sec"] > 0
    assert final["status"] == "success"
    assert final["err_message"] is None
    assert final["err_category"] is None
    sample = final["sample"]
    assert (sample["reward"], sample["label"], sample["remove_sample"]) == (1.0, "7", False)
    assert sample["messages"][-1]["content"] == "3 + 4 = 7"
    assert again.status_code == 200
    assert again.json() == final
    chats = s.gate.chats["ok-1"]
    assert len(chats) == 2
    assert all(call.authorization == f"Bearer {LLM_KEY}" for call in chats)
    assert "ok-1" not in s.gate.completions  # nothing is called back


async def test_the_lease_guards_the_result_route() -> None:
    async with served() as s:
        lease = await s.lease("guarded")
        wrong = await s.poll("guarded", lease[:-1] + ("A" if lease[-1] != "A" else "B"))
        missing = await s.poll("guarded", None)
        unknown = await s.poll("nobody", lease)
        no_key = await s.http.get(f"{s.url}/rollout/guarded/result", headers={LEASE: lease})
        final = await s.result("guarded", lease)
        wrong_after = await s.poll("guarded", "not-the-lease")

    assert wrong.status_code == 403
    assert lease not in wrong.text
    assert missing.status_code == 422
    assert unknown.status_code == 404
    assert no_key.status_code == 401
    assert final["status"] == "success"
    assert wrong_after.status_code == 403


async def test_a_repeated_id_is_a_409_even_with_the_same_body() -> None:
    async with served() as s:
        first = await s.start("twice")
        second = await s.start("twice")
        other = await s.start("twice", label="8")
        await s.result("twice", first.json()["polling_lease_token"])
        after = await s.start("twice")

    assert first.status_code == 202
    assert second.status_code == other.status_code == after.status_code == 409
    assert "polling_lease_token" not in second.text


async def test_a_long_poll_waits_and_wakes_on_a_status_change() -> None:
    """A poll while queued is answered as soon as the rollout runs; one while it runs waits
    the whole result wait, then answers the status."""
    async with served(poll_wait_s=0.6, poll_lease_s=5.0, max_concurrent=1) as s:
        blocker = await s.lease("blocker", metadata={"no_chat": True, "sleep_s": 0.3})
        queued = await s.lease("queued", metadata={"no_chat": True, "sleep_s": 3})
        started = time.monotonic()
        first = (await s.poll("queued", queued)).json()
        woke_after = time.monotonic() - started
        started = time.monotonic()
        second = (await s.poll("queued", queued)).json()
        waited = time.monotonic() - started
        await s.result("blocker", blocker)

    assert first["status"] == "running"
    assert woke_after < 0.55
    assert second["status"] == "running"
    assert waited >= 0.55


async def test_a_lease_nobody_renews_ends_the_rollout_and_frees_its_slot() -> None:
    async with served(poll_wait_s=0.2, poll_lease_s=0.5, max_concurrent=1) as s:
        lease = await s.lease("lost", metadata={"no_chat": True, "sleep_s": 30})
        await wait_until(lambda: not s.server.registry.by_id, 5)
        next_one = await s.lease("next", metadata={"no_chat": True})
        lost = await s.poll("lost", lease)
        done = await s.result("next", next_one)

    assert lost.status_code == 200
    assert lost.json() == {
        "rollout_id": "lost",
        "status": "failure",
        "sample": None,
        "err_message": "polling lease expired",
        "err_category": "lease_expired",
    }
    assert done["status"] == "success"


async def test_each_poll_renews_the_lease() -> None:
    async with served(poll_wait_s=0.2, poll_lease_s=0.5) as s:
        lease = await s.lease("kept", metadata={"no_chat": True, "sleep_s": 1.5})
        final = await s.result("kept", lease)

    assert final["status"] == "success"


async def test_cancel_is_shared_with_v2_and_ends_cancelled() -> None:
    async with served() as s:
        lease = await s.lease("stop-me", metadata={"no_chat": True, "sleep_s": 30})
        v2 = await s.http.post(
            f"{s.url}/rollout",
            json=v2_init(s.gate.url, "v2-stop", metadata={"no_chat": True, "sleep_s": 30}),
            headers=AUTH,
        )
        await anyio.sleep(0.2)
        cancelled = await s.http.post(
            f"{s.url}/rollout/cancel", json={"ids": ["stop-me", "v2-stop", "nope"]}, headers=AUTH
        )
        final = await s.result("stop-me", lease)
        both = await s.http.post(f"{s.url}/rollout/cancel", json={}, headers=AUTH)

    assert v2.status_code == 202
    assert v2.json() == {"rollout_id": "v2-stop"}
    assert cancelled.json() == {
        "dispositions": {
            "stop-me": "cancelled_running",
            "v2-stop": "cancelled_running",
            "nope": "not_found",
        }
    }
    assert final["status"] == "cancelled"
    assert final["err_category"] is None
    assert final["sample"]["reward"] is None
    assert both.status_code == 422


async def test_an_agent_that_raises_ends_failure_with_agent_error() -> None:
    async with served() as s:
        lease = await s.lease("boom", metadata={"raise_after_tools": True})
        final = await s.result("boom", lease)

    assert final["status"] == "failure"
    assert final["err_category"] == "agent_error"
    assert "the calculator broke" in final["err_message"]


async def test_grade_false_skips_the_grader_and_keeps_the_agents_reward() -> None:
    async with served() as s:
        lease = await s.lease("ungraded", grade=False, metadata={"grade_raises": True})
        final = await s.result("ungraded", lease)

    assert final["status"] == "success"
    assert final["sample"]["reward"] == 1.0  # run()'s own; the raising grader never ran


async def test_post_rollout_tells_v2_and_polling_apart_by_the_body() -> None:
    async with served() as s:
        v2 = await s.http.post(f"{s.url}/rollout", json=v2_init(s.gate.url, "v2-a"), headers=AUTH)
        null_callback = polling_init(s.gate.url, "v2-b", completion_callback_url=None)
        v2_null = await s.http.post(f"{s.url}/rollout", json=null_callback, headers=AUTH)
        no_id = polling_init(s.gate.url, "x")
        del no_id["rollout_id"]
        polling_no_id = await s.http.post(f"{s.url}/rollout", json=no_id, headers=AUTH)
        mention = polling_init(
            s.gate.url,
            "p-a",
            initial_messages=[{"role": "user", "content": '"completion_callback_url"'}],
        )
        polling = await s.http.post(f"{s.url}/rollout", json=mention, headers=AUTH)

    assert v2.status_code == 202
    assert v2.json() == {"rollout_id": "v2-a"}
    assert v2_null.status_code == 422
    assert [e["loc"] for e in v2_null.json()["detail"]] == [["body", "completion_callback_url"]]
    assert polling_no_id.status_code == 422
    assert [e["loc"] for e in polling_no_id.json()["detail"]] == [["body", "rollout_id"]]
    assert polling.status_code == 202
    assert "polling_lease_token" in polling.json()


async def test_bad_inits_get_bounded_422s_that_echo_nothing() -> None:
    async with served(max_metadata_bytes=1000) as s:
        secret = "sk-secret-llm-key-value"
        infinite = await s.http.post(
            f"{s.url}/rollout",
            content=json.dumps(polling_init(s.gate.url, "inf", llm_api_key=secret)).replace(
                '"agent_timeout_sec": 30', '"agent_timeout_sec": 1e999'
            ),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        metadata = await s.start("meta", metadata={"ground_truth": "x" * 5000}, llm_api_key=secret)
        where = await s.start("where", chat_completions_url="http://169.254.169.254/v1")
        slash = await s.start("a/b")

    assert infinite.status_code == 422
    assert [e["loc"] for e in infinite.json()["detail"]] == [["body", "agent_timeout_sec"]]
    for response in (infinite, metadata, where, slash):
        assert response.status_code == 422, response.text
        assert secret not in response.text
        assert len(response.content) < 5000
    assert where.json()["detail"][0]["loc"] == ["body", "chat_completions_url"]


async def test_health_has_the_sdks_lifecycle() -> None:
    async with served() as s:
        lease = await s.lease("h", metadata={"no_chat": True, "sleep_s": 0.5})
        busy = (await s.http.get(f"{s.url}/health")).json()
        await s.result("h", lease)
        idle = (await s.http.get(f"{s.url}/health")).json()

    assert busy["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 1}
    assert idle["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 0}
    assert isinstance(idle["process_id"], str)
    assert idle["process_id"] == busy["process_id"]


async def test_parked_polls_are_bounded() -> None:
    async with served(poll_wait_s=1.0) as s:
        s.polling().results.max_parked = 1
        lease = await s.lease("parked", metadata={"no_chat": True, "sleep_s": 1.5})
        await anyio.sleep(0.3)  # running already: the first poll waits for the result
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(s.poll, "parked", lease)
            await anyio.sleep(0.1)
            over = await s.poll("parked", lease)
        final = await s.result("parked", lease)

    assert over.status_code == 503
    assert over.headers["Retry-After"] == "1"
    assert final["status"] == "success"


@pytest.mark.slow
async def test_a_drain_keeps_answering_result_polls_until_it_ends(tmp_path: Path) -> None:
    """``osmosis serve`` on SIGTERM: new inits get 503, a finished result is read again, a
    poll parked on a running rollout is answered when it ends within the grace; then exit."""
    env = clean_env(OSMOSIS_API_KEY=SERVER_KEY, OSMOSIS_SHUTDOWN_GRACE_S="20")
    args = [f"{REPO}/tests/assets/srv_agents.py:ToolAgent", "--port", "0", "--no-validate"]
    with osmosis_serve(tmp_path / "serve.log", *args, env=env) as served:
        async with httpx2.AsyncClient(base_url=served.url, headers=AUTH, timeout=30) as http:

            async def start(rid: str, sleep_s: float) -> str:
                body = polling_init("http://127.0.0.1:9", rid, metadata={"no_chat": True})
                body["metadata"]["sleep_s"] = sleep_s
                response = await http.post("/rollout", json=body)
                assert response.status_code == 202, response.text
                return str(response.json()["polling_lease_token"])

            async def poll(rid: str, lease: str) -> httpx2.Response:
                return await http.get(f"/rollout/{rid}/result", headers={LEASE: lease})

            fast = await start("fast", 0)
            while (first := await poll("fast", fast)).json()["status"] != "success":
                pass
            slow = await start("slow", 2)
            served.proc.send_signal(signal.SIGTERM)
            await anyio.sleep(0.3)
            late = await http.post("/rollout", json=polling_init("http://127.0.0.1:9", "late"))
            again = await poll("fast", fast)
            started = time.monotonic()
            parked = await poll("slow", slow)
            waited = time.monotonic() - started
        served.proc.wait(timeout=30)

    assert late.status_code == 503
    assert again.status_code == 200
    assert again.content == first.content
    assert parked.status_code == 200
    assert parked.json()["status"] == "success"
    assert waited < 5


async def test_workers_sharing_a_port_refuse_polling_inits() -> None:
    """With --workers each process has its own results: a poll could reach another one."""
    async with served(workers=2) as s:
        polling = await s.start("worked")

    assert polling.status_code == 422
    assert "--state redis://" in polling.json()["detail"][0]["msg"]


@contextlib.asynccontextmanager
async def replicas(redis_url: str, **options: Any) -> AsyncIterator[tuple[Setup, Setup]]:
    """Two servers (as two replicas) sharing one Redis, with one chat gate."""
    async with (
        served(state=redis_url, lease_ttl_s=10.0, **options) as a,
        served(state=redis_url, lease_ttl_s=10.0, **options) as b,
    ):
        yield a, b


async def test_any_replica_answers_a_result_poll_and_a_cancel(redis_url: str) -> None:
    async with replicas(redis_url, poll_wait_s=1.0, poll_lease_s=3.0) as (a, b):
        lease = await a.lease("spread", metadata={"no_chat": True, "sleep_s": 0.5})
        final = await b.result("spread", lease)
        again = await a.poll("spread", lease)
        wrong = await b.poll("spread", "not-the-lease")
        unknown = await b.poll("nobody", lease)
        repeated = await b.start("spread")
        stop = await a.lease("stop-b", metadata={"no_chat": True, "sleep_s": 30})
        await anyio.sleep(0.3)
        cancelled = await b.http.post(
            f"{b.url}/rollout/cancel", json={"ids": ["stop-b"]}, headers=AUTH
        )
        stopped = await b.result("stop-b", stop)

    assert final["status"] == "success"
    assert final["sample"]["reward"] == 0.0  # graded on A: "nothing to ask" is not "7"
    assert again.json() == final
    assert wrong.status_code == 403
    assert unknown.status_code == 404
    assert repeated.status_code == 409
    assert "<lease token>" not in repeated.text
    assert cancelled.json() == {"dispositions": {"stop-b": "cancelled_running"}}
    assert stopped["status"] == "cancelled"


async def test_polls_reaching_another_replica_keep_the_lease(redis_url: str) -> None:
    """Only replica B is polled: A, which runs the rollout, must not end it at the lease."""
    async with replicas(redis_url, poll_wait_s=0.3, poll_lease_s=1.0) as (a, b):
        lease = await a.lease("kept-b", metadata={"no_chat": True, "sleep_s": 2.5})
        final = await b.result("kept-b", lease)
        gone = await a.lease("gone-b", metadata={"no_chat": True, "sleep_s": 30})
        await wait_until(lambda: "gone-b" not in a.server.registry.by_id, 10)
        lapsed = await b.poll("gone-b", gone)

    assert final["status"] == "success"
    assert lapsed.json()["err_category"] == "lease_expired"


@pytest.mark.slow
async def test_a_replica_killed_leaves_its_rollouts_readable_from_the_others(
    tmp_path: Path, redis_url: str
) -> None:
    """``kill -9`` of the replica running a rollout: a survivor ends it ``failure`` within the
    lease TTL, under the same lease; a result it had finished is still read from the survivor."""
    env = clean_env(
        OSMOSIS_API_KEY=SERVER_KEY,
        OSMOSIS_STATE=redis_url,
        OSMOSIS_LEASE_TTL_S="2",
        OSMOSIS_POLL_WAIT_S="1",
        OSMOSIS_POLL_LEASE_S="30",
    )
    args = [f"{REPO}/tests/assets/srv_agents.py:ToolAgent", "--port", "0", "--no-validate"]

    def body(rid: str, sleep_s: float) -> dict[str, Any]:
        return polling_init(
            "http://127.0.0.1:9", rid, metadata={"no_chat": True, "sleep_s": sleep_s}
        )

    with (
        osmosis_serve(tmp_path / "a.log", *args, env=env) as a,
        osmosis_serve(tmp_path / "b.log", *args, env=env) as b,
    ):
        async with httpx2.AsyncClient(headers=AUTH, timeout=30) as http:
            leases = {}
            for rid, sleep_s in (("done-a", 0), ("lost-a", 60)):
                response = await http.post(f"{a.url}/rollout", json=body(rid, sleep_s))
                assert response.status_code == 202, response.text
                leases[rid] = {LEASE: response.json()["polling_lease_token"]}
            done = await http.get(f"{a.url}/rollout/done-a/result", headers=leases["done-a"])
            while done.json()["status"] != "success":
                done = await http.get(f"{a.url}/rollout/done-a/result", headers=leases["done-a"])
            a.proc.kill()
            a.proc.wait(timeout=10)
            again = await http.get(f"{b.url}/rollout/done-a/result", headers=leases["done-a"])
            with anyio.fail_after(20):
                while True:
                    lost = await http.get(
                        f"{b.url}/rollout/lost-a/result", headers=leases["lost-a"]
                    )
                    if lost.status_code == 200 and lost.json()["status"] == "failure":
                        break
                    assert lost.status_code in (200, 503), lost.text
                    await anyio.sleep(0.2)
            twice = await http.get(f"{b.url}/rollout/lost-a/result", headers=leases["lost-a"])

    assert again.status_code == 200
    assert again.content == done.content
    assert lost.json()["err_category"] == "agent_error"
    assert "stopped" in lost.json()["err_message"]
    assert twice.content == lost.content
