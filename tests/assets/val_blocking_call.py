"""Warns: blocking calls inside run() (on a path the dry run does not take)."""

import socket
import subprocess
import time
from urllib.request import urlopen

from osmosis_rollout import RolloutAgentLoop


class BlockingAgent(RolloutAgentLoop):
    name = "blocking"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        messages = list(ctx.request.messages)
        if ctx.request.metadata.get("slow_path"):
            import requests  # not installed here: this branch never runs

            time.sleep(1)  # <- BLOCKING_CALL time.sleep
            requests.get("http://example.invalid")  # <- BLOCKING_CALL requests.get
            urlopen("http://example.invalid")  # <- BLOCKING_CALL urllib.request.urlopen
            subprocess.run(["true"])  # <- BLOCKING_CALL subprocess.run
            with open("notes.txt") as f:  # <- BLOCKING_CALL open
                messages.append({"role": "user", "content": f.read()})
            socket.create_connection(("example.invalid", 80))  # <- BLOCKING_CALL socket

        def helper():
            time.sleep(1)  # fine: a sync helper may run in a worker thread

        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete(messages)
