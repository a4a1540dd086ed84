"""Regressions of the second security review's low findings (issue 38), one attack each, made
small: each test fails on the code the review found."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from osmosis_rollout.server.wire.v2_body import V2Init


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
