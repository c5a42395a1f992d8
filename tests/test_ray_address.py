"""`--ray-address` has one meaning (the dashboard URL), a bounded connect, one-line errors; the plugin counts
devices through the dashboard (never `ray.init` on a GCS address, which once hung pytest for minutes);
credentials in URLs are redacted wherever the harness records them."""
from __future__ import annotations

import http.server
import json
import os
import re
import threading
import time

import pytest

from harness.errors import BadInput
from harness.launch.address import check_dashboard, dashboard_url
from harness.redact import redact, redact_argv


@pytest.mark.parametrize("given, url", [
    ("http://head:8265", "http://head:8265"),
    ("head:8265", "http://head:8265"),
    ("head", "http://head:8265"),
    ("https://head.example:443/", "https://head.example:443"),
    ("http://127.0.0.1:18265", "http://127.0.0.1:18265"),
])
def test_dashboard_forms(given, url):
    assert dashboard_url(given) == url


@pytest.mark.parametrize("given, needle", [
    ("ray://head:10001", "a Ray client address"),
    ("head:6379", "port 6379 is the GCS"),
    ("http://head:10001", "port 10001 is the Ray client server"),
    ("ftp://head:8265", "not a dashboard address"),
    ("http://head:8265/api/jobs", "not a dashboard address"),
    ("http://head:99999", "not a dashboard address"),
    ("", "empty"),
])
def test_other_addresses_are_one_line_errors(given, needle):
    with pytest.raises(BadInput, match=needle) as err:
        dashboard_url(given)
    assert "\n" not in str(err.value)


class _Dashboard(http.server.BaseHTTPRequestHandler):
    status = 200
    body = json.dumps({"ray_version": "2.60.0"}).encode()

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def dashboard():
    """A loopback HTTP server answering /api/version as Ray's dashboard does; yields (url, handler class)."""
    handler = type("Handler", (_Dashboard,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_check_dashboard_reads_the_version(dashboard):
    url, _ = dashboard
    assert check_dashboard(url, timeout_s=5) == "2.60.0"


def test_auth_failure_names_the_token(dashboard):
    url, handler = dashboard
    handler.status = 401
    with pytest.raises(BadInput, match="HTTP 401; set RAY_AUTH_TOKEN"):
        check_dashboard(url, timeout_s=5)


def test_not_a_dashboard(dashboard):
    url, handler = dashboard
    handler.body = b"<html>hello</html>"
    with pytest.raises(BadInput, match="not as a Ray dashboard"):
        check_dashboard(url, timeout_s=5)


def test_unreachable_is_bounded_and_one_line():
    """A listening socket that never answers: the check gives up after its timeout, in one line."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts into the backlog, never replies
    try:
        start = time.monotonic()
        with pytest.raises(BadInput, match=r"no Ray dashboard answers within 1 s") as err:
            check_dashboard(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=1)
        assert time.monotonic() - start < 30
        assert "\n" not in str(err.value)
    finally:
        silent.close()


def test_plugin_refuses_a_gcs_address_up_front(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--ray-address", "head:6379")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*port 6379 is the GCS, not the dashboard*"])


def test_plugin_unreachable_cluster_is_one_usage_error(pytester, monkeypatch, tmp_path):
    """A cluster test against a dead dashboard ends the session with the one-line reason (no minutes of retries)."""
    monkeypatch.setenv("HARNESS_RAY_CONNECT_TIMEOUT", "2")
    monkeypatch.setenv("HARNESS_RUN_ROOT", str(tmp_path))  # required with a cluster address (shared_run_root)
    pytester.makepyfile("from harness.markers import requires\n\n"
                        "@requires(cards=8)\ndef test_x():\n    pass\n\n"
                        "@requires(cards=8)\ndef test_y():\n    pass\n")
    result = pytester.runpytest("--ray-address", "http://127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no Ray dashboard answers within 2 s" in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize("text, redacted", [
    ("https://user:s3cret@head:8265", "https://***@head:8265"),
    ("--ray-address=http://tok@head:8265", "--ray-address=http://***@head:8265"),
    ("http://head:8265/?token=abc&x=1", "http://head:8265/?token=***&x=1"),
    ("http://head:8265", "http://head:8265"),
    ("s3://AKIA:KEY@bucket/p and https://u:p@h/x", "s3://***@bucket/p and https://***@h/x"),
])
def test_redact(text, redacted):
    assert redact(text) == redacted


def test_redact_argv_keeps_the_rest():
    argv = ["pytest", "suites", "--ray-address", "https://me:tok@head:8265", "-m", "full"]
    assert redact_argv(argv) == ["pytest", "suites", "--ray-address", "https://***@head:8265", "-m", "full"]


# RAY_ADDRESS=auto (issue 33: it became http://auto:8265): the running cluster's address file, as Ray's CLI reads it
def test_auto_reads_the_address_file_ray_itself_reads(tmp_path, monkeypatch):
    from ray._common.utils import get_ray_address_file

    from harness.launch.address import ray_address_file

    for env in ({"RAY_TMPDIR": str(tmp_path / "a"), "TMPDIR": str(tmp_path / "b")}, {"TMPDIR": str(tmp_path / "b")},
                {}):
        for name in ("RAY_TMPDIR", "TMPDIR"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert str(ray_address_file()) == get_ray_address_file(None), env  # Ray 2.60's own lookup


def test_auto_without_a_running_cluster_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(BadInput, match=r"RAY_ADDRESS=auto: no running Ray cluster on this machine \(.*"
                                       r"ray/ray_current_cluster is missing") as err:
        dashboard_url("auto", "RAY_ADDRESS")
    assert "auto:8265" not in str(err.value)


def test_auto_with_a_dead_cluster_is_bounded_and_one_line(tmp_path, monkeypatch):
    # the address file of a cluster that is gone: Ray's own GCS lookup retries for ~40 s; the harness gives up at
    # its connect timeout with one line naming the file
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setenv("HARNESS_RAY_CONNECT_TIMEOUT", "2")
    started = time.monotonic()
    with pytest.raises(BadInput, match=rf"RAY_ADDRESS=auto: the cluster in .*ray_current_cluster \(GCS 127.0.0.1:"
                                       rf"{port}\) did not give its dashboard address"):
        dashboard_url("auto", "RAY_ADDRESS")
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("root", [None, "runs", "/nonexistent/harness-run-root"])
def test_a_cluster_address_needs_a_shared_run_root(pytester, monkeypatch, root):
    """verl's FileLogger writes on a cluster node: a run root only this host sees ingested 0 steps, a 256-card
    night ended FAILED and --abort-on-fail never fired. The plugin refuses the session up front (seeded: the old
    default, the relative `runs/`)."""
    if root is None:
        monkeypatch.delenv("HARNESS_RUN_ROOT", raising=False)
    else:
        monkeypatch.setenv("HARNESS_RUN_ROOT", root)
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--ray-address", "http://head:8265")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "HARNESS_RUN_ROOT" in result.stderr.str() and "every node" in result.stderr.str()


def test_launch_on_a_cluster_writes_under_the_shared_run_root(tmp_path, monkeypatch, capsys):
    from harness.cli import main
    from harness.launch.jobs import shared_run_root

    monkeypatch.delenv("HARNESS_RUN_ROOT", raising=False)
    with pytest.raises(BadInput, match="HARNESS_RUN_ROOT unset"):
        shared_run_root()
    assert shared_run_root({"HARNESS_RUN_ROOT": str(tmp_path)}) == tmp_path
    assert main(["launch", "--scale", "full-a3", "--ray-address", "http://head:8265", "--run-dir", "runs/x"]) == 2
    assert "--run-dir runs/x: with a cluster address give an absolute directory" in capsys.readouterr().err



# ---------------------------------------------------------------------------------------------------- issue 48
class _Recorder(http.server.BaseHTTPRequestHandler):
    """A loopback server that records the Authorization header of every request it gets."""

    seen: list
    redirect_to: str | None = None
    bodies: dict = {}

    def do_GET(self):  # noqa: N802
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.redirect_to:
            self.send_response(302)
            self.send_header("Location", f"{self.redirect_to}{self.path}")
            self.end_headers()
            return
        body = self.bodies.get(self.path, json.dumps({"ray_version": "2.60.0", "version": "4"}).encode())
        if self.path.startswith("/api/jobs/") and self.path not in self.bodies:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    """Two loopback servers (two origins); yields a function starting one with the given class attributes."""
    started = []

    def start(**attrs):
        handler = type("Handler", (_Recorder,), {"seen": [], **attrs})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", handler

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("credentials", ["token", "url"])
def test_credentials_never_follow_a_redirect_to_another_origin(servers, monkeypatch, credentials):
    """A dashboard address that 302s to another port: urllib sent RAY_AUTH_TOKEN (or the URL's user:password) on
    to the other origin. No redirect is followed on the dashboard paths; the 302 is one line naming it."""
    other, other_handler = servers()
    url, handler = servers(redirect_to=other)
    if credentials == "token":
        monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cr3t")
    else:
        monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
        url = url.replace("http://", "http://admin:s3cr3t@")
    with pytest.raises(BadInput, match=r"HTTP 302, a redirect to http://127.0.0.1:\d+/api/version, not followed"):
        check_dashboard(url, timeout_s=5)
    assert handler.seen and handler.seen[0][1] is not None  # the origin given gets the credentials
    assert other_handler.seen == []  # the other origin gets nothing


def test_jobs_api_answers_are_read_with_a_cap(servers, monkeypatch):
    """`launch --status / --logs` and the launcher's polls read Ray's Jobs API answers whole (a 1 GB answer went
    into memory): they GET Ray's own client's paths up to a cap, and refuse past it."""
    from harness.launch import ray_job

    job = {"type": "SUBMISSION", "job_id": "j1", "submission_id": "harness-x-1", "status": "RUNNING",
           "entrypoint": "python3 -m verl.trainer.main_ppo", "message": "", "metadata": {}}
    url, _ = servers(bodies={"/api/jobs/harness-x-1": json.dumps(job).encode(),
                             "/api/jobs/harness-x-1/logs": json.dumps({"logs": "x" * (2 << 20)}).encode()})
    monkeypatch.setattr(ray_job, "MAX_LOG_BYTES", 1 << 20)
    client = ray_job._Deadlined(None, "the Ray job server", url)  # Ray's client is never asked for these reads
    assert str(client.get_job_status("harness-x-1").value) == "RUNNING"
    with pytest.raises(BadInput, match=r"the Ray job server: an answer of more than 1.0 MB"):
        client.get_job_logs("harness-x-1")
    with pytest.raises(RuntimeError, match="HTTP 404"):  # as Ray's client says an unknown job
        client.get_job_info("harness-y-2")


@pytest.mark.parametrize("content, needle", [
    ("127.0.0.1:6379\x1b]0;owned\x07\n", "not the HOST:PORT `ray start` writes"),
    ("h:1\nINFO Connected to the cluster", "not the HOST:PORT `ray start` writes"),
    ("x" * 100_000, "not the HOST:PORT `ray start` writes"),
    ("admin:s3cr3t@head:6379", "not the HOST:PORT `ray start` writes"),
    ("fifo", "a FIFO, not a regular file"),
])
def test_the_auto_address_file_is_read_bounded_and_checked(tmp_path, monkeypatch, content, needle):
    """RAY_ADDRESS=auto: the address file was read whole (a FIFO blocked for ever, a 1 GB file took 2.2 GB) and
    handed to Ray raw, whose warning echoed it (escapes, a fake log line)."""
    (tmp_path / "ray").mkdir()
    path = tmp_path / "ray" / "ray_current_cluster"
    if content == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(content)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(BadInput, match=re.escape(needle)) as err:
        dashboard_url("auto", "RAY_ADDRESS")
    shown = str(err.value)
    assert "\n" not in shown and "\x1b" not in shown and "s3cr3t" not in shown and len(shown) < 1000
