"""Regressions of the second security review's low findings (issue 38), one attack each, made
small: each test fails on the code the review found."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from osmosis_rollout.protocol import RolloutResponse, RolloutStatus
from osmosis_rollout.server.state.memory import MemoryState, write_outbox
from osmosis_rollout.server.wire.v2_body import V2Init
from osmosis_rollout.tracing import Tracer, file_sink

from .support import ROOT, load_asset, load_path, serve_in_thread


def _v2_init(rollout_id: str, host: str) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": "hi"}],
        "chat_completions_url": f"http://{host}/v1/rollouts/{rollout_id}",
        "completion_callback_url": f"http://{host}/v1/rollouts/{rollout_id}/completion",
    }


@pytest.mark.parametrize("spelling", ["2130706433", "0x7f.1", "0x7f000001", "127.1"])
def test_an_odd_ipv4_host_equal_to_the_rollout_id_is_refused(spelling: str) -> None:
    """Item 8: the cached check templated the rollout id out of the whole URL, host included,
    so ``http://2130706433/...`` passed when the id was ``2130706433``."""
    with pytest.raises(ValidationError, match="four decimal numbers"):
        V2Init.model_validate(_v2_init(spelling, spelling))


@pytest.mark.parametrize(("scheme", "port"), [("http://", ""), ("HTTP://", ""), ("http://", ":80")])
def test_the_host_is_checked_as_written_however_the_url_is_spelled(scheme: str, port: str) -> None:
    """The host ends where ``urlsplit`` ends it, the scheme in any case, a port or none: the id
    in the host is never templated away (the host is found by a pattern, not ``urlsplit``)."""
    body = _v2_init("2130706433", f"2130706433{port}")
    for name in ("chat_completions_url", "completion_callback_url"):
        body[name] = body[name].replace("http://", scheme)
    with pytest.raises(ValidationError, match="four decimal numbers"):
        V2Init.model_validate(body)


def test_the_rollout_id_in_the_path_is_still_checked_once_per_shape() -> None:
    """The templating stays for the path: many ids under one controller share one check."""
    for number in range(3):
        body = V2Init.model_validate(_v2_init(f"r-{number}", "127.0.0.1:9100"))
        assert body.completion_callback_url.endswith(f"/r-{number}/completion")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_outbox_file_stays_private_after_a_failed_replay(tmp_path: Path) -> None:
    """Item 10: a failed replay rewrote the entry with ``Path.write_text``, so a ``0600``
    outbox file became ``0644`` (the conversation readable by every user of the machine)."""
    response = RolloutResponse(rollout_id="r-1", status=RolloutStatus.COMPLETED)
    path = write_outbox(tmp_path, "http://127.0.0.1:1", response, "refused", protocol="v1")
    assert _mode(path) == 0o600
    state = MemoryState(tmp_path)
    [entry] = anyio.run(state.outbox_list)
    anyio.run(state.outbox_retry, entry, None, "refused again")
    assert _mode(path) == 0o600
    assert json.loads(path.read_text())["attempts"] == 1


def test_traces_are_private_from_the_start(tmp_path: Path) -> None:
    """Item 10: traces were created ``0644``; both writers now create them ``0600``."""
    tracer = Tracer(tmp_path / "traces")
    tracer.sink("r-1")({"event": "hello"})
    tracer.close()
    file_sink(tmp_path / "sync", "r-2")({"event": "hello"})
    assert _mode(tracer.path_for("r-1")) == 0o600
    [synced] = (tmp_path / "sync").iterdir()
    assert _mode(synced) == 0o600


def test_the_harness_example_passes_on_no_server_secret() -> None:
    """Item 13: ``examples/harness`` handed the server's whole environment (the server key
    included) to the harness process; it now passes what a Python program needs to start and
    the harness's own settings."""
    module = load_path(ROOT / "examples/harness/agent.py", "harness_example_env")
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "OSMOSIS_API_KEY": "server-key",
        "AWS_SECRET_ACCESS_KEY": "cloud",
        "OPENAI_API_KEY": "the-servers-own",
        "HARNESS_TRIM_AFTER": "3",
    }
    passed = module._passed_on(environ)
    assert passed == {"PATH": "/usr/bin", "HOME": "/home/u", "HARNESS_TRIM_AFTER": "3"}


@pytest.mark.parametrize(
    "server_url", ["http://169.254.169.254", "http://metadata.google.internal", "http://[fe80::1]"]
)
def test_the_compat_llm_client_never_calls_a_metadata_service(server_url: str) -> None:
    """Item 11: the legacy ``OsmosisLLMClient`` had no destination policy and POSTed the
    rollout's key to 169.254.169.254. It is refused before any connection, key unsent."""
    from osmosis_rollout.compat import OsmosisLLMClient
    from osmosis_rollout.errors import TrainGateError

    async def call() -> None:
        client = OsmosisLLMClient(server_url, "r-1", api_key="rollout-key", max_retries=0)
        try:
            await client.chat_completions([{"role": "user", "content": "hi"}])
        finally:
            await client.close()

    with pytest.raises(TrainGateError) as caught:
        anyio.run(call)
    assert "rollout-key" not in str(caught.value)
    assert "metadata" in str(caught.value) or "link-local" in str(caught.value)


def test_a_remote_ref_in_a_tool_schema_is_never_fetched() -> None:
    """Item 4: ``jsonschema`` fetched a remote ``$ref`` with a blocking ``urlopen`` on the
    event loop, outside the destination policy (a hostile MCP schema made the server GET
    169.254.169.254). The reference is refused by name; nothing is requested."""
    from osmosis_rollout.errors import ToolError
    from osmosis_rollout.tools.arguments import validate_arguments
    from osmosis_rollout.tools.checks import tool_problems

    hits: list[str] = []

    async def anything(request: Any) -> Response:
        hits.append(request.url.path)
        return Response("{}", media_type="application/json")

    app = Starlette(routes=[Route("/{p:path}", anything)])
    with serve_in_thread(app) as url:
        tool = {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a thing up.",
                "parameters": {
                    "type": "object",
                    "properties": {"q": {"$ref": f"{url}/schema.json"}},
                },
            },
        }
        with pytest.raises(ToolError, match=r"reference|points outside"):
            validate_arguments(tool, {"q": "x"})
        checked = tool_problems([tool])
    assert hits == []
    assert any(
        p.code == "TOOL_SCHEMA_INVALID" and "points outside" in p.message for p in checked.problems
    )


_CATASTROPHIC = r"""
import json, sys, time
from osmosis_rollout.errors import ToolError
from osmosis_rollout.tools.arguments import validate_arguments

tool = {"name": "t", "parameters": {"type": "object", "properties": {
    "one": {"type": "string", "pattern": "^(a+)+$"},
    "many": {"type": "array", "items": {"type": "string", "pattern": "^(a|aa)+$"}},
}}}
started = time.monotonic()
outcomes = []
for args in ({"one": "a" * 40 + "!"}, {"many": ["a" * 60 + "!"] * 1000}):
    try:
        validate_arguments(tool, args)
        outcomes.append("valid")
    except ToolError as exc:
        outcomes.append(str(exc))
print(json.dumps({"s": time.monotonic() - started, "outcomes": outcomes}))
"""


def test_a_catastrophic_pattern_cannot_freeze_the_server() -> None:
    """Item 4: a tool schema's ``pattern`` ran on Python's ``re``, which holds the GIL through a
    catastrophic backtrack: ``^(a+)+$`` against 40 ``a``s and a ``!`` froze the server. Matches
    now run under a time limit per match and per check: a thousand hostile strings cost a
    fraction of a second, and the model gets an error it can read. (Run in a subprocess: the
    unbounded engine would never return.)"""
    done = subprocess.run(
        [sys.executable, "-c", _CATASTROPHIC], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["s"] < 5
    first, second = report["outcomes"]
    assert "does not match" in first or "too long" in first
    assert "too long to match" in second


def test_a_v2_llm_key_echoed_into_the_result_is_scrubbed_from_the_file_outbox(
    tmp_path: Path,
) -> None:
    """Item 9: a v2 LLM key the chat endpoint echoed into the conversation was written
    unscrubbed to the file outbox (v1's key, the same in both roles, was scrubbed)."""
    from osmosis_rollout.server.delivery import Delivery
    from osmosis_rollout.server.wire.v2_target import V2Target

    llm_key, controller_key = "llm-k-" + "7" * 24, "ctl-k-" + "8" * 24
    target = V2Target(
        "r-9",
        "http://127.0.0.1:1/v1/rollouts/r-9/completion",
        controller_key,
        grader_url=None,
        chat_url="http://127.0.0.1:1/v1/rollouts/r-9",
        llm_key=llm_key,
    )
    echoed = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": f"the key is {llm_key} and {controller_key}"},
    ]
    response = RolloutResponse(
        rollout_id="r-9", status=RolloutStatus.COMPLETED, final_messages=echoed, reward=1.0
    )
    state = MemoryState(tmp_path)
    delivery = Delivery(state, tmp_path, None)
    anyio.run(delivery.keep, target, response, f"refused by {llm_key}")
    [written] = tmp_path.glob("*.json")
    text = written.read_text()
    assert llm_key not in text
    assert controller_key not in text
    assert "the key is" in text


@pytest.mark.anyio
async def test_queued_rollouts_are_bounded_in_bytes_too(tmp_path: Path) -> None:
    """Item 12: the queue was bounded in count only (10,000 by default), so large inits could
    hold many GiB while they waited. Past ``max_queued_bytes`` of waiting init bodies a new
    init that would wait is refused like a full queue (503 with ``Retry-After``), and the place
    comes back when the queue drains."""
    from pydantic import SecretStr

    from osmosis_rollout.config import ServerSettings

    from .serving import SERVER_KEY, init_body, serving

    agent = load_asset("srv_agents").Gated()
    big = "x" * 20_000
    settings = ServerSettings(
        api_key=SecretStr(SERVER_KEY),
        max_concurrent=1,
        max_queued=100,
        max_queued_bytes=50_000,
        outbox_dir=tmp_path / "outbox",
        shutdown_grace_s=0,
    )

    def body(rollout_id: str) -> dict[str, Any]:
        return init_body(rollout_id, messages=[{"role": "user", "content": big}])

    async with serving(agent, tmp_path, settings=settings) as s:
        running = await s.init(body("a"))  # takes the slot: not queued
        await agent.started.wait()
        queued = [await s.init(body(f"q{i}")) for i in range(2)]  # ~40 KB waiting
        refused = await s.init(body("over"))
        queued_bytes = s.server.registry.queued_bytes
        agent.release.set()
        await s.settle()
        again = await s.init(body("later"))
        await s.settle()
    assert running.status_code == 202
    assert [r.status_code for r in queued] == [202, 202]
    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert "bytes" in refused.json()["detail"]
    assert 40_000 < queued_bytes <= 50_000
    assert again.status_code == 202
    assert s.server.registry.queued_bytes == 0


def test_a_v2_inits_extra_fields_are_bounded_like_its_metadata() -> None:
    """Item 12: ``extra_fields`` had no size cap (``metadata`` had 1 MiB): now the same bound,
    a bounded 422 that names the field and echoes nothing of it."""
    body = _v2_init("r-x", "127.0.0.1:9100")
    body["extra_fields"] = {"blob": "s3cr3t-" + "x" * 2_000_000}
    with pytest.raises(ValidationError) as caught:
        V2Init.model_validate(body)
    [error] = caught.value.errors(include_input=False, include_context=False, include_url=False)
    assert error["loc"] == ("extra_fields",)
    assert "extra_fields is" in error["msg"]
    assert "s3cr3t" not in str(error)


def test_a_polling_inits_extra_fields_are_bounded_like_its_metadata() -> None:
    """Item 12 on the polling wire: the same bound as v2's."""
    from osmosis_rollout.protocol import PollingInit

    body = _v2_init("r-p", "127.0.0.1:9100")
    del body["completion_callback_url"]
    body["extra_fields"] = {"blob": "x" * 2_000_000}
    with pytest.raises(ValidationError) as caught:
        PollingInit.model_validate(body)
    [error] = caught.value.errors(include_input=False, include_context=False, include_url=False)
    assert error["loc"] == ("extra_fields",)
