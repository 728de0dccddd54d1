"""Open a page in headless Chromium and report what a reader would see, over the DevTools protocol.

Standard library only: Chromium is started with ``--remote-debugging-pipe`` and spoken to over
file descriptors 3 (commands in) and 4 (replies and events out), one JSON message per NUL byte.
:func:`inspect_page` loads a file, waits for its load event, and returns the console errors,
uncaught exceptions, log errors, every network request, the state of each ``<img>`` (loaded,
natural size, where it sits on the page) and a full-page PNG screenshot.

``chromium`` is the Debian package of that name (``.ci/run`` installs it).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The first Chromium-family executable on PATH (``$DISTATTN_CHROMIUM`` first), or None."""
    env = os.environ.get("DISTATTN_CHROMIUM")
    if env:
        return shutil.which(env) or (env if os.access(env, os.X_OK) else None)
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageReport:
    url: str
    console_errors: list[str] = field(default_factory=list)     # console.error / console.assert
    exceptions: list[str] = field(default_factory=list)          # uncaught script errors
    log_errors: list[str] = field(default_factory=list)          # browser log entries at level error
    requests: list[str] = field(default_factory=list)            # every URL the page asked for
    images: list[dict] = field(default_factory=list)             # complete, naturalWidth/Height, rect
    title: str = ""
    screenshot_png: bytes = b""

    @property
    def errors(self) -> list[str]:
        return self.console_errors + self.exceptions + self.log_errors


class _Pipe:
    """One DevTools connection over the two pipes; keeps every event it reads."""

    def __init__(self, to_browser: int, from_browser: int, proc: subprocess.Popen):
        self.w, self.r, self.proc = to_browser, from_browser, proc
        self.buf = b""
        self.events: list[dict] = []
        self.next_id = 0

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed the DevTools pipe (exit code {self.proc.poll()})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read_message(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev


def _describe_exception(details: dict) -> str:
    exc = details.get("exception") or {}
    return f"{details.get('text', '')} {exc.get('description', '')}".strip()


def inspect_page(path: str | Path, browser: str | None = None, width: int = 1280, settle: float = 0.5,
                 timeout: float = 120.0) -> PageReport:
    """Load ``path`` (a local HTML file) in headless Chromium; see the module docstring."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}; "
                                "Debian: apt-get install chromium)")
    url = Path(path).resolve().as_uri()
    a_r, a_w = os.pipe()          # us -> browser (its fd 3)
    b_r, b_w = os.pipe()          # browser -> us (its fd 4)

    def child_fds():
        os.dup2(a_r, 3)
        os.dup2(b_w, 4)

    with tempfile.TemporaryDirectory(prefix="distattn-chromium-") as profile:
        args = [browser, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-background-networking", "--disable-extensions", "--disable-sync",
                f"--user-data-dir={profile}", f"--window-size={width},900", "about:blank"]
        # its crash-report database (~/.config/chromium) and dconf (~/.cache) ignore --user-data-dir
        env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(profile, "config"),
                   XDG_CACHE_HOME=os.path.join(profile, "cache"))
        proc = subprocess.Popen(args, pass_fds=(3, 4), preexec_fn=child_fds, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        os.close(a_r)
        os.close(b_w)
        cdp = _Pipe(a_w, b_r, proc)
        try:
            target = cdp.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                cdp.send(f"{domain}.enable", session=session)
            cdp.send("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
            cdp.send("Page.navigate", {"url": url}, session=session)
            cdp.wait_for("Page.loadEventFired", timeout=timeout)
            time.sleep(settle)
            js = ("JSON.stringify({title: document.title, images: Array.from(document.images).map(i => {"
                  "const r = i.getBoundingClientRect(); return {alt: i.alt, complete: i.complete, "
                  "naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight, x: r.left + window.scrollX, "
                  "y: r.top + window.scrollY, width: r.width, height: r.height};})})")
            state = json.loads(cdp.send("Runtime.evaluate", {"expression": js, "returnByValue": True},
                                        session=session)["result"]["value"])
            metrics = cdp.send("Page.getLayoutMetrics", session=session)
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            shot = cdp.send("Page.captureScreenshot",
                            {"format": "png", "captureBeyondViewport": True,
                             "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}},
                            session=session, timeout=timeout)
            rep = PageReport(url=url, title=state["title"], images=state["images"],
                             screenshot_png=base64.b64decode(shot["data"]))
            # drain whatever arrived meanwhile, then sort the events
            for ev in cdp.events:
                method, p = ev.get("method"), ev.get("params", {})
                if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    rep.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                       for a in p.get("args", [])))
                elif method == "Runtime.exceptionThrown":
                    rep.exceptions.append(_describe_exception(p.get("exceptionDetails", {})))
                elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                    e = p["entry"]
                    rep.log_errors.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())
                elif method == "Network.requestWillBeSent":
                    rep.requests.append(p.get("request", {}).get("url", ""))
            return rep
        finally:
            try:
                os.write(a_w, json.dumps({"id": 10**6, "method": "Browser.close"}).encode() + b"\0")
            except OSError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(a_w)
            os.close(b_r)
