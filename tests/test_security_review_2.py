"""Regressions of the second security review's low findings (issue 38), one attack each, made
small: each test fails on the code the review found."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from osmosis_rollout.protocol import RolloutResponse, RolloutStatus
from osmosis_rollout.server.state.memory import MemoryState, write_outbox
from osmosis_rollout.server.wire.v2_body import V2Init
from osmosis_rollout.tracing import Tracer, file_sink

from .support import ROOT, load_path


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
    path = write_outbox(tmp_path, "http://127.0.0.1:1", response, "refused")
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
