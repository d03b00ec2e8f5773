"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for the UI tests.

Chromium listens on a loopback port it picks itself (``DevToolsActivePort`` in its profile); the
test talks to it through ``websockets`` (already installed with Airflow's API server): set the
Airflow login cookie, open a page, wait for a condition in the page with a deadline, read what a
person sees (``innerText``) and take a screenshot. No selenium or playwright needed.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
from pathlib import Path

from websockets.sync.client import connect

from airflow_provider_pglogical.embedded.postgres import wait_until

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page (a DevTools session attached to it)."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        binary = chromium_binary()
        if binary is None:
            raise RuntimeError("chromium is not installed: run scripts/setup.sh (apt-get install chromium)")
        profile.mkdir(parents=True, exist_ok=True)
        self.log = profile.parent / "chromium.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                            stdout=out, stderr=subprocess.STDOUT)
        active = profile / "DevToolsActivePort"
        wait_until(lambda: active.exists() and len(active.read_text().split()) == 2, timeout=60,
                   message="chromium to open its DevTools port")
        port, path = active.read_text().split()
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=30))
        self.ids = itertools.count(1)
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, session: bool = False, **params) -> dict:
        """Send one DevTools command and return its result (events in between are skipped)."""
        message = {"id": next(self.ids), "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == message["id"]:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.call("Network.setCookie", session=True, url=url, name=name, value=value, httpOnly=True)

    def open(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, message: str = "the page") -> object:
        return wait_until(lambda: self.evaluate(expression), timeout=timeout, interval=0.2, message=message)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            self.process.kill()
            self.process.wait(timeout=30)
