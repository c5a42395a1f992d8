"""`--ray-address`: one meaning everywhere -- the Ray dashboard of an existing cluster, `http://HEAD:8265`.

The launcher submits through the dashboard's Jobs API, and the pytest plugin counts the cluster's NPU/GPU devices
through the dashboard's state API (`ray.util.state.list_nodes(address=URL)`), so neither ever connects to the GCS
(`ray.init(HEAD:6379)`): a wrong or unreachable address is one line after a bounded wait, not minutes of gRPC
retries (the plugin once passed the http form to `ray.init`, the launcher needed it, ci/nightly.sh passed
it, and every cluster-tier test errored in setup). A GCS (`:6379`) or client (`ray://`, `:10001`) address is refused
with the form to use instead.
"""
from __future__ import annotations

import base64
import json
import math
import os
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import unquote, urlsplit

from harness.errors import BadInput
from harness.redact import redact

DASHBOARD_PORT = 8265
NOT_DASHBOARD_PORTS = {6379: "the GCS", 10001: "the Ray client server"}
# Seconds to wait for the dashboard before the one-line error (HARNESS_RAY_CONNECT_TIMEOUT overrides): a total
# deadline for the whole answer, not a per-recv timeout (a dashboard trickling one byte every 9 s defeated that).
CONNECT_TIMEOUT_S = 10.0
MAX_CONNECT_TIMEOUT_S = 3600.0  # 1e308 overflowed the socket's C timeval (OverflowError traceback)
# One Jobs API call (submit, status, logs, stop) ends within this many connect timeouts, or the command says the
# server stopped answering: a head that stalled after the version check once hung `launch` past its --timeout.
CALL_TIMEOUT_FACTOR = 3.0


def dashboard_url(address: str, option: str = "--ray-address") -> str:
    """The dashboard URL `address` names: `http://HOST:PORT`, `https://...`, or `HOST[:PORT]` (http, port 8265).
    BadInput naming `option` for a `ray://` / GCS address or anything that is not a host and port."""
    text = (address or "").strip()
    if not text:
        raise BadInput(f"{option}: empty; pass the Ray dashboard of the cluster, http://HEAD:{DASHBOARD_PORT}")
    if any(c.isspace() or not c.isprintable() for c in text):
        # a space or a control character inside a URL: http.client refused it with a traceback (InvalidURL)
        raise BadInput(f"{option} {redact(text)!r}: a space or control character in the address; pass "
                       f"http://HEAD:{DASHBOARD_PORT}")
    if text.startswith("ray://"):
        raise BadInput(f"{option} {redact(text)}: a Ray client address; the harness talks to the dashboard "
                       f"(Jobs and state API): pass http://HEAD:{DASHBOARD_PORT}")
    url = text if "://" in text else f"http://{text}"
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 \
            or (parts.path not in ("", "/")) or parts.query or parts.fragment:
        raise BadInput(f"{option} {redact(text)}: not a dashboard address; pass http://HEAD:{DASHBOARD_PORT}")
    if port in NOT_DASHBOARD_PORTS:
        raise BadInput(f"{option} {redact(text)}: port {port} is {NOT_DASHBOARD_PORTS[port]}, not the dashboard; "
                       f"pass http://{parts.hostname}:{DASHBOARD_PORT}")
    netloc = parts.netloc if port is not None else f"{parts.netloc}:{DASHBOARD_PORT}"
    return f"{parts.scheme}://{netloc}"


def connect_timeout() -> float:
    raw = os.environ.get("HARNESS_RAY_CONNECT_TIMEOUT", "")
    try:
        value = float(raw) if raw else CONNECT_TIMEOUT_S
    except ValueError:
        raise BadInput(f"HARNESS_RAY_CONNECT_TIMEOUT={raw!r}: seconds expected") from None
    if not (math.isfinite(value) and 0 < value <= MAX_CONNECT_TIMEOUT_S):
        raise BadInput(f"HARNESS_RAY_CONNECT_TIMEOUT={raw!r}: seconds in (0, {MAX_CONNECT_TIMEOUT_S:g}] expected")
    return value


def stalled(what: str) -> str:
    """The one line for a Jobs / state API call that outlived call_timeout()."""
    return (f"{what}: no complete answer within {call_timeout():g} s (the server stalls or trickles); check the "
            "cluster, or raise HARNESS_RAY_CONNECT_TIMEOUT")


def call_timeout() -> float:
    """The total deadline of one Jobs / state API call (CALL_TIMEOUT_FACTOR connect timeouts)."""
    return CALL_TIMEOUT_FACTOR * connect_timeout()


def within(seconds: float, message: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` with a total deadline: its value, its exception, or BadInput(`message`) when it has not
    returned after `seconds`. urllib's and requests' timeouts bound each recv, not the answer (a server that
    trickles a byte per timeout never times out), and Ray's JobSubmissionClient passes none at all; the call runs
    in a daemon thread that is abandoned on the deadline (the command exits right after its one-line error)."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread as it is
            box["error"] = exc

    thread = threading.Thread(target=call, name="harness-deadline", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise BadInput(message)
    if "error" in box:
        raise box["error"]
    return box["value"]


def split_credentials(url: str) -> tuple[str, dict]:
    """`url` without its `user:password@` and the Basic authorization header that carries them instead: urllib
    sends the userinfo as part of the host name (getaddrinfo then said "Name or service not known" of a host that
    answers); requests (Ray's client) does this split itself."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, {}
    host = parts.netloc.rsplit("@", 1)[1]
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return f"{parts.scheme}://{host}", {"Authorization": "Basic " + base64.b64encode(pair).decode()}


def check_dashboard(url: str, option: str = "--ray-address", timeout_s: float | None = None) -> str:
    """Ask the dashboard for its version within `timeout_s`; the Ray version it reports, or BadInput in one line."""
    timeout_s = connect_timeout() if timeout_s is None else timeout_s
    bare, headers = split_credentials(url)
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token:  # Ray token authentication (RAY_AUTH_MODE=token): the dashboard wants the bearer token
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{bare}/api/version", headers=headers)
    deadline = time.monotonic() + timeout_s

    def fetch() -> bytes:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:  # noqa: S310 (http(s) only, checked)
            chunks, size = [], 0
            while size < 65536 and time.monotonic() < deadline:
                chunk = reply.read1(65536 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)

    try:
        body = within(timeout_s, f"{option} {redact(url)}: no Ray dashboard answers within {timeout_s:g} s (no "
                                 "complete answer: it stalls or trickles); check the cluster, or raise "
                                 "HARNESS_RAY_CONNECT_TIMEOUT", fetch)
    except urllib.error.HTTPError as exc:
        hint = "; set RAY_AUTH_TOKEN (the cluster uses token authentication)" if exc.code in (401, 403) else ""
        raise BadInput(f"{option} {redact(url)}: the dashboard answered HTTP {exc.code}{hint}") from None
    except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections
        reason = getattr(exc, "reason", exc)
        raise BadInput(f"{option} {redact(url)}: no Ray dashboard answers within {timeout_s:g} s "
                       f"({type(reason).__name__}: {reason}); start the cluster or pass "
                       f"http://HEAD:{DASHBOARD_PORT}") from None
    try:
        return str(json.loads(body).get("ray_version", "unknown"))
    except (ValueError, AttributeError):
        raise BadInput(f"{option} {redact(url)}: answers, but not as a Ray dashboard (no JSON at "
                       "/api/version)") from None


def cluster_devices(url: str, option: str = "--ray-address") -> int:
    """NPU (else GPU) devices of the alive nodes, through the dashboard's state API (no GCS connection)."""
    from ray.util.state import list_nodes

    check_dashboard(url, option)
    try:
        nodes = list_nodes(address=url, timeout=int(max(1, connect_timeout())), raise_on_missing_output=False)
    except Exception as exc:  # the state API wraps transport errors in several exception types
        raise BadInput(f"{option} {redact(url)}: the dashboard's state API failed "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    alive = [n for n in nodes if n.state == "ALIVE"]
    npu = sum(int(n.resources_total.get("NPU", 0)) for n in alive)
    return npu or sum(int(n.resources_total.get("GPU", 0)) for n in alive)
