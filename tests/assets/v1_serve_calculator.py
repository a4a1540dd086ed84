# ruff: noqa: I001
# The original SDK's way to serve an agent from Python, as its documentation writes it, with
# only the import lines changed; the host and port come from the command line so the test can
# bind 127.0.0.1 on a free port.

import sys

from osmosis_rollout.compat import serve_agent_loop

from v1_calculator import agent_loop

if __name__ == "__main__":
    serve_agent_loop(agent_loop, host="127.0.0.1", port=int(sys.argv[1]), skip_register=True)
