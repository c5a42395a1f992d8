"""The run report: one schema-versioned JSON per run (every verdict, measurements, benchmark stats,
machine and commit), written atomically; loaders refuse versions they do not know.

Suites attach measurements with pytest's `record_property(name, value)`; the report keeps them per test
(`TestVerdict.properties`) and the renderer draws the ones it knows by name:
  "throughput"            Throughput.to_dict() (+ "target", "roofline": Roofline.to_dict())
  "throughput.graph_mode" {"platform", "eager", "graph": DecodeSpeed.to_dict(), "speedup", "tolerance",
                           "speedup_interval": RatioInterval.to_dict() (paired rounds)}
  "memory.phases"         [harness.memory PhaseMemory.to_json(): scale, phase, components_gib, peak_gib,
                           budget_gib, fits, ...]
  "curves.verdicts"       [harness.metrics.curves CurveVerdict.to_json(): metric, statistic, passed, where, ...]
  "curves.series"         harness.metrics.curves.band_series(): {metric: {steps, center, lo, hi, candidate_steps,
                          candidate, reference_runs: [{name, seed, steps, values}], ...}} (drawn with an image map
                          of the candidate's points; `report --export` writes them for TensorBoard / as wandb CSV)
  "rollout_corr.verdicts" [CurveVerdict.to_json()] of harness.metrics.rollout_corr (drawn like curves.verdicts)
  "routing.agreement"     harness.consistency.routing RoutingAgreement.to_json(): {name, tie_tol, exact,
                          layers: [{layer, tokens, agreed, share, first_flips, downstream, max_first_gap}]}
  "routing.replay"        ReplayCheck.to_json(): {name, gap_with, gap_without, agreement}
  "consistency.batch_invariance"  BatchInvariance.to_json(): {engine, claimed, cases: [{case, equal, first_token,
                          first_bits, max_abs, judged}], not_measured}
  "findings"              [harness.findings Finding.to_json(): check, metric, where, message] (the `expect` fixture)
and lists every other property as JSON.

Schema version 2 (each failure with its traceback and captured log) adds `traceback` and `log` to
every test; version 1 reports still load (both empty). Optional in both: `machine.host` (the CPU fingerprint a
known-bug row's host condition is judged on) and `paths` (pytest's positional arguments, which the rerun lines
replace with the failed node ids); reports without them load as before. Loading checks every field's type, so a
hand-edited or foreign JSON ends in one line naming the field, never a traceback in a renderer.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness import numeric
from harness.errors import BadInput
from harness.io import check_version, read_json, write_json_atomic

SCHEMA = "ascend-rl-harness/report"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
FAILING = ("failed", "error", "xpassed")


@dataclass(frozen=True)
class TestVerdict:
    """The outcome of one test: phase outcomes merged (an error in setup/teardown counts as error)."""

    __test__ = False  # a record, not a pytest test class

    nodeid: str
    outcome: str  # one of OUTCOMES
    duration_s: float
    reason: str = ""  # one line: the skip reason or the failure's last message line
    markers: tuple[str, ...] = ()
    properties: dict = field(default_factory=dict)  # record_property name -> JSON value
    benchmark: dict | None = None  # pytest-benchmark stats (seconds) when the test used the fixture
    traceback: str = ""  # schema 2: pytest's long failure text (tail), empty unless failing
    log: str = ""  # schema 2: captured stdout/stderr/log of the failing test (tail)

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING

    @property
    def findings(self) -> list:
        """What the test's failed checks named (harness.findings.Finding.to_json dicts), via `expect`."""
        found = self.properties.get("findings")
        return found if isinstance(found, list) else []


@dataclass(frozen=True)
class MachineInfo:
    hostname: str
    platform: str
    python: str
    cpu_count: int
    device_kind: str  # npu | gpu | cpu
    device_name: str
    device_count: int
    hardware_profile: str
    driver: str | None  # NPU driver / CUDA driver version, None on CPU
    cann: str | None  # CANN toolkit version, None without CANN
    packages: dict[str, str | None]
    # the CPU's fingerprint (harness.config.host.fingerprint): a known-bug row's host condition is judged on it, as
    # doctor judges it on this machine (the AMX row was blamed on a host without AMX); None where it was not recorded
    host: dict | None = None


@dataclass(frozen=True)
class RunReport:
    schema: str
    schema_version: int
    created: str  # ISO 8601 UTC
    name: str
    commit: str | None
    dirty: bool | None
    scale: str | None
    plan: dict | None
    command: tuple[str, ...]
    machine: MachineInfo
    tests: tuple[TestVerdict, ...]
    duration_s: float
    exit_status: int
    # the positional arguments of `command` (pytest's config.args: files, directories, node ids): the rerun lines
    # replace them with the failed node ids (harness.report.failures.rerun_args)
    paths: tuple[str, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        return {o: sum(t.outcome == o for t in self.tests) for o in OUTCOMES}

    @property
    def passed(self) -> bool:
        """All ran tests passed (skips allowed) and pytest itself succeeded."""
        return self.exit_status == 0 and not any(t.failing for t in self.tests)

    def properties(self, name: str) -> list[tuple[str, object]]:
        """(nodeid, value) of every test that recorded property `name`."""
        return [(t.nodeid, t.properties[name]) for t in self.tests if name in t.properties]

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc["summary"] = {**self.counts, "total": len(self.tests), "passed_all": self.passed}
        return doc


def _driver_version(kind: str) -> str | None:
    if kind == "npu":
        from harness.config.installed import driver_version

        return driver_version()
    if kind == "gpu":
        try:
            import torch

            return f"cuda {torch.version.cuda}"
        except Exception:  # noqa: BLE001 -- provenance only; never fail a report for it
            return None
    return None


def machine_info() -> MachineInfo:
    """This machine: host, device (harness.config.hardware.detect), driver/CANN and the stack's versions."""
    from harness.config.hardware import STACK_PACKAGES, detect, package_versions
    from harness.config.installed import cann_version

    found, installed = detect(), package_versions()
    return MachineInfo(
        hostname=socket.gethostname(), platform=platform.platform(), python=platform.python_version(),
        cpu_count=os.cpu_count() or 1, device_kind=found.kind, device_name=found.device_name,
        device_count=found.device_count, hardware_profile=found.profile.name,
        driver=_driver_version(found.kind), cann=cann_version(),
        packages={p: installed.get(p) for p in STACK_PACKAGES},  # null where absent (a CPU run has no torch_npu)
        host=_host())


def _host() -> dict | None:
    from harness.config.host import fingerprint

    try:
        return fingerprint()
    except Exception:  # noqa: BLE001 -- provenance (no torch, no /proc/cpuinfo): never fail a report for it
        return None


def git_commit(cwd: str | os.PathLike | None = None) -> tuple[str | None, bool | None]:
    """(commit sha, dirty) of the checkout, (None, None) outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if sha.returncode:
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=10)
        return sha.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_report(report: RunReport, path: str | os.PathLike, *, overwrite: bool = True) -> Path:
    """Write the report JSON atomically (a crash never leaves half a report); `overwrite=False` never replaces
    an existing file (a trend store's entries)."""
    return write_json_atomic(path, report.to_dict(), overwrite=overwrite)


def report_name(prefix: str, created: str) -> str:
    """A report's name: `<scale>-<created to the second>-<8 random hex>`, unique by construction (two sessions in
    one second named their reports alike, and a trend keyed by name showed one of them; 4 hex digits collided in 1
    of 50 names about 2 % of the time)."""
    import secrets

    return f"{prefix}-{created[:19].replace(':', '')}-{secrets.token_hex(4)}"


# The field table is the schema. Not jsonschema (in the stack through Ray and vLLM): its "number" takes the 1e308 s
# and 10**400 values the numeric policy refuses, so the range checks stay code either way, and its messages
# ("'x' is not of type 'number'") would need translating into the one line naming the report and the field.
_STR, _OPT_STR, _NUM, _INT = (str,), (str, type(None)), (int, float), (int,)
_MACHINE = {"hostname": _STR, "platform": _STR, "python": _STR, "cpu_count": _INT, "device_kind": _STR,
            "device_name": _STR, "device_count": _INT, "hardware_profile": _STR, "driver": _OPT_STR, "cann": _OPT_STR,
            "packages": (dict,), "host": (dict, type(None))}
_REPORT = {"created": _STR, "name": _STR, "commit": _OPT_STR, "dirty": (bool, type(None)), "scale": _OPT_STR,
           "plan": (dict, type(None)), "command": (list,), "machine": (dict,), "tests": (list,), "duration_s": _NUM,
           "exit_status": _INT, "paths": (list,)}
_TEST = {"nodeid": _STR, "outcome": _STR, "duration_s": _NUM, "reason": _STR, "markers": (list,),
         "properties": (dict,), "benchmark": (dict, type(None)), "traceback": _STR, "log": _STR}
_OPTIONAL = {"reason", "markers", "properties", "benchmark", "traceback", "log", "plan", "command", "dirty", "host",
             "paths"}
_BENCH_STATS = ("median", "mean", "stddev", "rounds", "ops")


def _check(doc: dict, spec: dict, where: str) -> dict:
    """The fields of `spec` from `doc`, each of its type; BadInput naming the first that is not."""
    out = {}
    for key, types in spec.items():
        if key not in doc:
            if key in _OPTIONAL:
                continue
            raise BadInput(f"{where}: field {key!r} is missing")
        value = doc[key]
        # bool is an int in Python; JSON true is no count, status or duration
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise BadInput(f"{where}: field {key!r} is {type(value).__name__} {str(value)[:40]!r}, expected "
                           + " or ".join("null" if t is type(None) else t.__name__ for t in types))
        if types is _NUM and not numeric.is_real(value):
            raise BadInput(f"{where}: field {key!r} is {str(value)[:40]}, expected a finite number")
        # the numeric policy: durations are seconds (a 1e308 s night broke the trend's plot), counts are bounded
        if types is _NUM:
            numeric.real(value, f"{where}: field {key!r}", low=0.0, high=numeric.MAX_SECONDS)
        elif types is _INT:
            numeric.integer(value, f"{where}: field {key!r}", low=-numeric.MAX_COUNT if key == "exit_status" else 0)
        out[key] = value
    return out


def finite(value) -> bool:
    """A number the report's renderers and trend can use: real and within harness.numeric's metric range (10**400,
    NaN, inf and 1e308 are not); not a bool."""
    return numeric.is_metric_value(value)


def _test_from_dict(t, where: str) -> TestVerdict:
    if not isinstance(t, dict):
        raise BadInput(f"{where}: a test is {type(t).__name__}, expected an object")
    fields = _check(t, _TEST, where)
    if fields["outcome"] not in OUTCOMES:
        raise BadInput(f"{where}: outcome {fields['outcome'][:40]!r} is none of {', '.join(OUTCOMES)}")
    if not all(isinstance(m, str) for m in fields.get("markers", ())):
        raise BadInput(f"{where}: markers must be strings")
    bench = fields.get("benchmark")
    if bench is not None:  # drawn by the renderer and the trend: its shape is checked here, once
        stats = bench.get("stats")
        if not isinstance(bench.get("fullname"), str) or not isinstance(stats, dict) or not all(
                finite(stats.get(k)) for k in _BENCH_STATS) or ("min" in stats and not finite(stats["min"])):
            raise BadInput(f"{where}: benchmark needs a string fullname and finite numeric stats "
                           f"{', '.join(_BENCH_STATS)}")
    return TestVerdict(**{**fields, "markers": tuple(fields.get("markers", ()))})


def report_from_dict(doc, source: str = "<dict>") -> RunReport:
    """A RunReport from its JSON (schema 1 or 2); BadInput naming `source` and the field that is wrong."""
    check_version(doc, source, schema=SCHEMA, version=READABLE_VERSIONS, what="report",
                  hint="render it with the harness version that wrote it")
    where = f"{source}: malformed report"
    fields = _check(doc, _REPORT, where)
    machine = _check(fields.pop("machine"), _MACHINE, f"{where} (machine)")
    if not all(isinstance(k, str) and isinstance(v, (str, type(None))) for k, v in machine["packages"].items()):
        raise BadInput(f"{where} (machine): packages must map names to version strings or null")
    command, paths = fields.pop("command", []), fields.pop("paths", [])
    if not all(isinstance(a, str) for a in (*command, *paths)):
        raise BadInput(f"{where}: command and paths must be lists of strings")
    tests = tuple(_test_from_dict(t, f"{where} (test {i})") for i, t in enumerate(fields.pop("tests")))
    # held as the current version: a version 1 report is a version 2 one with empty tracebacks and logs
    return RunReport(schema=SCHEMA, schema_version=SCHEMA_VERSION, **{"plan": None, "dirty": None, **fields},
                     command=tuple(command), tests=tests, machine=MachineInfo(**machine), paths=tuple(paths))


def load_report(path: str | os.PathLike) -> RunReport:
    """Read a report JSON; BadInput (one line naming the file) if missing, not JSON, or of an unknown version."""
    path = Path(path)
    doc = read_json(path, missing="no such report; pass the report.json a run wrote (--report-dir)",
                    corrupt="was the run interrupted while writing it? regenerate it")
    return report_from_dict(doc, str(path))
