"""Open a report page in real headless Chromium and say what a reader would see.

Speaks the DevTools protocol over `--remote-debugging-pipe` (fds 3/4, NUL-separated JSON), so no port
is opened and nothing beyond the Python standard library is needed. Collects console errors, uncaught
exceptions, failed loads and Content-Security-Policy violations while the page loads in a 1400 px wide
window, then inspects the DOM: the verdict table's rows, whether every image decoded, the CSP the page
declares, whether it scrolls sideways, how many elements match given selectors, and optionally
the value of a script run in the page (e.g. clicking a table header).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BadInput

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "headless_shell")
# Flags for a quiet, reproducible, offline headless browser (no sandbox: CI runs as root in a container).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
                  "--disable-dev-shm-usage", "--remote-debugging-pipe")
WIDTH = 1400  # the report must not scroll sideways at this width
INSPECT = """JSON.stringify({
  title: document.title,
  verdict: (document.getElementById('verdict') || {}).textContent || null,
  verdictRows: document.querySelectorAll('table.verdicts tbody tr').length,
  images: Array.from(document.images).map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0,
                                                 width: i.naturalWidth})),
  csp: (document.querySelector('meta[http-equiv="Content-Security-Policy"]') || {}).content || null,
  scrollWidth: document.documentElement.scrollWidth,
  scrollHeight: document.documentElement.scrollHeight,
  counts: Object.fromEntries(SELECTORS.map(s => [s, document.querySelectorAll(s).length])),
  extra: (function () { return EXTRA; })()
})"""


@dataclass(frozen=True)
class PageCheck:
    """What Chromium saw: console errors/exceptions, the verdict badge and table, and the images."""

    title: str
    verdict: str | None
    verdict_rows: int
    images: int
    broken_images: tuple[str, ...]  # alt texts of images that did not decode
    errors: tuple[str, ...]  # console errors, uncaught exceptions, failed loads, CSP violations
    csp: str | None = None  # the page's Content-Security-Policy meta tag
    scroll_width: int = 0  # of the document in a WIDTH px window; > WIDTH: the reader scrolls sideways
    counts: dict | None = None  # selector -> number of matching elements
    extra: object = None  # the value of the `script` given to check_page
    scroll_height: int = 0  # of the whole document, in CSS px: how far a reader scrolls

    @property
    def ok(self) -> bool:
        return not self.errors and not self.broken_images and self.verdict_rows > 0 and self.scroll_width <= WIDTH


def find_chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int):
        self.proc, self.w, self.r, self.buf, self.next_id = proc, to_browser, from_browser, b"", 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"chromium {method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        while True:
            ev = self._read(deadline)
            if ev.get("method") == method:
                return ev
            self.events.append(ev)

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium exited (status {self.proc.poll()})")
                self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)


def _errors(events: list[dict]) -> list[str]:
    out = []
    for ev in events:
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = (str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            out.append("console.error: " + " ".join(args))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}".strip())
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            out.append(f"load failed: {p.get('errorText')}")
        elif method == "Audits.issueAdded" and p.get("issue", {}).get("code") == "ContentSecurityPolicyIssue":
            details = p["issue"].get("details", {}).get("contentSecurityPolicyIssueDetails", {})
            out.append(f"CSP blocked: {details.get('violatedDirective', '?')} {details.get('blockedURL', '')}".strip())
    return out


def check_page(page: str | os.PathLike, chromium: str | None = None, timeout: float = 60,
               selectors: tuple[str, ...] = (), script: str = "null", *, width: int = WIDTH, height: int = 900,
               screenshot: str | os.PathLike | None = None) -> PageCheck:
    """Load `page` (an HTML file) in headless Chromium and report what it shows and every error it logs;
    `selectors` are counted, `script` (a JS expression) is evaluated after load and its JSON value returned.
    `width` x `height`: the window (1366 x 768 is the laptop screen an on-call engineer reads a report on);
    `screenshot`: a PNG of that first screen, as the reader sees it before scrolling."""
    page = Path(page).resolve()
    if not page.is_file():
        raise BadInput(f"{page}: no such HTML file")
    chromium = chromium or find_chromium()
    if chromium is None:
        raise BadInput("no Chromium found (apt-get install chromium); the browser check needs it")
    to_r, to_w = os.pipe()  # we write -> chromium reads on fd 3
    from_r, from_w = os.pipe()  # chromium writes on fd 4 -> we read

    def child_fds():
        # Runs in the child before exec: move both ends out of the way first, so
        # dup2 onto 3/4 cannot clobber one with the other.
        import fcntl

        read_end, write_end = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
        os.dup2(read_end, 3)
        os.dup2(write_end, 4)

    with tempfile.TemporaryDirectory(prefix="harness-chromium-") as profile:
        proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                preexec_fn=child_fds, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                                close_fds=False)  # fds are non-inheritable by default; dup2 made 3/4 inheritable
        os.close(to_r)
        os.close(from_w)
        pipe = _Pipe(proc, to_w, from_r)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page", "Network", "Audits"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                             "deviceScaleFactor": 1, "mobile": False},
                      session=session)
            pipe.events.clear()
            pipe.send("Page.navigate", {"url": page.as_uri()}, session=session)
            pipe.wait_event("Page.loadEventFired", timeout=timeout)
            expression = INSPECT.replace("SELECTORS", json.dumps(list(selectors))).replace("EXTRA", script)
            value = pipe.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                              session=session)["result"]["value"]
            seen = json.loads(value)
            if screenshot is not None:
                import base64

                from harness.io import write_atomic

                shot = pipe.send("Page.captureScreenshot", {"format": "png"}, session=session, timeout=timeout)
                write_atomic(screenshot, base64.b64decode(shot["data"]))
            errors = _errors(pipe.events)
            try:
                pipe.send("Browser.close", timeout=10)
            except (RuntimeError, TimeoutError):
                pass
        finally:
            os.close(to_w)
            os.close(from_r)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return PageCheck(seen["title"], seen["verdict"], seen["verdictRows"], len(seen["images"]),
                     tuple(i["alt"] for i in seen["images"] if not i["ok"]), tuple(errors), seen["csp"],
                     seen["scrollWidth"], seen["counts"], seen["extra"], seen["scrollHeight"])
