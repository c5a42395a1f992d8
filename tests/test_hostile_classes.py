"""Reliability round 4 (issue 36), by class: each class of hostile input has a property test (hypothesis) that draws
members of the class -- not only the tester's examples -- and fails on the old behaviour.

1. identifiers that reach a URL, a path or a manifest match their grammar (Ray job ids, RFC 1123 names);
2. values written into a shell line or a manifest are quoted for their consumer (kubelet's `$(VAR)`), secrets are
   redacted and terminal escapes stripped wherever text leaves the process;
3. every network call has a total deadline (a real socket server on 127.0.0.1 that trickles or stalls).

The Ray dashboard below is a loopback HTTP server speaking the few routes of Ray 2.60's Jobs API the commands use
(ray/dashboard/modules/dashboard_sdk.py `_check_connection_and_version`, job/sdk.py `get_job_info` /
`get_job_logs`): Ray's own JobSubmissionClient talks to it, so the client, the deadline and the printing are real.
"""
from __future__ import annotations

import http.server
import json
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest
from faults import cli, cli_argv, env, one_line_exit_2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import BadInput
from harness.launch.k8s import check_pvc, manifest
from harness.launch.ray_job import check_job_id
from harness.redact import for_terminal, redact_doc

FAST = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None,
                max_examples=60)


class _Dashboard(http.server.BaseHTTPRequestHandler):
    """Ray's dashboard as far as the commands use it; `mode` trickles /api/version or stalls the Jobs API."""

    mode = "ok"
    job = {"type": "SUBMISSION", "status": "FAILED", "entrypoint": "python3 -m x", "message": "", "metadata": {}}
    logs = ""
    seen: list

    def _send(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append(self.path)
        if self.path == "/api/version":
            body = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}).encode()
            if self.mode == "trickle":  # one byte at a time, each well within any per-recv timeout
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for _ in range(600):
                    self.wfile.write(b"X-Slow: y\r\n")
                    self.wfile.flush()
                    time.sleep(0.2)
                return
            return self._send(body)
        if self.mode == "stall":  # answers the version check, then never the Jobs API
            time.sleep(60)
            return
        if self.path.endswith("/logs"):
            return self._send(json.dumps({"logs": self.logs}).encode())
        if self.path.startswith("/api/jobs/"):
            return self._send(json.dumps({**self.job, "submission_id": self.path.rsplit("/", 1)[1]}).encode())
        self._send(b"{}", 404)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def dashboard():
    handler = type("Handler", (_Dashboard,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


# ---------------------------------------------------------------------------------------------- 1. identifiers

HARNESS_ID = st.from_regex(r"harness-[a-z0-9-]{1,20}-2026[0-9]{4}-[0-9]{6}-[0-9]{1,6}", fullmatch=True)
RAY_ID = st.from_regex(r"raysubmit_[A-Za-z0-9]{16}", fullmatch=True)
# a job id with something that changes the URL it lands in: a path separator, a dot segment, a query, a fragment,
# an escape, whitespace, a non-ASCII letter, or a leading non-alphanumeric
HOSTILE_PART = st.sampled_from(["/", "/../", "..", "?", "#", "%2e%2e", "%2F", " ", "\t", "\n", "\x1b[2J", "é", "\\",
                                "&", ";", "$(id)", "'"])
HOSTILE_ID = st.one_of(
    st.builds(lambda a, bad, b: a + bad + b, st.text("abc-_.09", min_size=0, max_size=8), HOSTILE_PART,
              st.text("abc-_.09", max_size=8)),
    st.builds(lambda lead, rest: lead + rest, st.sampled_from(["-", ".", "_"]), st.text("abc", max_size=5)),
    st.text(min_size=129, max_size=200, alphabet="ab"))


@FAST
@given(job_id=st.one_of(HARNESS_ID, RAY_ID))
def test_real_job_ids_pass(job_id):
    assert check_job_id(job_id) == job_id


@FAST
@given(job_id=HOSTILE_ID)
def test_an_id_that_would_move_the_url_is_refused(job_id):
    # seeded: `launch --stop 'my-job/../victim'` sent POST /api/jobs/my-job/../victim/stop and stopped `victim`
    with pytest.raises(BadInput, match="not a Ray job id"):
        check_job_id(job_id)


@pytest.mark.parametrize("verb", ["--stop", "--status", "--logs"])
def test_a_traversing_id_never_reaches_the_jobs_api(tmp_path, dashboard, verb):
    url, handler = dashboard
    proc = cli("launch", verb, "my-job/../victim", "--ray-address", url, cwd=tmp_path, timeout=60)
    one_line_exit_2(proc, verb, "not a Ray job id")
    assert handler.seen == [], handler.seen  # not even the version check


def _rfc1123_subdomain(name: str) -> bool:
    """The grammar written out label by label (apimachinery IsDNS1123Subdomain: no per-label length in a subdomain),
    independent of the regex."""
    if not 1 <= len(name) <= 253:
        return False
    for label in name.split("."):
        if not (label and label[0].isalnum() and label[-1].isalnum()
                and all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in label)):
            return False
    return True


@FAST
@given(name=st.one_of(st.text("ab0-.", min_size=1, max_size=12), st.text("aB_-.9 ", max_size=6),
                      st.builds(lambda n: "a" * n, st.integers(250, 256)),
                      st.builds(lambda a, b: f"{a}.{b}", st.text("a-", min_size=0, max_size=3),
                                st.text("b-", min_size=0, max_size=3))))
def test_pvc_names_follow_rfc_1123(name):
    # seeded: `a..b` and `a-.b` passed the old one-class regex into claimName
    if _rfc1123_subdomain(name):
        assert check_pvc(name) == name
    else:
        with pytest.raises(BadInput, match="--pvc"):
            check_pvc(name)


# ---------------------------------------------------------------------------------------------- 2. quoting

def _kubelet(text: str, defined: dict[str, str]) -> str:
    """kubelet's expansion of a command / env value as Kubernetes documents it (EnvVar.value): `$$` -> `$`,
    `$(NAME)` -> the variable's value when NAME is defined, anything else as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(defined.get(name, f"$({name})"))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


SHELL_HOSTILE = st.lists(st.sampled_from(list("ab $()'\"`;|&\\{}") + ["$(RAY_AUTH_TOKEN)", "$$", "$(POD_IP)"]),
                         min_size=1, max_size=10).map("".join)


def _job(scale_name: str, overrides=(), env_=None):
    from harness.config.job import build_job
    from harness.config.scales import get_scale
    from harness.config.user_recipe import UserRecipe

    user = UserRecipe(source="recipe.sh", overrides=tuple(overrides), env=dict(env_ or {}))
    scale = get_scale(scale_name)
    return scale, build_job(scale, user, model_path="/m", data_dir="/d")


@FAST
@given(value=SHELL_HOSTILE, exported=SHELL_HOSTILE)
def test_recipe_values_reach_the_pod_as_written(value, exported):
    # seeded: kubelet expanded `$(RAY_AUTH_TOKEN)` in the bash -c line and in env values (the command then held the
    # cluster token); a quote in a value must not end the shell word either
    scale, job = _job("reduced-a2", [f"+trainer.note={value}"], {"NOTE_VALUE": exported})
    docs = manifest(scale, job=job)
    container = docs[-1]["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    defined = {e["name"]: "SECRET-FROM-POD" for e in container["env"]}
    line = _kubelet(container["command"][2], defined)
    assert "SECRET-FROM-POD" not in line
    # every word of verl's command line is shlex-quoted (harness.launch.jobs.verl_job): after kubelet the word is
    # there exactly as quoted, so bash hands verl the value as written
    assert shlex.quote(f"+trainer.note={value}") in line
    env_value = next(e for e in container["env"] if e["name"] == "NOTE_VALUE")["value"]
    assert _kubelet(env_value, defined) == exported


SECRET_NAMES = st.builds(lambda p, w: p + w, st.sampled_from(["", "HF_", "WANDB_", "MY_", "s3."]),
                         st.sampled_from(["TOKEN", "API_KEY", "PASSWORD", "secret", "ACCESS_KEY", "passwd"]))
SECRET_VALUES = st.text("abcXYZ0189_-+/= !", min_size=6, max_size=20).filter(lambda v: v.strip() == v and v.strip())


@FAST
@given(name=SECRET_NAMES, value=SECRET_VALUES)
def test_a_recipe_secret_is_never_in_the_manifest(name, value):
    # seeded: `export HF_TOKEN=...` was written as a plain env value into the manifest
    scale, job = _job("reduced-a2", env_={name.upper().replace(".", "_"): value})
    text = json.dumps(manifest(scale, job=job))
    assert value not in text
    assert "ascend-rl-harness-env" in text  # the pod still gets it: from the Secret


@FAST
@given(name=SECRET_NAMES, value=SECRET_VALUES)
def test_redact_doc_masks_a_secret_under_its_name(name, value):
    # seeded: {"HF_TOKEN": "x"} split the assignment: neither the key nor the value looked secret
    assert value not in json.dumps(redact_doc({"env": {name: value}, "user_env": [{name: value}]}))


def test_plan_prints_no_secret(tmp_path):
    token = "hf_Zz9SECRETvalue42"
    recipe = tmp_path / "run.sh"
    recipe.write_text(f"export HF_TOKEN={token}\nexport WANDB_API_KEY=k3y-{token}\n"
                      "python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer "
                      "actor_rollout_ref.model.path=deepseek-ai/DeepSeek-V3 trainer.device=npu trainer.nnodes=32 "
                      "trainer.n_gpus_per_node=8 data.train_batch_size=16\n")
    for fmt in ("--json", "--format=text", "--format=verl-cli"):
        proc = cli("plan", "--scale", "reduced-a2", "--recipe", recipe, fmt, "--no-validate", cwd=tmp_path,
                   timeout=120)
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        assert token not in proc.stdout + proc.stderr, fmt


CONTROL = st.lists(st.sampled_from(["\x1b[2J", "\x1b]0;owned\x07", "\x1b]8;;http://x\x1b\\", "\x9b31m", "\x1bc",
                                   "\x07", "\x08", "\r", "\x00", "\x7f", "ok", " ", "\n", "é"]),
                   max_size=12).map("".join)


@FAST
@given(text=CONTROL)
def test_for_terminal_leaves_no_control_sequence(text):
    out = for_terminal(text)
    assert all(c in "\n\t" or (c.isprintable() and not 0x80 <= ord(c) <= 0x9f) for c in out), repr(out)
    assert for_terminal(out) == out
    assert out.replace("\n", "") == re.sub(r"[^ oké]", "", out)  # only the printable parts drawn are left


def test_status_and_logs_print_no_secret_and_no_escape(tmp_path, dashboard):
    url, handler = dashboard
    token = "s3cr3t-TOKEN-99"
    handler.job = {**handler.job, "entrypoint": f"HF_TOKEN={token} python3 -m x",
                   "message": f"failed \x1b]0;owned\x07 at http://u:{token}@h\x1b[2J"}
    handler.logs = f"step 1\nWANDB_API_KEY={token}\n\x1b[1A\x1b[2KPASSED\n"
    status = cli("launch", "--status", "harness-x-1", "--ray-address", url, "--json", cwd=tmp_path, timeout=60)
    logs = cli("launch", "--logs", "harness-x-1", "--ray-address", url, cwd=tmp_path, timeout=60)
    plain = cli("launch", "--status", "harness-x-1", "--ray-address", url, cwd=tmp_path, timeout=60)
    assert status.returncode == 1 and logs.returncode == 0 and plain.returncode == 1, status.stderr + logs.stderr
    for proc in (status, logs, plain):
        assert token not in proc.stdout + proc.stderr
        assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout
    assert "step 1" in logs.stdout and "PASSED" in logs.stdout


@FAST
@given(name=CONTROL)
def test_the_console_renders_no_escape_from_text(name):
    # every command prints through harness.cli.output.console: a drawn name in a line and in a table cell
    import io

    from rich.table import Table

    from harness.cli.output import console

    out = console(file=io.StringIO(), force_terminal=False, color_system=None)
    table = Table()
    table.add_column("run")
    table.add_row(name)
    out.print(f"{name} vs golden")
    out.print(table)
    text = out.file.getvalue()
    assert "\x1b" not in text and "\x9b" not in text and "\x9d" not in text, repr(text)


def test_a_run_directory_named_with_escapes_reaches_no_terminal(tmp_path):
    # seeded: `compare` printed a run directory's name with its ESC sequences (a window-title OSC, a clear screen)
    from faults import write_runs

    runs = write_runs(tmp_path / "logs", n=2)
    dirs = []
    for i, run in enumerate(runs):
        d = tmp_path / f"run\x1b]0;owned\x07\x1b[2J{i}"
        d.mkdir()
        (d / "metrics.jsonl").write_text(Path(run).read_text())
        dirs.append(d)
    proc = cli("compare", *dirs, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\x1b" not in proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------- 3. deadlines

def test_a_trickling_dashboard_ends_within_the_connect_timeout(tmp_path, dashboard):
    # seeded: urllib's timeout bounds each recv; a header every 0.2 s kept `launch --status` waiting for minutes
    url, handler = dashboard
    handler.mode = "trickle"
    start = time.monotonic()
    proc = cli("launch", "--status", "harness-x-1", "--ray-address", url, cwd=tmp_path, timeout=60,
               env=env(HARNESS_RAY_CONNECT_TIMEOUT="1"))
    one_line_exit_2(proc, "--ray-address", "within 1 s")
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("verb", ["--status", "--logs", "--stop"])
def test_a_stalled_jobs_api_ends_in_one_line(tmp_path, dashboard, verb):
    # seeded: Ray's client sends its Jobs API requests without a timeout: a head that stalls after the version
    # check hung `launch --status/--logs/--stop` (and `launch` past its --timeout) forever
    url, handler = dashboard
    handler.mode = "stall"
    start = time.monotonic()
    proc = cli("launch", verb, "harness-x-1", "--ray-address", url, cwd=tmp_path, timeout=60,
               env=env(HARNESS_RAY_CONNECT_TIMEOUT="1"))
    one_line_exit_2(proc, "Ray job server", "within 3 s")
    assert time.monotonic() - start < 30


@FAST
@given(raw=st.one_of(st.sampled_from(["1e308", "inf", "nan", "-1", "0", "1e400", "3601", "1" + "0" * 400]),
                     st.floats(min_value=3600.5, allow_infinity=True).map(repr)))
def test_connect_timeout_is_bounded(raw, monkeypatch):
    # seeded: HARNESS_RAY_CONNECT_TIMEOUT=1e308 overflowed the socket's timeval (OverflowError traceback)
    from harness.launch.address import connect_timeout

    monkeypatch.setenv("HARNESS_RAY_CONNECT_TIMEOUT", raw)
    with pytest.raises(BadInput, match="HARNESS_RAY_CONNECT_TIMEOUT"):
        connect_timeout()


@FAST
@given(user=st.text("abcXYZ019-_.~", min_size=1, max_size=8), password=st.text("abc!$&'()*+,;=019", max_size=10))
def test_credentials_in_the_address_are_sent_as_auth_not_as_host(user, password):
    # seeded: http://user:password@HOST:PORT gave "Name or service not known" for a host that answers
    from urllib.parse import quote

    from harness.launch.address import check_dashboard, split_credentials

    seen = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen["auth"] = self.headers.get("Authorization")
            body = json.dumps({"ray_version": "2.60.0"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        url = f"http://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{server.server_address[1]}"
        assert check_dashboard(url, timeout_s=5) == "2.60.0"
        assert seen["auth"] == split_credentials(url)[1]["Authorization"]
    finally:
        thread.join(5)
        server.server_close()


@FAST
@given(address=st.builds(lambda a, ws, b: f"http://{a}{ws}{b}:8265", st.text("abc", min_size=1, max_size=4),
                         st.sampled_from([" ", "\t", "\n", "\x00", "\x1b", "\u00a0", "\u2028"]),
                         st.text("abc", max_size=4)))
def test_an_address_with_whitespace_is_one_line(address):
    from harness.launch.address import dashboard_url

    with pytest.raises(BadInput, match="space or control character") as err:
        dashboard_url(address, "RAY_ADDRESS")
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------ 4. no write onto an input

def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None,
          max_examples=6)
@given(target=st.sampled_from(["candidate-file", "candidate-in-dir", "reference", "link-to-candidate"]),
       command=st.sampled_from(["compare --plot", "baseline record --out"]))
def test_no_output_lands_on_an_input(tmp_path_factory, target, command):
    # seeded: `compare --plot` onto the candidate's metrics.jsonl and `baseline record --out` (even --force) onto
    # one of its runs overwrote the data they had just read
    from faults import write_runs

    root = tmp_path_factory.mktemp("inputs")
    runs = write_runs(root / "logs", n=3)
    run_dir = root / "cand"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(Path(runs[0]).read_text())
    (root / "link.jsonl").symlink_to(runs[0])
    out = {"candidate-file": runs[0], "candidate-in-dir": run_dir / "metrics.jsonl", "reference": runs[1],
           "link-to-candidate": root / "link.jsonl"}[target]
    candidate = run_dir if target == "candidate-in-dir" else runs[0]
    before = _tree(root)
    if command == "compare --plot":
        proc = cli("compare", candidate, runs[1], runs[2], "--plot", out, cwd=root, timeout=120)
    else:
        proc = cli("baseline", "record", candidate, runs[1], runs[2], "--out", out, "--force", cwd=root,
                   timeout=120)
    one_line_exit_2(proc, "is one of the inputs")
    assert _tree(root) == before


def test_lab_out_never_truncates_a_run_and_names_a_file(tmp_path):
    # seeded: a second `lab --out` onto a run truncated its metrics.jsonl; --out naming a file was a traceback
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "data": {"critic/rewards/mean": 0.5}}\n')
    (tmp_path / "file").write_text("keep")
    before = _tree(tmp_path)
    one_line_exit_2(cli("lab", "--steps", "1", "--out", run, cwd=tmp_path), "--out", "already holds a run")
    one_line_exit_2(cli("lab", "--steps", "1", "--out", tmp_path / "file", cwd=tmp_path), "--out", "not a directory")
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("option", ["--gbs", "--n"])
def test_lab_sizes_are_bounded_like_the_scales(tmp_path, option):
    # seeded: --gbs/--n were bounded only at 2**31 (9.4 GB of RSS after 200 s)
    from harness.cli.lab_cmd import MAX_GBS, MAX_N

    too_big = (MAX_GBS if option == "--gbs" else MAX_N) + 1
    start = time.monotonic()
    one_line_exit_2(cli("lab", option, too_big, "--out", tmp_path / "new", cwd=tmp_path), option)
    assert time.monotonic() - start < 60 and not (tmp_path / "new").exists()


def test_a_refused_launch_touches_nothing_of_the_run(tmp_path):
    # seeded: `launch --local` onto a run directory prepared the tiny job's inputs -- rewriting meta.json -- before
    # the launcher refused the directory
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n')
    (run / "meta.json").write_text('{"name": "theirs"}\n')
    before = _tree(tmp_path)
    for extra in (["--local"], ["--ray-address", "http://127.0.0.1:9"]):
        proc = cli("launch", "--scale", "tiny", "--run-dir", run, *extra, cwd=tmp_path, timeout=120)
        one_line_exit_2(proc, "--run-dir", "already holds a run")
    assert _tree(tmp_path) == before


@FAST
@given(form=st.sampled_from(["--report-dir", "--report-dir=", "--scale", "--scale="]))
def test_run_refuses_its_own_options_after_the_separator(tmp_path_factory, form):
    # seeded: `run --report-dir A -- --report-dir B` swapped A's previous report out while pytest wrote B, and the
    # JSON named A's files
    root = tmp_path_factory.mktemp("run")
    (root / "A").mkdir()
    (root / "A" / "report.json").write_text("{}")
    value = "B" if form.startswith("--report") else "tiny"
    extra = [form + value] if form.endswith("=") else [form, value]
    proc = cli("run", "--scale", "tiny", "--report-dir", "A", "--", *extra, cwd=root, timeout=120)
    one_line_exit_2(proc, form.rstrip("="), "after `--`")
    assert (root / "A" / "report.json").read_text() == "{}" and not (root / "B").exists()


# ---------------------------------------------------------------------------------------------- 5. silent verdicts

MG = "actor_rollout_ref.actor.megatron"
SIZE_KEYS = [f"{MG}.tensor_model_parallel_size", f"{MG}.pipeline_model_parallel_size",
             f"{MG}.expert_model_parallel_size", f"{MG}.context_parallel_size", f"{MG}.expert_tensor_parallel_size",
             "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.n",
             "data.train_batch_size", "trainer.nnodes", "trainer.n_gpus_per_node",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "data.max_response_length"]
IMPOSSIBLE = st.one_of(st.sampled_from([0, -1, 10**23, 10**9, 2**63]), st.integers(max_value=0),
                       st.integers(min_value=2**24 + 1, max_value=10**30))


def _main(argv: list[str]) -> tuple[int, str, str]:
    import contextlib
    import io

    from harness.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@FAST
@given(key=st.sampled_from(SIZE_KEYS), value=IMPOSSIBLE, command=st.sampled_from(["plan", "memory"]))
def test_an_impossible_size_is_never_a_pass(key, value, command):
    # seeded: tp=0 / nnodes=0 / tp=10**23 were ZeroDivisionError tracebacks, ep=10**23 a memory PASS, rollout.n=0 a
    # valid plan, pp=1e9 built a list of 1e9 stages (minutes, GBs)
    start = time.monotonic()
    code, out, err = _main([command, "--scale", "full-a3", "--json", "--", f"{key}={value}"])
    assert time.monotonic() - start < 20
    if code == 2:
        assert err.count("\n") == 1 and key in err and "Traceback" not in err, err
    else:
        doc = json.loads(out)
        assert code == 1 and doc["passed"] is False, (code, doc.get("state"))


@pytest.mark.parametrize("command", ["plan", "memory"])
def test_stage_lists_of_zeros_are_an_invalid_plan_not_a_traceback(command):
    # seeded: `max() arg is an empty sequence` from the memory model of a plan with zero-layer stages
    code, out, err = _main([command, "--scale", "full-a3", "--json", "--",
                            f"{MG}.pipeline_parallel_num_layer_list=[0,0,0,0,0,0,0,0]"])
    if command == "plan":  # the plan rule is named, and the memory verdict says it has nothing to model
        doc = json.loads(out)
        assert code == 1 and doc["passed"] is False and "stage-nonempty" in doc["plan_error"], (code, err)
        assert doc["memory"]["fits"] is None and "no memory to model" in doc["memory"]["error"]
    else:
        assert code == 2 and out == "" and err.count("\n") == 1 and "no memory to model" in err, (code, err)


@pytest.mark.parametrize("nodes", [10**8, 5008])  # 5008 x 16 dies: a valid plan
def test_no_manifest_for_more_nodes_than_a_cluster_holds(nodes):
    # seeded: a manifest with a 1e8-replica worker task was written
    code, out, err = _main(["launch", "--scale", "full-a3", "--k8s", "--", f"trainer.nnodes={nodes}"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "nodes" in err, (code, err)


def _golden():
    from harness.metrics.baseline import load_baseline

    return load_baseline(Path(__file__).resolve().parents[1] / "baselines" / "tiny" / "dapo_verl.json")


@FAST
@given(offset=st.integers(min_value=16, max_value=10**6), n=st.integers(min_value=1, max_value=20))
def test_a_run_with_no_step_in_common_is_not_aligned(offset, n):
    # seeded: a run logging steps the golden never reached was ALIGNED on its sanity limits alone
    from harness.metrics import curves
    from harness.metrics.run import Run, Series

    golden = _golden()
    run = Run("late", {m: Series(tuple(range(offset, offset + n)), tuple(ref.center[i % len(ref.center)]
                                                                         for i in range(n)))
                       for m, ref in golden.metrics.items()})
    alignment = curves.compare(run, golden)
    assert alignment.state != curves.ALIGNED and not alignment.passed, alignment.summary()


@FAST
@given(pick=st.integers(min_value=0, max_value=14), scale=st.floats(0.5, 1.5))
def test_a_run_whose_every_metric_is_constant_is_not_aligned(pick, scale):
    # seeded: every metric constant (a frozen logger, a stuck job) sat inside the bands: ALIGNED with no word
    from harness.metrics import curves
    from harness.metrics.run import Run, Series

    golden = _golden()
    run = Run("frozen", {m: Series(ref.steps, tuple(ref.center[min(pick, len(ref.center) - 1)] * scale
                                                    for _ in ref.steps)) for m, ref in golden.metrics.items()})
    alignment = curves.compare(run, golden)
    assert not alignment.passed and any(v.statistic == "liveness" for v in alignment.failures), alignment.summary()


def test_a_giant_single_line_costs_a_bounded_amount_of_memory(tmp_path):
    # seeded: a 1 GB single-line JSONL peaked at ~5x its size in RSS; here 64 MiB in one line, read at a cost
    # bounded by MAX_LINE (the cut line's parse), not by the line
    import tracemalloc

    from harness.metrics.ingest import MAX_LINE, load_run

    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        f.write('{"step": 1, "data": {"critic/rewards/mean": 0.5}}\n{"step": 2, "data": {"x": "')
        chunk = "a" * (1 << 20)
        for _ in range(64):
            f.write(chunk)
        f.write('"}}\n{"step": 3, "data": {"critic/rewards/mean": 0.6}}\n')
    tracemalloc.start()
    try:
        with pytest.raises(BadInput, match=r"metrics.jsonl:2: corrupt line"):
            load_run(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * MAX_LINE < 64 << 20, peak  # measured: ~14 MiB for a 1 MiB cut line
    run = load_run(path, strict=False)  # lenient: the cut line is skipped, the steps around it are kept
    assert run["critic/rewards/mean"].steps == (1, 3)


# ---------------------------------------------------------------------------------------------- 6. tracebacks

@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=6)
@given(depth=st.integers(min_value=1100, max_value=1500), form=st.sampled_from(["list", "map", "flow-map"]),
       digits=st.integers(min_value=4301, max_value=9000), radix=st.sampled_from(["", "0x"]),
       which=st.sampled_from(["deep", "big"]))
def test_deep_or_big_int_yaml_is_one_line(depth, form, digits, radix, which):
    # seeded: 5000 nested `[` or mappings were RecursionError tracebacks, an integer of 5000 digits a ValueError one
    from harness.config.user_recipe import parse_hydra_yaml

    if which == "deep":
        text = {"list": "a: " + "[" * depth + "]" * depth,
                "map": "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "x: 1",
                "flow-map": "a: " + "{b: " * depth + "1" + "}" * depth}[form]
    else:
        text = f"data:\n  train_batch_size: {radix}{'7' * digits}\n"
    with pytest.raises(BadInput, match="recipe.yaml") as err:
        parse_hydra_yaml(text + "\n")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("argv", [["run", "--scale", "tiny"], ["lab", "--steps", "1", "--out", "r"],
                                  ["plan", "--scale", "tiny"]])
def test_a_deleted_working_directory_is_one_line(tmp_path, argv):
    # seeded: `run` died with FileNotFoundError, `lab` with oneMKL's "Cannot load libtorch_cpu.so"
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.Popen(["bash", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "x", str(gone),
                             *cli_argv(*argv)], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    out, err = proc.communicate(timeout=120)
    one_line_exit_2(subprocess.CompletedProcess(argv, proc.returncode, out, err), "working directory")
