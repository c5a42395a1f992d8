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
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
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


def ray_address_file() -> Path:
    """Where `ray start` records the running cluster's GCS address and Ray's CLI looks for it on `auto`:
    <RAY_TMPDIR, else TMPDIR on Linux, else /tmp>/ray/ray_current_cluster. Written from ray 2.60
    python/ray/_common/utils.py get_default_system_temp_dir / get_default_ray_temp_dir / get_ray_address_file
    (read by ray/_private/services.py find_bootstrap_address; `ray start` writes it in scripts/scripts.py start)."""
    base = os.environ.get("RAY_TMPDIR") or (os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None) \
        or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


# What `ray start` writes to the address file: the GCS's HOST:PORT (ray 2.60 scripts/scripts.py start ->
# ray/_private/utils.py write_ray_address(ray_params.gcs_address)): a host name, an IPv4 or a bracketed IPv6
# address, and a port.
_GCS_ADDRESS = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]):\d{1,5}")
MAX_ADDRESS_FILE_BYTES = 4096


def auto_dashboard(option: str = "RAY_ADDRESS", timeout_s: float | None = None) -> str:
    """`auto` as Ray 2.60's job CLI resolves it (ray/dashboard/utils.py get_address_for_submission_client ->
    ray_address_to_api_server_url): the GCS address in the running cluster's address file (ray_address_file), then
    the dashboard URL that GCS publishes in its KV store (`DASHBOARD_ADDRESS`, namespace `dashboard`). It was read
    as a host named `auto` (http://auto:8265, issue 33). Ray's own function does the KV read; it retries for ~40 s
    against a dead GCS, so it runs in a thread bounded by HARNESS_RAY_CONNECT_TIMEOUT. Ray's legacy fallback
    (any GCS process `ps` shows, without an address file) is left out: it picks an arbitrary cluster."""
    import threading

    from harness.io import open_input

    path = ray_address_file()
    try:  # a regular file of a line (open_input refuses a FIFO, which blocked for ever, or a device), read bounded
        with open_input(path, "rb") as f:
            raw = f.read(MAX_ADDRESS_FILE_BYTES + 1)
        gcs = raw.decode("utf-8", "replace").strip()
    except BadInput as exc:
        raise BadInput(f"{option}=auto: {exc}") from None
    except FileNotFoundError:
        raise BadInput(f"{option}=auto: no running Ray cluster on this machine ({path} is missing; `ray start --head` "
                       f"writes it); start one or pass http://HEAD:{DASHBOARD_PORT}") from None
    except OSError as exc:
        raise BadInput(f"{option}=auto: cannot read {path} ({exc.strerror})") from None
    if not gcs:
        raise BadInput(f"{option}=auto: {path} is empty; restart the cluster (`ray start --head`) or pass "
                       f"http://HEAD:{DASHBOARD_PORT}")
    if len(raw) > MAX_ADDRESS_FILE_BYTES or not _GCS_ADDRESS.fullmatch(gcs):
        # Ray's own lookup logs the address raw (escapes, a newline that fakes a log line): it only ever sees one
        # `ray start` writes
        # not echoed: what is there may be a credential (user:password@host) or terminal control
        raise BadInput(f"{option}=auto: {path} holds {len(raw)}{'+' if len(raw) > MAX_ADDRESS_FILE_BYTES else ''} "
                       f"bytes that are not the HOST:PORT `ray start` writes; restart the cluster (`ray start --head`) "
                       f"or pass http://HEAD:{DASHBOARD_PORT}")
    timeout_s = connect_timeout() if timeout_s is None else timeout_s
    found: list = []

    def lookup() -> None:
        try:
            from ray.dashboard.utils import ray_address_to_api_server_url

            found.append(ray_address_to_api_server_url(gcs))
        except Exception as exc:  # noqa: BLE001 -- Ray raises ValueError/ConnectionError/RpcError: one line each
            found.append(exc)

    worker = threading.Thread(target=lookup, name="ray-auto-address", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not found:
        raise BadInput(f"{option}=auto: the cluster in {path} (GCS {redact(gcs)}) did not give its dashboard "
                       f"address within {timeout_s:g} s; is it still running? (`ray status`)")
    if isinstance(found[0], BaseException):
        exc = found[0]
        raise BadInput(f"{option}=auto: the cluster in {path} (GCS {redact(gcs)}) did not give its dashboard "
                       f"address ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    return dashboard_url(found[0], f"{option}=auto ({path})")


def dashboard_url(address: str, option: str = "--ray-address") -> str:
    """The dashboard URL `address` names: `http://HOST:PORT`, `https://...`, or `HOST[:PORT]` (http, port 8265);
    `auto`: the running cluster's, as Ray's CLI finds it (auto_dashboard). BadInput naming `option` for a `ray://` /
    GCS address or anything that is not a host and port."""
    text = (address or "").strip()
    if not text:
        raise BadInput(f"{option}: empty; pass the Ray dashboard of the cluster, http://HEAD:{DASHBOARD_PORT}")
    if any(c.isspace() or not c.isprintable() for c in text):
        # a space or a control character inside a URL: http.client refused it with a traceback (InvalidURL)
        raise BadInput(f"{option} {redact(text)!r}: a space or control character in the address; pass "
                       f"http://HEAD:{DASHBOARD_PORT}")
    if text == "auto":
        return auto_dashboard(option)
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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: the request carries `Authorization` (RAY_AUTH_TOKEN, or the URL's user:password),
    and urllib sent it on to whatever host a 302 named (issue 48). A dashboard answers its API paths itself; a 3xx
    is reported instead (HTTPError)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)
MAX_VERSION_BYTES = 64 << 10  # /api/version: {"ray_version": ..., ...}, a few hundred bytes


def auth_headers(url: str) -> tuple[str, dict]:
    """`url` without its credentials, and the Authorization header that carries them (split_credentials), or Ray's
    bearer token (RAY_AUTH_MODE=token) when RAY_AUTH_TOKEN is set."""
    bare, headers = split_credentials(url)
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token:  # Ray token authentication (RAY_AUTH_MODE=token): the dashboard wants the bearer token
        headers["Authorization"] = f"Bearer {token}"
    return bare, headers


def get_bounded(url: str, path: str, *, cap: int, timeout_s: float, what: str, stall: str | None = None) -> bytes:
    """GET `path` of the dashboard `url`: the answer's bytes, read within `timeout_s` in all and refused past `cap`
    bytes before more is read (issue 48: Jobs API answers were read whole), never following a redirect (_NoRedirect);
    HTTPError for an error status (a 3xx included), BadInput for an answer over the cap or a stall (`stall`, else a
    line naming `what`)."""
    from harness.io import size_text

    bare, headers = auth_headers(url)
    request = urllib.request.Request(f"{bare}{path}", headers=headers)
    deadline = time.monotonic() + timeout_s
    stall = stall or (f"{what}: no complete answer within {timeout_s:g} s (it stalls or trickles); check the cluster, "
                      "or raise HARNESS_RAY_CONNECT_TIMEOUT")

    def fetch() -> bytes:
        try:
            return read()
        except urllib.error.HTTPError:
            raise
        except (TimeoutError, urllib.error.URLError) as exc:  # the socket's own timeout: the same stall, one line
            if isinstance(exc, TimeoutError) or isinstance(exc.reason, TimeoutError):
                raise BadInput(stall) from None
            raise

    def read() -> bytes:
        with _OPENER.open(request, timeout=timeout_s) as reply:
            chunks, size = [], 0
            while size <= cap and time.monotonic() < deadline:
                chunk = reply.read1(cap + 1 - size)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                size += len(chunk)
            if size > cap:
                raise BadInput(f"{what}: an answer of more than {size_text(cap)} (no Ray answer is that big); check "
                               "the address")
            return b"".join(chunks)  # the deadline: `within` reports it

    return within(timeout_s, stall, fetch)


def check_dashboard(url: str, option: str = "--ray-address", timeout_s: float | None = None) -> str:
    """Ask the dashboard for its version within `timeout_s`; the Ray version it reports, or BadInput in one line."""
    from harness.redact import one_line

    timeout_s = connect_timeout() if timeout_s is None else timeout_s
    try:
        body = get_bounded(url, "/api/version", cap=MAX_VERSION_BYTES, timeout_s=timeout_s,
                           what=f"{option} {redact(url)}: the Ray dashboard",
                           stall=f"{option} {redact(url)}: no Ray dashboard answers within {timeout_s:g} s (no "
                                 "complete answer: it stalls or trickles); check the cluster, or raise "
                                 "HARNESS_RAY_CONNECT_TIMEOUT")
    except urllib.error.HTTPError as exc:
        hint = "; set RAY_AUTH_TOKEN (the cluster uses token authentication)" if exc.code in (401, 403) else ""
        if 300 <= exc.code < 400:
            hint = (f", a redirect to {one_line(redact(exc.headers.get('Location') or '?'), 120)}, not followed (the "
                    "credentials stay with the address given); pass the dashboard's own address")
        raise BadInput(f"{option} {redact(url)}: the dashboard answered HTTP {exc.code}{hint}") from None
    except BadInput:
        raise
    except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections
        reason = getattr(exc, "reason", exc)
        raise BadInput(f"{option} {redact(url)}: no Ray dashboard answers within {timeout_s:g} s "
                       f"({type(reason).__name__}: {one_line(str(reason), 120)}); start the cluster or pass "
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
