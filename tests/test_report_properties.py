"""Property tests of report JSON loading (hypothesis; the plugin's `ci` profile keeps the budget small): whatever
a report.json holds -- any bytes, or a real report with fields replaced by arbitrary JSON -- load_report, the
renderers and the `report` command end in a result or one line of BadInput (exit 2), never a traceback
(report JSONs with wrong field types or wrong-shaped sections once crashed the renderer)."""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
from hostile_json import SETTINGS, json_values, with_fields_replaced
from hypothesis import event, given
from hypothesis import strategies as st

from fixtures.report import make_report
from harness.cli import main
from harness.errors import BadInput
from harness.report.render import render_html, render_markdown
from harness.report.schema import load_report
from harness.report.trend import find_steps


@pytest.fixture(scope="module")
def report_doc() -> dict:
    """A real report (throughput, a benchmark, a failure, findings, curve verdicts) as its JSON; without plots, so
    100 examples stay fast (the plots' own inputs are covered by test_report.py)."""
    report = make_report("night", "2026-11-01T02:00:00+00:00", tps=120.0, bench_median=0.01, failing=True,
                         properties={"findings": [{"check": "c", "metric": "m", "where": "step 1", "message": "x"}],
                                     "curves.verdicts": [{"metric": "m", "statistic": "band", "passed": None,
                                                          "calibrated": False, "where": [1, 2], "detail": "x"}]})
    return report.to_dict()



def _loads_and_renders(text: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="prop-report-") as directory:
        path = Path(directory) / "report.json"
        path.write_bytes(text)
        try:
            report = load_report(path)
        except BadInput as exc:
            assert "\n" not in str(exc), str(exc)
            event("refused on load")
            return
        event("loaded")
        render_markdown(report)
        find_steps([report, report, report])
        for strict in (False, True):
            try:
                render_html(report, report, strict=strict)
            except BadInput as exc:
                assert strict and "\n" not in str(exc), str(exc)
                event("strict page refused")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            status = main(["report", str(path), "-o", str(Path(directory) / "out")])
        assert status in (0, 1) or (status == 2 and out.getvalue().count("\n") <= 1), out.getvalue()


@SETTINGS
@given(st.sampled_from(["bad\ud800name", "\udcff"]))
def test_a_lone_surrogate_is_written_escaped(report_doc, text):
    # "\ud800" is valid JSON but no UTF-8 can hold it: writing the page (or printing the name) raised
    # UnicodeEncodeError; now one line on load (st.text never draws surrogates, so they are given here)
    _loads_and_renders(json.dumps({**report_doc, "name": text, "created": text}).encode())


@SETTINGS
@given(st.data())
def test_report_with_fields_replaced(report_doc, data):
    doc = with_fields_replaced(report_doc, data)
    _loads_and_renders(json.dumps(doc).encode())


@SETTINGS
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_bytes(data):
    _loads_and_renders(data)


@SETTINGS
@given(st.dictionaries(st.sampled_from(["throughput", "throughput.graph_mode", "curves.verdicts", "curves.series",
                                        "memory.phases", "findings", "other"]), json_values, min_size=1))
def test_measurements_of_any_shape(report_doc, properties):
    # what suites record is free-form JSON: a wrong shape is a note on the page (or one line from `report`)
    doc = json.loads(json.dumps(report_doc))
    doc["tests"][0]["properties"] = properties
    _loads_and_renders(json.dumps(doc).encode())
