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
replace with the failed node ids) and `job` (the recipe and golden a night on a team's recipe was judged with); reports
without them load as before. Loading checks every field's type, so a
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
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)
from typing_extensions import NotRequired, TypedDict

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
    # the job judged and its golden (issue 45: a night on a team's recipe names the recipe and the golden it was
    # judged against), harness.report.collect.job_doc; None for the scale's built-in job and golden
    job: dict | None = None

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


# The schema, validated by pydantic (TypedDicts over the JSON, then the frozen dataclasses above). Not the
# hand-written field table it replaced: loading a 5,120-test report took 132-162 ms against its 181-214 ms (one
# process, three rounds each; importing pydantic costs ~90 ms once), the message names the field by its path
# (tests.3.duration_s), and the numeric policy is in the types. Strict scalars: a JSON true is no count, status or
# duration (bool is an int in Python), "1.0" is no number; durations are seconds in [0, MAX_SECONDS] (a 1e308 s
# night broke the trend's plot), counts are bounded, benchmark stats are metric values (10**400, NaN, inf are not).
Seconds = Annotated[float, Field(strict=True, ge=0, le=numeric.MAX_SECONDS, allow_inf_nan=False)]
Count = Annotated[StrictInt, Field(ge=0, le=numeric.MAX_COUNT)]


def _metric(value):
    if not numeric.is_metric_value(value):
        raise ValueError(f"Input should be a finite number within +-{numeric.METRIC_LIMIT:g}")
    return value


Metric = Annotated[Any, AfterValidator(_metric)]  # int or float, kept as it is (rounds: 5)
S, Opt = StrictStr, Optional  # short names: the tables below are the schema


def _open(name: str, fields: dict):
    """A TypedDict keeping keys it does not name: a benchmark's other stats (max, iqr, ...) as pytest-benchmark
    wrote them."""
    shape = TypedDict(name, fields)
    shape.__pydantic_config__ = ConfigDict(extra="allow")
    return shape


_BENCHMARK = _open("Benchmark", {"fullname": S, "stats": _open("Stats", {
    **dict.fromkeys(("median", "mean", "stddev", "rounds", "ops"), Metric), "min": NotRequired[Metric]})})
_TEST = TypedDict("Test", {
    "nodeid": S, "outcome": Literal[OUTCOMES], "duration_s": Seconds, "reason": NotRequired[S],
    "markers": NotRequired[list[S]], "properties": NotRequired[dict], "benchmark": NotRequired[Opt[_BENCHMARK]],
    "traceback": NotRequired[S], "log": NotRequired[S]})  # traceback and log: schema 2
_MACHINE = TypedDict("Machine", {
    "hostname": S, "platform": S, "python": S, "cpu_count": Count, "device_kind": S, "device_name": S,
    "device_count": Count, "hardware_profile": S, "driver": Opt[S], "cann": Opt[S], "packages": dict[S, Opt[S]],
    "host": NotRequired[Opt[dict]]})
_JOB = TypedDict("Job", {"recipe": Opt[S], "recipe_sha256": Opt[S], "recipe_env": list[S], "model_path": Opt[S],
                         "golden": Opt[S], "golden_sha256": Opt[S]})
_REPORT = TypeAdapter(TypedDict("Report", {
    "created": S, "name": S, "commit": Opt[S], "dirty": NotRequired[Opt[StrictBool]], "scale": Opt[S],
    "plan": NotRequired[Opt[dict]], "command": NotRequired[list[S]], "machine": _MACHINE, "tests": list[_TEST],
    "duration_s": Seconds, "exit_status": Annotated[StrictInt, Field(ge=-numeric.MAX_COUNT, le=numeric.MAX_COUNT)],
    "paths": NotRequired[list[S]], "job": NotRequired[Opt[_JOB]]}))


def finite(value) -> bool:
    """A number the report's renderers and trend can use: real and within harness.numeric's metric range (10**400,
    NaN, inf and 1e308 are not); not a bool."""
    return numeric.is_metric_value(value)


def report_from_dict(doc, source: str = "<dict>") -> RunReport:
    """A RunReport from its JSON (schema 1 or 2); BadInput naming `source` and the field that is wrong."""
    check_version(doc, source, schema=SCHEMA, version=READABLE_VERSIONS, what="report",
                  hint="render it with the harness version that wrote it")
    try:
        fields = _REPORT.validate_python(doc)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        value = error["input"]
        given = "" if error["type"] == "missing" else f" (got {type(value).__name__} {str(value)[:40]!r})"
        raise BadInput(f"{source}: malformed report: field {'.'.join(map(str, error['loc']))}: "
                       f"{error['msg'].removeprefix('Value error, ')}{given}") from None
    tests = tuple(TestVerdict(**{**t, "markers": tuple(t.get("markers", ()))}) for t in fields.pop("tests"))
    machine = MachineInfo(**fields.pop("machine"))
    command, paths = tuple(fields.pop("command", ())), tuple(fields.pop("paths", ()))
    # held as the current version: a version 1 report is a version 2 one with empty tracebacks and logs
    return RunReport(schema=SCHEMA, schema_version=SCHEMA_VERSION,
                     **{"plan": None, "dirty": None, "job": None, **fields}, tests=tests, machine=machine,
                     command=command, paths=paths)


def load_report(path: str | os.PathLike) -> RunReport:
    """Read a report JSON; BadInput (one line naming the file) if missing, not JSON, or of an unknown version."""
    path = Path(path)
    doc = read_json(path, missing="no such report; pass the report.json a run wrote (--report-dir)",
                    corrupt="was the run interrupted while writing it? regenerate it")
    return report_from_dict(doc, str(path))
