"""The report page in real headless Chromium: loads without console errors, shows the verdict table
and every plot. CI installs Debian's `chromium` (.ci/run); without it these tests skip with the reason."""
from __future__ import annotations

import pytest

from harness.report.browser import check_page, find_chromium
from harness.report.render import render_html

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="missing chromium (apt-get install chromium)")


def test_report_page_loads_clean_with_table_and_plots(tmp_path, full_report):
    page = tmp_path / "report.html"
    page.write_text(render_html(full_report))
    seen = check_page(page)
    assert seen.errors == (), seen.errors
    assert seen.verdict == "FAIL" and seen.verdict_rows == 3
    assert seen.images == 5 and seen.broken_images == ()  # TPS per step, graph vs eager, two curves, memory
    assert seen.ok


def test_browser_check_fails_on_a_broken_page(tmp_path):
    # Seeded bug: a truncated base64 plot and a script error must not pass as a clean page.
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><head><title>x</title></head><body><table id="verdicts"><tbody><tr><td>t'
                    '</td></tr></tbody></table><img alt="tps" src="data:image/png;base64,iVBORw0KGgoAAAA">'
                    "<script>console.error('boom'); undefinedFunction();</script></body></html>")
    seen = check_page(page)
    assert not seen.ok and seen.broken_images == ("tps",)
    assert any("boom" in e for e in seen.errors) and any("undefinedFunction" in e for e in seen.errors)
