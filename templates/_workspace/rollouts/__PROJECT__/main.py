"""The platform's entrypoint for __PROJECT__: `python rollouts/__PROJECT__/main.py`.

The Osmosis platform (and the SDK's `osmosis eval run`) starts this file with the variables of
its launch contract set: `_OSMOSIS_ROLLOUT_PORT` (the port its controller calls),
`_OSMOSIS_ROLLOUT_ARTIFACT_ROOT` (where each rollout's `trajectory.json` goes),
`_OSMOSIS_ROLLOUT_INSTANCE_ID` (echoed by `/health`) and `_OSMOSIS_ROLLOUT_NAME`.

It serves the agent named in this folder's pyproject.toml (`[tool.osmosis] agent`) exactly as
`osmosis serve --no-auth` run from this folder would: the platform's controller sends no key
(its own key travels in each request body, for the callbacks), so the server takes none, and
calls only the hosts of its first rollout. With `OSMOSIS_API_KEY` set (a controller that sends
a bearer), it requires that key instead. It listens on every interface, the controller being
on another machine; `OSMOSIS_HOST=127.0.0.1` keeps it on this one. Extra arguments are passed
to `osmosis serve` (`python main.py --max-concurrent 8`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from osmosis_rollout.cli import app

HERE = Path(__file__).resolve().parent


def main() -> None:
    # This folder's pyproject.toml names the agent and its settings, and relative paths
    # (the outbox, debug traces) stay inside it, wherever the platform starts us from.
    os.chdir(HERE)
    host = os.environ.get("OSMOSIS_HOST") or "0.0.0.0"
    auth = [] if os.environ.get("OSMOSIS_API_KEY") else ["--no-auth"]
    app(["serve", *auth, "--host", host, *sys.argv[1:]], prog_name="osmosis")


if __name__ == "__main__":
    main()
