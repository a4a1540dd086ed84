"""``osmosis serve`` as a subprocess on 127.0.0.1, driven by a MockTrainGate on a real uvicorn.

Every byte crosses real sockets: the gate (a ``RecordingGate`` around ``MockTrainGate``, run by
``Harness(server_url=...)``) records the raw chat requests and callbacks the server sends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import pytest

from osmosis_rollout.protocol import RolloutRequest
from osmosis_rollout.server import bind_socket
from osmosis_rollout.testing import Harness, MockTrainGate, ScriptedBackend
from osmosis_rollout.testing.harness import MOCK_API_KEY

from .gates import ADD_CALL, ANSWER, CHAT, COMPLETED, RecordingGate
from .processes import REPO, ServeProcess, clean_env, osmosis_serve
from .support import has_stray_null

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

AGENT = f"{REPO / 'tests' / 'assets' / 'srv_agents.py'}:ToolAgent"
SERVER_KEY = "uvicorn-server-key-42"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One ``osmosis serve`` for the module, its key given through ``OSMOSIS_API_KEY``."""
    tmp = tmp_path_factory.mktemp("served")
    with osmosis_serve(
        tmp / "server.log",
        AGENT,
        "--port",
        "0",
        "--no-validate",
        "--outbox-dir",
        str(tmp / "outbox"),
        env=clean_env(OSMOSIS_API_KEY=SERVER_KEY),
    ) as server:
        yield server


def recording_gate(
    replies: list[dict[str, Any]] | None = None,
) -> tuple[MockTrainGate, RecordingGate]:
    """A MockTrainGate whose app is wrapped so raw requests are recorded."""
    gate = MockTrainGate(ScriptedBackend(list(replies or [ADD_CALL, ANSWER])))
    raw = RecordingGate(gate.app)
    gate.app = raw  # type: ignore[assignment]  # any ASGI app will do for the listener
    return gate, raw


# --------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------

PARAMS = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 64, "stop": "</s>", "seed": None}


async def test_tool_rollout_end_to_end_matches_the_protocol_field_by_field(
    served: ServeProcess,
) -> None:
    """Chat requests and the callback on the wire match protocol.md sections 3 and 4."""
    gate, raw = recording_gate()
    user = {"role": "user", "content": "What is 3 + 4?"}
    async with Harness(server_url=served.url, gate=gate, server_key=SERVER_KEY) as harness:
        outcome = await harness.run([user], rollout_id="e2e-1", completion_params=PARAMS)

    assert outcome.init_status == 202
    assert outcome.findings == []
    assert [t["function"]["name"] for t in outcome.init_body["tools"]] == ["add", "note"]
    assert "description" not in outcome.init_body["tools"][1]["function"]

    chats = raw.calls_to(CHAT)
    assert len(chats) == 2
    bodies = [c.json() for c in chats]
    for i, (call, body) in enumerate(zip(chats, bodies, strict=True), start=1):
        assert call.headers["authorization"] == f"Bearer {MOCK_API_KEY}"
        assert call.headers["content-type"] == "application/json"
        assert call.headers["x-request-id"] == f"e2e-1:{i}"
        assert body["rollout_id"] == "e2e-1"
        assert body["model"] == "default"
        assert body["logprobs"] is True
        assert body["stop"] == ["</s>"]
        assert body["top_p"] == 0.9
        assert body["max_tokens"] == 64
        assert "tools" not in body
        assert "seed" not in body  # a null completion param is dropped, not sent as null
        assert not has_stray_null(body)  # only a tool-call turn's content: null
    assert bodies[0]["temperature"] == 0.7
    assert bodies[1]["temperature"] == 0.2  # the agent's per-call override wins
    assert bodies[0]["messages"] == [user]
    first_reply = {"role": "assistant", **ADD_CALL}  # content: null kept, as the legacy SDK
    assert bodies[1]["messages"][:2] == [user, first_reply]  # append-only
    assert bodies[1]["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "7"}

    [callback] = raw.calls_to(COMPLETED)
    assert callback.headers["authorization"] == f"Bearer {MOCK_API_KEY}"
    assert callback.headers["x-request-id"] == "e2e-1:completed"
    result = callback.json()
    assert not has_stray_null(result)
    assert set(result) == {
        "rollout_id",
        "status",
        "final_messages",
        "finish_reason",
        "reward",
        "metrics",
        "extra_fields",
    }
    assert result["rollout_id"] == "e2e-1"
    assert result["status"] == "COMPLETED"
    assert result["finish_reason"] == "stop"
    assert result["reward"] == 1.0
    assert result["extra_fields"] == {}
    assert result["final_messages"] == [
        *bodies[1]["messages"],
        {"role": "assistant", "content": "3 + 4 = 7"},
    ]
    metrics = result["metrics"]
    assert metrics["num_llm_calls"] == 2
    assert metrics["num_tool_calls"] == 1
    assert metrics["tool_latency_ms"] == 1.5
    assert metrics["prompt_tokens"] == sum(r.usage.prompt_tokens for r in outcome.record.replies)
    assert metrics["response_tokens"] == sum(
        r.usage.completion_tokens for r in outcome.record.replies
    )
    assert metrics["max_context_tokens"] == max(
        r.usage.prompt_tokens for r in outcome.record.replies
    )
    assert metrics["total_latency_ms"] >= metrics["llm_latency_ms"] > 0
    assert "queue_latency_ms" in metrics


async def test_serve_runs_on_uvloop_and_httptools_and_says_so(served: ServeProcess) -> None:
    """The fast stack is what serves rollouts (not just what the banner claims): the agent
    runs on uvloop's event loop, and the banner names the stack."""
    gate, raw = recording_gate()
    async with Harness(server_url=served.url, gate=gate, server_key=SERVER_KEY) as harness:
        outcome = await harness.run(
            [{"role": "user", "content": "hi"}],
            rollout_id="loop-1",
            metadata={"no_chat": True, "report_loop": True},
        )

    assert outcome.init_status == 202
    [callback] = raw.calls_to(COMPLETED)
    assert callback.json()["final_messages"][-1]["content"] == "uvloop"
    assert "http          uvicorn on uvloop + httptools" in served.output()


async def test_without_uvloop_and_httptools_serve_falls_back_to_pure_python(
    tmp_path: Path,
) -> None:
    """Where the compiled parts cannot be imported, the same server runs on asyncio + h11."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for module in ("uvloop", "httptools"):
        (blocked / f"{module}.py").write_text("raise ImportError('not on this machine')\n")
    env = clean_env(PYTHONPATH=os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")]))
    args = [AGENT, "--port", "0", "--no-validate", "--outbox-dir", str(tmp_path / "outbox")]
    gate, raw = recording_gate()
    with osmosis_serve(tmp_path / "server.log", *args, env=env) as server:
        async with Harness(server_url=server.url, gate=gate) as harness:
            outcome = await harness.run(
                [{"role": "user", "content": "hi"}],
                rollout_id="loop-2",
                metadata={"no_chat": True, "report_loop": True},
            )
        output = server.output()

    assert outcome.init_status == 202
    [callback] = raw.calls_to(COMPLETED)
    assert callback.json()["final_messages"][-1]["content"].startswith("asyncio")
    assert "http          uvicorn on asyncio + h11 (pure-Python fallback)" in output


async def test_platform_health_and_auth_use_the_key_from_the_environment(
    served: ServeProcess,
) -> None:
    """OSMOSIS_API_KEY turns auth on: /platform/health and init need it."""
    async with httpx2.AsyncClient(base_url=served.url) as http:
        good = await http.get("/platform/health", headers={"Authorization": SERVER_KEY})
        bad = await http.get("/platform/health", headers={"Authorization": "Bearer no"})
        init = await http.post("/v1/rollout/init", content=b"{}")

    assert good.status_code == 200
    assert good.json()["agent_loop"] == "srv-tools"
    assert bad.status_code == 401
    assert init.status_code == 401
    assert "auth          on (Bearer key required)" in served.output()
    assert SERVER_KEY not in served.output()


async def test_transient_traingate_errors_are_retried_over_the_wire(served: ServeProcess) -> None:
    """429 + Retry-After on a chat turn and 500 on the callback: retried, one callback."""
    gate, raw = recording_gate()
    raw.fail_next(CHAT, 429, {"Retry-After": "0"})
    raw.fail_next(COMPLETED, 500)
    user = {"role": "user", "content": "What is 3 + 4?"}
    async with Harness(server_url=served.url, gate=gate, server_key=SERVER_KEY) as harness:
        outcome = await harness.run([user], rollout_id="faulty-1", timeout_s=20)

    assert outcome.findings == []
    assert [c.headers["x-request-id"] for c in raw.calls_to(CHAT)] == [
        "faulty-1:1",
        "faulty-1:1",
        "faulty-1:2",
    ]
    assert len(raw.calls_to(COMPLETED)) == 2
    assert len(outcome.record.completions) == 1
    assert outcome.record.completions[0].status == "COMPLETED"
    assert "WARNING:  POST http://127.0.0.1:" in served.output()  # our loggers reach the log
    assert "/v1/rollout/completed returned HTTP 500; retry 1/3" in served.output()


async def test_thousand_rollouts_at_once_each_get_one_callback(served: ServeProcess) -> None:
    """1,000 inits at once (max_concurrent=100): all complete, one callback each, no errors."""
    gate = MockTrainGate(ScriptedBackend([ANSWER]))  # its records count every callback
    log_before = len(served.output())
    async with Harness(server_url=served.url, gate=gate, server_key=SERVER_KEY) as harness:
        assert harness.server_http is not None
        http = harness.server_http
        completed_before = (await http.get("/health")).json()["completed_rollouts"]
        statuses: list[int] = []

        async def start(i: int) -> None:
            request = RolloutRequest.model_validate(
                {
                    "rollout_id": f"load-{i}",
                    "server_url": gate.base_url,
                    "messages": [{"role": "user", "content": f"q{i}"}],
                    "completion_params": {},
                    "api_key": MOCK_API_KEY,
                }
            )
            _, response = await gate.init_rollout(http, request, server_key=SERVER_KEY)
            statuses.append(response.status_code)

        with anyio.fail_after(40):
            async with anyio.create_task_group() as tasks:
                for i in range(1000):
                    tasks.start_soon(start, i)
            for i in range(1000):
                await gate.records[f"load-{i}"].done.wait()
            # The server counts a rollout done once the gate's 200 reaches it, a moment after
            # the gate recorded the callback; across processes there is no event to wait on.
            while (health := (await http.get("/health")).json())["active_rollouts"]:  # noqa: ASYNC110
                await anyio.sleep(0.02)

    assert statuses == [202] * 1000
    assert all(len(gate.records[f"load-{i}"].completions) == 1 for i in range(1000))
    assert all(r.completions[0].status == "COMPLETED" for r in gate.records.values())
    assert gate.findings == []  # no duplicate_completion, no unknown rollout
    assert health["queued_rollouts"] == 0
    assert health["completed_rollouts"] - completed_before == 1000
    new_log = served.output()[log_before:]
    assert "ERROR" not in new_log
    assert "Traceback" not in new_log


# --------------------------------------------------------------------------------------------
# SIGTERM with rollouts in flight
# --------------------------------------------------------------------------------------------


async def test_sigterm_drains_then_cancels_with_one_callback_each(tmp_path: Path) -> None:
    """SIGTERM: 503 draining during the grace period, quick rollouts finish, slow ones cancel."""
    gate, raw = recording_gate()
    with osmosis_serve(
        tmp_path / "server.log",
        AGENT,
        "--port",
        "0",
        "--no-validate",
        "--shutdown-grace",
        "1.5",
        "--outbox-dir",
        str(tmp_path / "outbox"),
    ) as server:
        async with Harness(server_url=server.url, gate=gate) as harness:
            assert harness.server_http is not None
            http = harness.server_http

            def request(rid: str, sleep_s: float) -> RolloutRequest:
                return RolloutRequest.model_validate(
                    {
                        "rollout_id": rid,
                        "server_url": gate.base_url,
                        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
                        "completion_params": {},
                        "metadata": {"sleep_s": sleep_s},
                        "api_key": MOCK_API_KEY,
                    }
                )

            inits = [
                await gate.init_rollout(http, request(rid, sleep))
                for rid, sleep in (("quick", 0.3), ("slow-1", 60), ("slow-2", 60))
            ]
            assert [r.status_code for _, r in inits] == [202, 202, 202]
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(5):
                while (health := await http.get("/health")).status_code == 200:  # noqa: ASYNC110
                    await anyio.sleep(0.02)  # the signal arrives asynchronously
            refused = await gate.init_rollout(http, request("late", 0))
            with anyio.fail_after(15):
                for rid in ("quick", "slow-1", "slow-2"):
                    await gate.records[rid].done.wait()
            cancelled_after = time.monotonic() - signalled
            exit_code = await anyio.to_thread.run_sync(lambda: server.proc.wait(timeout=15))

    assert health.status_code == 503
    assert health.json()["status"] == "draining"
    assert refused[1].status_code == 503
    assert refused[1].headers["retry-after"]
    assert cancelled_after >= 1.5
    quick = gate.records["quick"].completions
    assert [c.status for c in quick] == ["COMPLETED"]
    for rid in ("slow-1", "slow-2"):
        [result] = gate.records[rid].completions
        assert result.status == "ERROR"
        assert result.finish_reason == "cancelled"
        assert result.final_messages == [{"role": "user", "content": "What is 3 + 4?"}]
    assert len(raw.calls_to(COMPLETED)) == 3
    assert not gate.records["late"].completions
    assert exit_code == 0
    assert "draining: 3 running, 0 queued; grace period 1.5 s" in server.output()
    assert not (tmp_path / "outbox").exists()
    assert "Traceback" not in server.output()


def test_listening_socket_says_tcp_so_asyncio_disables_nagle() -> None:
    """bind_socket makes an IPPROTO_TCP socket: asyncio then sets TCP_NODELAY per connection.

    Without it every small response waited ~40 ms for a delayed ACK (25 requests a second).
    """
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
    finally:
        sock.close()


# -- the Python twin decides auth as the CLI does ------------------------------------------------

_TWIN = """
import sys
sys.path.insert(0, {assets!r})
from hrd_agents import Quick
from osmosis_rollout.server import bind_socket, serve

sock = bind_socket("127.0.0.1", 0)
print("port", sock.getsockname()[1], flush=True)
# host says where the server thinks it is bound: a public interface. The socket is loopback,
# so the test binds nothing public.
serve(Quick(), host={host!r}, sock=sock, shutdown_grace_s=0{extra})
"""


@contextlib.contextmanager
def _run_twin(tmp_path: Path, host: str, extra: str = "") -> Iterator[tuple[str, str]]:
    """``serve()`` in a subprocess on a loopback socket; its URL and what it printed."""
    import re
    import subprocess
    import sys

    from .processes import stop_process, wait_healthy

    log = tmp_path / "twin.log"
    script = _TWIN.format(assets=str(REPO / "tests" / "assets"), host=host, extra=extra)
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 20
        while not (found := re.search(r"port (\d+)", log.read_text(errors="replace"))):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        url = f"http://127.0.0.1:{found.group(1)}"
        wait_healthy(url, proc, log)
        yield url, log.read_text(errors="replace")
    finally:
        stop_process(proc)


@pytest.mark.slow
def test_serve_on_a_public_interface_generates_and_prints_a_key(tmp_path: Path) -> None:
    """``serve(agent, host="0.0.0.0")`` used to serve without auth where the CLI generates a
    key: now it generates one too, prints it once, and requires it."""
    import re

    with _run_twin(tmp_path, "0.0.0.0") as (url, output):
        found = re.search(r"generated one \(shown once, pass it to TrainGate\): (\S+)", output)
        assert found, output
        key = found.group(1)
        without = httpx2.get(f"{url}/platform/health", timeout=5)
        with_key = httpx2.get(
            f"{url}/platform/health", headers={"Authorization": f"Bearer {key}"}, timeout=5
        )

        assert without.status_code == 401
        assert with_key.status_code == 200
        assert len(key) >= 32


@pytest.mark.slow
def test_serve_with_no_auth_on_a_public_interface_has_no_key(tmp_path: Path) -> None:
    """``no_auth=True`` is the explicit way to serve without one."""
    with _run_twin(tmp_path, "0.0.0.0", ", no_auth=True") as (url, output):
        assert "generated" not in output
        assert httpx2.get(f"{url}/platform/health", timeout=5).status_code == 404


def test_serve_and_create_app_refuse_a_blank_key() -> None:
    """``serve(agent, api_key="")`` and ``create_app(agent, api_key=" ")``: a ``ConfigError``
    saying how to serve without a key, not a server without auth."""
    from osmosis_rollout.errors import ConfigError
    from osmosis_rollout.server import create_app, serve

    from .support import load_asset

    agent = load_asset("hrd_agents").Quick()
    with pytest.raises(ConfigError, match="no_auth=True"):
        serve(agent, api_key="")
    with pytest.raises(ConfigError, match="api_key=None"):
        create_app(agent, api_key=" ")
