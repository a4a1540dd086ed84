"""A real headless Chromium driven over the Chrome DevTools Protocol (a websocket), for tests.

Just what the viewer tests need: open a URL, evaluate JavaScript, wait for a condition, take a
screenshot. The browser runs with its own throwaway profile and is always stopped on close.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import queue
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

__all__ = ["Chromium", "find_chromium"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The Chromium executable on PATH, if any."""
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """One headless browser with one page. Use as a context manager."""

    def __init__(self, executable: str, profile: Path, *, width: int = 1280, height: int = 860):
        self._process = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",  # CI containers run as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--hide-scrollbars",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._ids = itertools.count(1)
        self._ws: ClientConnection | None = None
        self._stack = contextlib.ExitStack()
        try:
            port = self._devtools_port(timeout_s=60.0)
            self._ws = self._stack.enter_context(
                connect(self._page_websocket(port), max_size=None, open_timeout=30)
            )
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def _devtools_port(self, timeout_s: float) -> int:
        lines: queue.Queue[str] = queue.Queue()
        stderr = self._process.stderr
        assert stderr is not None

        def pump() -> None:
            for line in stderr:
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        seen: list[str] = []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                if self._process.poll() is not None:
                    break
                continue
            seen.append(line)
            if "DevTools listening on ws://" in line:
                return int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        raise RuntimeError("Chromium did not start its DevTools server:\n" + "".join(seen[-20:]))

    @staticmethod
    def _page_websocket(port: int) -> str:
        for _ in range(100):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.load(r)
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.1)
        raise RuntimeError("Chromium has no page to drive")

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection and stop the browser (killed if it does not exit)."""
        self._ws = None
        self._stack.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stderr is not None:
            self._process.stderr.close()

    # -- the protocol ---------------------------------------------------------------------------

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events in between are ignored)."""
        assert self._ws is not None
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=60))
            if message.get("id") != call_id:
                continue
            if "error" in message:
                raise RuntimeError(f"{method}: {message['error']}")
            return dict(message.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {expression!r}")
            time.sleep(0.05)

    def open(self, url: str) -> None:
        """Navigate and wait until the viewer says it has drawn (``body[data-ready]``)."""
        self.call("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")
        self.wait_for("document.body && document.body.dataset.ready === '1'")

    def go(self, hash_route: str) -> None:
        """Follow an in-page route (``#/rollout/...``) and wait until it is drawn."""
        self.evaluate(f"document.body.dataset.ready = ''; location.hash = {json.dumps(hash_route)}")
        self.wait_for("document.body.dataset.ready === '1'")

    def screenshot(self, path: Path) -> None:
        """Save the whole page (not only the window) as PNG."""
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": min(size["height"], 2400),
                "scale": 1,
            },
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
