"""pytest plugin (entry point `pytest11`): options, marker registration, the skip-or-fail decision for every
test's needs, scale and hardware fixtures, and the report collector under `--report-dir`.

The vocabulary (marker tables, stash keys, `requires(...)`, `skip_or_fail`) lives in harness.markers, which
suites and fixtures import; nothing in the library imports this module.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.config import hardware as hw
from harness.config.scales import LOCAL_TIERS, SCALES, TIERS, Scale, default_scale, get_scale
from harness.errors import BadInput, HardwareError, Terminated, exit_code, termination_raises
from harness.findings import CheckResult
from harness.launch.address import dashboard_url
from harness.markers import (
    CLUSTER_KEY,
    DETECTED_KEY,
    ENGINE_KEY,
    HARDWARE_MARKERS,
    OTHER_MARKERS,
    SCALE_KEY,
    TIER_MARKERS,
    skip_or_fail,
)
from harness.redact import redact, redact_doc


def _redact_report(report) -> None:
    """A test's report with every credential masked (harness.redact) before anything reads it: the terminal,
    JUnit XML, xdist's controller and the harness report all take it from here. A failure message, a captured log
    or a record_property value naming `http://user:TOKEN@host` otherwise reached them all. Only a report that holds
    a secret changes (its long representation then becomes the redacted text)."""
    text = report.longreprtext
    if text and redact(text) != text:
        if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
            report.longrepr = (*report.longrepr[:2], redact(str(report.longrepr[2])))
        else:
            report.longrepr = redact(text)
    report.sections = [(redact(name), redact(content)) for name, content in report.sections]
    if hasattr(report, "user_properties"):  # a collection report has none
        report.user_properties = [(name, redact_doc(value)) for name, value in report.user_properties]


UPSTREAM_KEY = pytest.StashKey["pytest.Mark"]()  # the item's upstream_failure marker (harness.markers)
# The project's own tests: a bare xfail there is refused (a user's tests elsewhere are theirs to mark).
PROJECT_DIRS = tuple(Path(__file__).resolve().parent.parent / d for d in ("suites", "tests"))


def expect_upstream_failures(items: list[pytest.Item]) -> None:
    """Turn each `upstream_failure` marker into pytest's strict xfail with its `raises`, and refuse an xfail in
    the project's tests that does not say what it expects (harness.markers.upstream_failure): one usage error
    naming every such test."""
    bare = []
    for item in items:
        mark = item.get_closest_marker("upstream_failure")
        if mark is not None:
            item.stash[UPSTREAM_KEY] = mark
            item.add_marker(pytest.mark.xfail(mark.kwargs.get("condition", True), strict=True,
                                              raises=mark.kwargs["raises"], reason=mark.kwargs["reason"]))
        elif item.get_closest_marker("xfail") is not None and any(item.path.is_relative_to(d) for d in PROJECT_DIRS):
            bare.append(item.nodeid)
    if bare:
        raise pytest.UsageError(f"{len(bare)} xfail(s) without the failure they expect ({', '.join(bare[:5])}): "
                                "use harness.markers.upstream_failure(raises=..., match=..., reason=...)")


def _judge_expected_failure(item: pytest.Item, call, report) -> None:
    """An xfailed report whose exception is not the one its upstream_failure names becomes a failure: the type
    pytest checked, the message is checked here."""
    mark = item.stash.get(UPSTREAM_KEY, None)
    if mark is None or not report.skipped or not hasattr(report, "wasxfail") or call.excinfo is None:
        return
    exc = call.excinfo.value
    if re.search(mark.kwargs["match"], str(exc)):
        return
    del report.wasxfail
    report.outcome = "failed"
    report.longrepr = (f"expected failure not seen: {mark.kwargs['raises'].__name__} matching "
                       f"/{mark.kwargs['match']}/ ({mark.kwargs['reason']}); got {type(exc).__name__}: "
                       f"{str(exc)[:2000]}\n\n{report.longreprtext}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    _judge_expected_failure(item, call, report)
    _redact_report(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    _redact_report(report)
    return report


@dataclass
class Need:
    """What an item needs; `missing()` lists what this machine lacks, in words."""

    hardware: set[str] = field(default_factory=set)
    cards: int = 0
    devices: int = 0
    packages: set[str] = field(default_factory=set)
    cluster: bool = False

    def missing(self, found: hw.Detected, cluster: dict) -> list[str]:
        out = []
        for name in sorted(self.hardware):
            if not found.satisfies(name):
                out.append(f"hardware {name} ({HARDWARE_MARKERS[name]}); found {found.kind} ({found.device_name})")
        devices_here = cluster.get("devices", found.device_count if found.kind != "cpu" else 0)
        cards_here = devices_here // found.profile.dies_per_card
        if self.devices and devices_here < self.devices:
            out.append(f"{self.devices} devices; found {devices_here}")
        if self.cards and cards_here < self.cards:
            out.append(f"{self.cards} cards; found {cards_here}")
        if self.cluster and not cluster.get("address"):
            out.append("a Ray cluster (--ray-address)")
        for pkg in sorted(self.packages):
            if not hw.module_exists(pkg):
                out.append(f"package {pkg} (pip install it; see requirements/)")
        return out


def tier_need(scale: Scale) -> Need:
    """What running a scale for real needs. tiny and layer run anywhere (CPU, fake tensors)."""
    if scale.tier in LOCAL_TIERS:
        return Need()
    return Need(hardware={scale.hardware.name}, devices=scale.devices, cluster=scale.nodes > 1)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("ascend-rl-harness")
    g.addoption("--scale", default=None, choices=sorted(SCALES),
                help="run only the tier of this scale and use it for the `scale` fixture (default: per tier marker)")
    g.addoption("--hardware", default="auto", choices=hw.HARDWARE_CHOICES,
                help="hardware to run on; auto detects npu, then cuda, then cpu")
    g.addoption("--strict-hardware", action="store_true",
                help="fail, instead of skip, any test whose hardware, cards or packages are missing")
    g.addoption("--report-dir", default=None, help="directory for the run's JSON/HTML report")
    g.addoption("--baseline", default=None, help="golden baseline file for alignment/regression suites")
    g.addoption("--run-dir", default=None, help="an existing run directory (verl logs) to assert on")
    g.addoption("--engine", default=None, metavar="MODULE:FACTORY",
                help="the system under test: a factory returning a harness Engine (default: built-in engines); "
                     "imports and runs MODULE, so name only code you trust")
    g.addoption("--tiny-verl", default="here", choices=("here", "elsewhere", "only"),
                help="where the tiny verl runs (verl on vLLM CPU in a loopback-only Ray cluster: needs root, "
                     "unshare and iproute2) go: here (default); elsewhere: deselected, another job runs them (the "
                     "NPU nightly's container has no iproute2 and no privileges: the workflow's tiny-verl-cpu job "
                     "on a CPU runner); only: nothing but them (that CPU job)")
    g.addoption("--recipe", default=None, metavar="FILE",
                help="your own job (a launch script or a Hydra YAML, as `plan --recipe` reads it): the tiers run it "
                     "instead of the scale's built-in job (tiny: rehearsed on verl's real trainer at tiny scale) and "
                     "judge it against --baseline, a golden recorded from this recipe's own runs")
    g.addoption("--recipe-env", action="append", default=[], metavar="NAME=VALUE",
                help="a variable of the environment --recipe's launch script is started with (repeatable), as in "
                     "`NAME=VALUE bash script.sh`: a script that stops on an unset ${NAME:?} needs it")
    g.addoption("--model-path", default=None, metavar="DIR",
                help="with --recipe on a launched tier: the HF model directory on the cluster's shared storage "
                     "(default: the recipe's actor_rollout_ref.model.path, else the scale's)")
    g.addoption("--ray-address", default=None,
                help="the Ray dashboard of an existing cluster, http://HEAD:8265 (Jobs + state API; the launcher "
                     "submits there and device counts come from there)")


class _Signals:
    """SIGTERM/SIGHUP unwind the session like Ctrl-C (harness.errors.termination_raises): pytest_sessionfinish
    runs -- the background tiny verl launcher is stopped, the report set is not swapped in -- instead of the
    process dying where it stands; the session then exits 128 + the signal (143), Ctrl-C keeps pytest's 2."""

    def __init__(self):
        self.handlers = contextlib.ExitStack()
        self.handlers.enter_context(termination_raises())
        self.interrupt: KeyboardInterrupt | None = None

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.interrupt = excinfo.value

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if isinstance(self.interrupt, Terminated):
            session.exitstatus = exit_code(self.interrupt)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.handlers.close()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    from harness.config.host import apply_isa_mask

    try:  # HARNESS_CPU_ISA: behave as a plainer host, before any test runs a kernel
        apply_isa_mask()
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None
    for name, text in {**TIER_MARKERS, **HARDWARE_MARKERS, **OTHER_MARKERS}.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if not hasattr(config, "workerinput"):  # xdist's controller stops its workers
        config.pluginmanager.register(_Signals(), "harness-signals")
    try:
        config.stash[DETECTED_KEY] = hw.resolve(config.getoption("hardware"))
    except HardwareError as exc:
        raise pytest.UsageError(str(exc)) from None
    scale_name = config.getoption("scale")
    config.stash[SCALE_KEY] = get_scale(scale_name) if scale_name else None
    address = config.getoption("ray_address")
    try:  # one meaning of --ray-address (the dashboard URL); a GCS or ray:// address is a usage error up front
        config.stash[CLUSTER_KEY] = {"address": dashboard_url(address) if address else None}
        if address:  # the cluster's job writes where only a shared run root lets this host read it
            from harness.launch.jobs import shared_run_root

            shared_run_root()
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None
    _check_input_paths(config)
    config.stash[ENGINE_KEY] = _engine_factory(config.getoption("engine"))
    _register_hypothesis_profiles()
    if config.getoption("report_dir"):  # outcomes + record_property measurements -> report.json/.html/.md
        from harness.report.collect import ReportCollector

        try:
            check_report_dir(config.getoption("report_dir"))
        except BadInput as exc:
            raise pytest.UsageError(str(exc)) from None
        config.pluginmanager.register(ReportCollector(config, config.getoption("report_dir")), "harness-report")


def check_report_dir(path: str | os.PathLike, option: str = "--report-dir") -> Path:
    """`path` as a report directory, created if absent; BadInput, one line naming `option`, for a file there or a
    directory that cannot be made, whatever the reason (issue 48: `--report-dir /proc/self/x`, ENOENT, was a
    traceback in `run` and an INTERNALERROR here; a full, read-only or denied file system said so already). The one
    check of `run`, `gate` and this plugin."""
    from harness.io import file_kind

    if not os.fspath(path).strip():  # Path("") is ".": `run --report-dir ""` wrote its set into the working directory
        raise BadInput(f"{option} '': empty; pass a directory")
    path = Path(path)
    kind = file_kind(path)
    if kind not in (None, "directory"):
        raise BadInput(f"{option} {path}: is a {kind}; pass a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise BadInput(f"{option} {path}: cannot be made a directory ({getattr(exc, 'strerror', None) or exc}); "
                       "choose a directory you can write") from None
    return path


def _check_input_paths(config: pytest.Config) -> None:
    """--run-dir and --baseline name what the suites assert on: one that is missing, or a directory without verl
    logs, is a usage error up front (pytest exit 4, `run` exit 2), not a FAIL report from every test that reads
    it. The logs themselves are read, and judged, by the tests."""
    for option in ("run_dir", "baseline"):
        path = config.getoption(option)
        if path is None:
            continue
        try:
            check_input_path("--" + option.replace("_", "-"), path)
        except BadInput as exc:
            raise pytest.UsageError(str(exc)) from None
    try:  # read now: a recipe the launcher would refuse is one usage error, not a failed run minutes later
        user_recipe(config)
    except BadInput as exc:
        raise pytest.UsageError(f"--recipe: {exc}") from None


def check_input_path(flag: str, path: str) -> None:
    """BadInput, one line naming `flag`, for a --run-dir / --baseline that is missing or a directory without verl
    logs; a --baseline file passes (a golden JSON, a verl nightly summary or a baseline run's log: the suite says which
    it takes). Also `run --golden`'s check, before its report directory is touched."""
    from harness.metrics.ingest import run_sources

    if flag == "--baseline" and os.path.isfile(path):
        return
    try:
        run_sources(path)
    except BadInput as exc:
        raise BadInput(f"{flag}: {exc}") from None


def user_recipe(config: pytest.Config):
    """The team's job of --recipe, its launch script started with --recipe-env's variables
    (harness.config.user_recipe.UserRecipe), or None without --recipe. BadInput as `plan --recipe` would refuse it."""
    from harness.config.user_recipe import parse_recipe_env, read_recipe

    recipe = config.getoption("recipe", None)
    env = parse_recipe_env(config.getoption("recipe_env", None) or ())
    return read_recipe(recipe, (), env) if recipe else None


def _engine_factory(target: str | None):
    """--engine resolved once, up front: a bad one (`os:getcwd`, a typo) is one usage error (exit 4), not an
    error inside every MLA test."""
    if not target:
        return None
    from harness.engines.base import load_factory  # imports torch: only when --engine is given

    try:
        return load_factory(target)
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None


def _register_hypothesis_profiles() -> None:
    """`ci` (the default everywhere, `make test` included): derandomized, so the same commit gives the same
    verdict on every run and host. `explore` (opt in: HYPOTHESIS_PROFILE=explore) draws new cases each run, more
    of them: what finds the next hostile input, never what gates a merge."""
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=100)
    settings.register_profile("explore", deadline=None, max_examples=500)
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    try:
        settings.load_profile(name)
    except Exception:  # noqa: BLE001 -- hypothesis raises InvalidArgument for an unknown profile
        raise pytest.UsageError(f"HYPOTHESIS_PROFILE={name!r}: use ci (the default) or explore") from None


def item_tier(item: pytest.Item) -> str | None:
    tiers = [t for t in TIERS if item.get_closest_marker(t)]
    return tiers[0] if tiers else None


def applies(item: pytest.Item) -> bool:
    """Does the item apply to this session's scale? Its tier must be --scale's, and a `scales(...)` marker must name
    the scale it runs at (the A3-only 120 TPS/card target must not run -- and fail under
    --strict-hardware -- on an A2 nightly, whose `full` tier is full-a2-gbs128)."""
    chosen = item.config.stash[SCALE_KEY]
    tier = item_tier(item)
    if chosen is not None and tier is not None and tier != chosen.tier:
        return False
    only = item.get_closest_marker("scales")
    if only is None:
        return True
    unknown = [n for n in only.args if n not in SCALES]
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.scales names unknown scale(s) {unknown}")
    at = scale_for(item)
    return at is not None and at.name in only.args


@pytest.hookimpl(trylast=True)  # after the fixture modules' hooks, which add upstream_failure marks by engine kind
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    expect_upstream_failures(items)
    keep, drop = [], []
    for item in items:
        (keep if applies(item) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    # after every deselection (-m, -k: `pytest -m tiny --recipe moonlight.sh` never plans the reduced tier it skips)
    _record_reductions(session.config, session.items)


REDUCTION_PROPERTY = "recipe.reduction"  # the report's record of what the reduced tier changed in --recipe's job


def _record_reductions(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--recipe at the reduced tier (issue 45): the recipe brought up at reduced layers on one node
    (harness.config.job.reduce), planned once per scale. Each change is printed, one line (`reduced: KEY FROM -> TO
    (why)`), before any test runs -- on a CPU host too, where the tier then skips for want of its node (under xdist
    `run` prints them) -- and recorded on every reduced test of the report (REDUCTION_PROPERTY). A recipe the tier
    cannot reduce is a usage error."""
    if not config.getoption("recipe", None):
        return
    from harness.config.job import build_job

    jobs: dict[str, object] = {}
    for item in items:
        scale = scale_for(item)
        if scale is None or scale.tier != "reduced":
            continue
        if scale.name not in jobs:
            try:
                jobs[scale.name] = job = build_job(scale, user_recipe(config),
                                                   model_path=config.getoption("model_path", None))
            except BadInput as exc:
                raise pytest.UsageError(f"--recipe at scale {scale.name}: {exc}") from None
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None and not hasattr(config, "workerinput"):  # an xdist worker's terminal is unseen
                reporter.write_line(f"--recipe {job.user.source} at scale {scale.name}: {len(job.reduction)} change(s)")
                for change in job.reduction:
                    reporter.write_line(change.line())
        item.user_properties.append((REDUCTION_PROPERTY, [c.to_json() for c in jobs[scale.name].reduction]))


def scale_for(item: pytest.Item) -> Scale | None:
    chosen = item.config.stash[SCALE_KEY]
    if chosen is not None:
        return chosen
    tier = item_tier(item)
    return default_scale(tier, item.config.stash[DETECTED_KEY].profile.name) if tier else None


def item_need(item: pytest.Item) -> Need:
    scale = scale_for(item)
    need = tier_need(scale) if scale else Need()
    need.hardware |= {m for m in HARDWARE_MARKERS if m != "cpu" and item.get_closest_marker(m)}
    for mark in item.iter_markers("requires"):
        if mark.kwargs.get("hardware"):
            need.hardware.add(mark.kwargs["hardware"])
        need.cards = max(need.cards, mark.kwargs.get("cards") or 0)
        need.devices = max(need.devices, mark.kwargs.get("devices") or 0)
        need.packages |= set(mark.kwargs.get("packages") or ())
    return need


def _cluster(config: pytest.Config) -> dict:
    """With --ray-address, count the cluster's NPU/GPU devices once (lazily: only when a test needs it), through
    the dashboard's state API with a connect timeout (harness.launch.address); an unreachable cluster is one
    usage error for the session, not a hang in every test's setup."""
    info = config.stash[CLUSTER_KEY]
    if info.get("address") and "devices" not in info:
        from harness.launch.address import cluster_devices

        try:
            info["devices"] = cluster_devices(info["address"])
        except BadInput as exc:
            info["devices"] = 0
            info["error"] = str(exc)
    if info.get("error"):
        pytest.exit(info["error"], returncode=pytest.ExitCode.USAGE_ERROR)
    return info


def pytest_runtest_setup(item: pytest.Item) -> None:
    need = item_need(item)
    if not (need.hardware or need.cards or need.devices or need.packages or need.cluster):
        return
    cluster = _cluster(item.config) if (need.cards or need.devices or need.cluster) else {}
    missing = need.missing(item.config.stash[DETECTED_KEY], cluster)
    if missing:
        skip_or_fail(item.config, "; ".join(missing))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Device-generic tests: one parametrization over the device types present (npu, cuda, cpu).
    if "device" in metafunc.fixturenames:
        found = metafunc.config.stash[DETECTED_KEY]
        metafunc.parametrize("device", hw.torch_device_types(found), ids=lambda d: d)


def pytest_report_header(config: pytest.Config) -> str:
    found = config.stash[DETECTED_KEY]
    scale = config.stash[SCALE_KEY]
    return (f"ascend-rl-harness: hardware {found.kind} ({found.device_name}, profile {found.profile.name}, "
            f"{found.device_count} devices); scale {scale.name if scale else 'per tier marker'}")


@pytest.fixture(scope="session")
def detected_hardware(pytestconfig: pytest.Config) -> hw.Detected:
    """The accelerator this session runs on (after --hardware)."""
    return pytestconfig.stash[DETECTED_KEY]


@pytest.fixture
def scale(request: pytest.FixtureRequest) -> Scale:
    """The Scale this test runs at: --scale, or the default scale of the test's tier marker."""
    chosen = scale_for(request.node)
    if chosen is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses the `scale` fixture but has no tier marker and no --scale")
    return chosen


@pytest.fixture
def expect(record_property):
    """`expect(*results, notes=())`: assert checker results (harness.findings.CheckResult). The findings of the
    failing ones (metric, where) are recorded on the test as the "findings" property, for the report and the
    nightly verdict lines, and the test fails with their messages (plus `notes`, e.g. log warnings)."""

    def check(*results: CheckResult, notes: Sequence[str] = ()) -> None:
        failing = [r for r in results if not r.ok]
        if not failing:
            return
        record_property("findings", [f.to_json() for r in failing for f in r.findings()])
        pytest.fail("\n".join([*(r.message() for r in failing), *notes]), pytrace=False)

    return check


@pytest.fixture
def deterministic_env(monkeypatch: pytest.MonkeyPatch):
    """Deterministic Ascend/vLLM environment plus msprobe's seed_all(mode=True) (deterministic algorithms).

    seed 003: rollout replay and curve alignment need fixed seeds and deterministic HCCL/matmul.
    """
    for key, value in hw.DETERMINISTIC_ENV.items():
        monkeypatch.setenv(key, value)
    import torch

    previous = torch.are_deterministic_algorithms_enabled()
    from msprobe.pytorch import seed_all

    seed_all(seed=1234, mode=True)
    yield dict(hw.DETERMINISTIC_ENV)
    torch.use_deterministic_algorithms(previous)
