"""Headless Chromium driven over the DevTools protocol: launch, open a page, evaluate, collect console
errors, take a screenshot. A fresh profile per browser; nothing reaches the network but loopback."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, binary: str, timeout: float = 60.0) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="corral-chromium-"))
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        url = self._devtools_url(timeout)
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(
            connect(url, max_size=64 * 1024 * 1024, open_timeout=timeout)
        )
        self.session: str | None = None

    def _devtools_url(self, timeout: float) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                return m.group(1)
        self.close()
        raise BrowserError("chromium did not start:\n" + "".join(seen[-20:]))

    def call(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith("Target."):
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer in {timeout}s")
            reply = json.loads(self.ws.recv(timeout=left))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def open(self, url: str, width: int = 1280, height: int = 900) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        out = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except BrowserError:
                value = None  # mid-navigation
            if value:
                return value
            time.sleep(0.2)
        raise BrowserError(f"timed out waiting for {expression}")

    def console_errors(self) -> list[str]:
        """Errors the page reported: uncaught exceptions, console.error, failed loads, CSP refusals."""
        self.evaluate("1")  # drain pending events
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(json.dumps(p.get("args", []))[:500])
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", "")[:500])
        return out

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        stack = getattr(self, "_stack", None)
        if stack is not None:
            stack.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
