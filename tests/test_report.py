"""Self-tests of harness.report: the pytest collector end to end, the JSON schema and its loader, the
HTML/Markdown renderers, the trend's regression detection and the `report` CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from harness.cli import main
from harness.errors import BadInput
from harness.report.render import render_html, render_markdown
from harness.report.schema import SCHEMA_VERSION, load_report, write_report
from harness.report.trend import detect_step, regressions

SUITE = textwrap.dedent('''
    import pytest

    @pytest.mark.tiny
    def test_measures(record_property):
        record_property("throughput", {"tps_per_card": 123.2, "tps_per_device": 61.6})
        record_property("memory.phases", [{"scale": "tiny", "phase": "update", "components_gib": {"weights": 1.5},
                                           "peak_gib": 1.5, "budget_gib": 2.0, "fits": True}])

    @pytest.mark.tiny
    def test_fails():
        assert 61.6 >= 120, "median 61.6 TPS/card < target 120 over steps 2-9"

    @pytest.mark.tiny
    def test_skips():
        pytest.skip("missing hardware a3")

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture exploded")

    @pytest.mark.tiny
    def test_errors(broken):
        pass

    @pytest.mark.tiny
    def test_bench(benchmark):
        benchmark.pedantic(sum, args=(range(1000),), rounds=5, iterations=2)

    @pytest.mark.tiny
    @pytest.mark.xfail(reason="known: stale W_UV on vllm-ascend", strict=True)
    def test_known():
        assert False
''')


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A real pytest session with --report-dir over a suite with every outcome; returns (exit code, dir)."""
    root = tmp_path_factory.mktemp("collect")
    (root / "test_suite.py").write_text(SUITE)
    out = root / "report"
    # without the outer session's PYTEST_XDIST_WORKER etc.: pytest-benchmark would switch itself off
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--scale", "tiny",
                           "--report-dir", str(out), "test_suite.py"], cwd=root, capture_output=True, text=True,
                          timeout=300, env=env)
    return proc, out


def test_collector_writes_every_verdict_with_reasons_and_measurements(collected):
    proc, out = collected
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = load_report(out / "report.json")
    outcomes = {t.nodeid.split("::")[-1]: t for t in report.tests}
    assert {k: t.outcome for k, t in outcomes.items()} == {
        "test_measures": "passed", "test_fails": "failed", "test_skips": "skipped", "test_errors": "error",
        "test_bench": "passed", "test_known": "xfailed"}
    assert "61.6 TPS/card < target 120" in outcomes["test_fails"].reason
    assert outcomes["test_skips"].reason == "missing hardware a3"
    assert "fixture exploded" in outcomes["test_errors"].reason
    assert outcomes["test_measures"].properties["throughput"]["tps_per_card"] == 123.2
    assert outcomes["test_measures"].markers == ("tiny",)
    bench = outcomes["test_bench"].benchmark
    assert bench["stats"]["rounds"] == 5 and bench["stats"]["median"] > 0
    assert report.scale == "tiny" and report.plan["model"]["name"] == "tiny-dsv3" and report.exit_status == 1
    assert not report.passed and report.counts["failed"] == 1 and report.counts["error"] == 1
    doc = json.loads((out / "report.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION and doc["summary"]["total"] == 6
    # absent stack packages are recorded as null, not left out
    assert "torch_npu" in doc["machine"]["packages"] and doc["machine"]["packages"]["torch_npu"] is None
    assert doc["machine"]["packages"]["torch"] and doc["machine"]["packages"]["verl"]
    assert (out / "report.html").stat().st_size > 1000 and "FAIL" in (out / "report.md").read_text()


def test_loader_refuses_unknown_schema_versions(collected, tmp_path):
    doc = json.loads((collected[1] / "report.json").read_text())
    future = tmp_path / "future.json"
    future.write_text(json.dumps({**doc, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(BadInput, match=rf"future.json: report schema_version {SCHEMA_VERSION + 1} is not supported"):
        load_report(future)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"benchmarks": []}))  # e.g. a pytest-benchmark JSON given by mistake
    with pytest.raises(BadInput, match="not an ascend-rl-harness report"):
        load_report(other)
    truncated = tmp_path / "truncated.json"
    truncated.write_text((collected[1] / "report.json").read_text()[:200])
    with pytest.raises(BadInput, match="truncated.json: not JSON"):
        load_report(truncated)


def test_markdown_names_failures_and_figures(report_factory):
    md = render_markdown(report_factory("night-1", "2026-11-01T02:00:00+00:00", tps=123.2, bench_median=0.01,
                                        failing=True))
    # HTML escaped: CI comments render inline HTML
    assert "FAIL" in md and "peak 70.1 GiB &gt; budget 62" in md and "123.2 TPS/card" in md
    assert "| suites/perf/test_graph_mode.py::test_decode | 10.000 |" in md
    assert "✅ PASS" in render_markdown(report_factory("night-2", "2026-11-02T02:00:00+00:00", tps=120.0))


def test_html_is_self_contained_and_degrades_without_sections(report_factory):
    page = render_html(report_factory("bare", "2026-11-01T02:00:00+00:00"))
    assert 'id="verdicts"' in page and "<h2>Throughput" not in page and "<img" not in page
    assert "http://" not in page and "https://" not in page  # nothing to fetch: CI artifacts open offline


def test_step_detection_finds_the_seeded_drop():
    flat = [120.0, 121.0, 119.5, 120.5, 120.2, 119.8, 120.9, 120.1]
    k, before, after = detect_step(flat + [110.0, 109.5, 110.4])
    assert k == len(flat) and before == pytest.approx(120.15) and after == pytest.approx(110.0)


def _nights(make_report, values, **kw):
    return [make_report(f"night-{i}", f"2026-11-{i + 1:02d}T02:00:00+00:00", **{kw.get("key", "tps"): v})
            for i, v in enumerate(values)]


def test_trend_flags_a_throughput_regression_and_not_noise(report_factory):
    steady = [120.0, 121.0, 119.5, 120.5, 120.2, 119.8, 120.9, 120.1]
    found = regressions(_nights(report_factory, steady + [110.0, 109.5]))
    assert [(s.metric, s.report) for s in found] == [
        ("tps_per_card[suites/perf/test_throughput_target.py::test_tps]", "night-8")]
    assert found[0].change == pytest.approx(109.75 / 120.15 - 1)
    assert regressions(_nights(report_factory, steady)) == []  # +-1% noise is no step
    assert regressions(_nights(report_factory, steady + [130.0, 131.0])) == []  # an improvement is not a regression
    assert len(regressions(_nights(report_factory, steady + [108.0]))) == 1  # the newest night alone is flagged


def test_trend_flags_a_slower_benchmark(report_factory):
    found = regressions(_nights(report_factory, [0.010, 0.0101, 0.0099, 0.0100, 0.0112, 0.0113], key="bench_median"))
    assert [s.metric for s in found] == ["benchmark_median_s[suites/perf/test_graph_mode.py::test_decode]"]


def test_report_cli_renders_and_exits_1_on_regression(tmp_path, capsys, report_factory):
    paths = []
    for r in _nights(report_factory, [120.0, 120.5, 119.8, 120.2, 110.0]):
        paths.append(str(write_report(r, tmp_path / "in" / f"{r.name}.json")))
    assert main(["report", *paths, "-o", str(tmp_path / "out")]) == 1
    assert "regression" in capsys.readouterr().out
    assert (tmp_path / "out" / "trend.html").is_file() and (tmp_path / "out" / "night-4.html").is_file()
    assert "night-4" in (tmp_path / "out" / "trend.md").read_text()
    assert "night-4" in (tmp_path / "out" / "night-4.html").read_text()  # each page renders its own report
    assert main(["report", *paths[:4], "-o", str(tmp_path / "ok")]) == 0
    assert main(["report", str(tmp_path / "in"), "-o", str(tmp_path / "store")]) == 1  # a trend-store directory
    assert main(["report", str(tmp_path / "nope.json"), "-o", str(tmp_path / "x")]) == 2
