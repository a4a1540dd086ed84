"""Serve ``hrd_agents.Quick`` with a short callback grace, for the SIGTERM torture scenario.

python hrd_serve.py PORT SHUTDOWN_GRACE_S DELIVERY_GRACE_S OUTBOX_DIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from hrd_agents import Quick

from osmosis_rollout.server import app as server_app
from osmosis_rollout.server import serve

port, grace, delivery, outbox = sys.argv[1:5]
server_app._DELIVERY_GRACE_S = float(delivery)
serve(
    Quick(),
    host="127.0.0.1",
    port=int(port),
    shutdown_grace_s=float(grace),
    outbox_dir=outbox,
    log_level="info",
)
