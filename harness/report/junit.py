"""A run report as JUnit XML (`junit.xml` of the report set): what Jenkins, GitLab and GitHub's test views read.

The layout is pytest's own `--junitxml` with junit_family xunit1 (the one of its families that keeps a testcase's
`<properties>`; _pytest/junitxml.py `LogXML`): testsuites > testsuite (counts, time, timestamp, hostname; the
run's scale, commit, command and versions as suite properties) > testcase (classname and name from the node id, as
pytest mangles them; time) with `<failure>` / `<error>` / `<skipped>` and the captured log as `<system-out>`.
Two things differ, and are why the set carries its own file instead of pytest's: every property value is JSON
(pytest writes `str(value)`: a Python repr such as `{'engine': 'reference'}` that no tool can parse), and it is
rendered from the report itself, so it sits in the report's generation with the other files, written with them,
and holds exactly what the report holds (verdicts already redacted by the collector; every text passes
harness.redact once more here). A `--junitxml` passed after `run --` is still pytest's, beside this one.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from harness.numeric import json_text
from harness.redact import redact, redact_argv
from harness.report.failures import e_line
from harness.report.schema import RunReport, TestVerdict
from harness.report.trend import versions

# Characters XML 1.0 cannot hold at all (control characters of a captured log, lone surrogates): shown as #xNN,
# as pytest's bin_xml_escape does, instead of a file no parser reads.
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value) -> str:
    return _NOT_XML.sub(lambda m: f"#x{ord(m.group()):02X}", redact(str(value)))


def case_names(nodeid: str) -> tuple[str, str]:
    """(classname, name) of a node id as pytest's junitxml writes them: `suites/perf/test_x.py::TestA::test_b[p]`
    -> (`suites.perf.test_x.TestA`, `test_b[p]`); parameters (which may hold `::`) stay whole."""
    base, bracket, params = nodeid.partition("[")
    path, *names = base.split("::")
    dotted = re.sub(r"\.py$", "", path.replace("/", "."))
    if not names:  # a collection error of a whole module
        return dotted, (bracket + params) or dotted.rsplit(".", 1)[-1]
    return ".".join([dotted, *names[:-1]]), names[-1] + bracket + params


def _properties(parent: ET.Element, items) -> None:
    props = ET.SubElement(parent, "properties")
    for name, value in items:
        ET.SubElement(props, "property", name=_text(name),
                      value=_text(value if isinstance(value, str) else json_text(value, indent=None)))


def _case(suite: ET.Element, test: TestVerdict) -> None:
    classname, name = case_names(test.nodeid)
    case = ET.SubElement(suite, "testcase", classname=_text(classname), name=_text(name),
                         file=_text(test.nodeid.partition("::")[0]), time=f"{test.duration_s:.3f}")
    if test.properties:
        _properties(case, sorted(test.properties.items()))
    detail = _text(test.traceback or test.reason)
    # message = the E line (the headline CI test views show), the text the page's failure block leads with
    if test.outcome in ("failed", "xpassed"):  # a strict xpass fails the run: pytest reports it as a failure
        ET.SubElement(case, "failure", message=_text(e_line(test))).text = detail
    elif test.outcome == "error":
        ET.SubElement(case, "error", message=_text(e_line(test))).text = detail
    elif test.outcome in ("skipped", "xfailed"):
        ET.SubElement(case, "skipped", type="pytest.xfail" if test.outcome == "xfailed" else "pytest.skip",
                      message=_text(test.reason))
    if test.log:
        ET.SubElement(case, "system-out").text = _text(test.log)


def render_junit(report: RunReport) -> str:
    """The report as one JUnit XML document (UTF-8)."""
    c = report.counts
    suite = ET.Element("testsuite", name=_text(report.name), tests=str(len(report.tests)),
                       failures=str(c["failed"] + c["xpassed"]), errors=str(c["error"]),
                       skipped=str(c["skipped"] + c["xfailed"]), time=f"{report.duration_s:.3f}",
                       timestamp=_text(report.created), hostname=_text(report.machine.hostname))
    _properties(suite, [("scale", report.scale), ("commit", report.commit), ("dirty", report.dirty),
                        ("command", " ".join(redact_argv(report.command))), ("exit_status", report.exit_status),
                        ("device", f"{report.machine.device_kind} {report.machine.device_name}"),
                        *((f"version {k}", v) for k, v in versions(report).items())])
    for test in report.tests:
        _case(suite, test)
    root = ET.Element("testsuites", name=_text(report.name))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
