"""The report page in real headless Chromium: loads without console errors, shows the verdict table
and every plot. CI installs Debian's `chromium` (.ci/run); without it these tests skip with the reason."""
from __future__ import annotations

import pytest

from harness.report.browser import check_page, find_chromium
from harness.report.render import render_html

from test_report import make_report  # tests/ is on sys.path (pytest rootdir-relative prepend import)

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="missing chromium (apt-get install chromium)")


def full_report():
    """A report with every section: failures, throughput per step + roofline, curves with band, memory."""
    tp = {"run": "seed002", "hardware": "a3", "devices": 256, "cards": 128, "dies_per_card": 2, "window": [2, 3],
          "warmup": [1], "tokens_per_step": 13552845.0, "step_time_s": 859.68, "tps_per_device": 61.6,
          "tps_per_card": 123.2, "target": 120.0, "phases": [{"name": "gen", "seconds": 533.0, "share": 0.62}],
          "per_step": [{"step": s, "tokens": 1.0, "step_time_s": 1.0, "tps_per_device": v / 2, "tps_per_card": v}
                       for s, v in ((1, 112.0), (2, 123.2), (3, 123.0))],
          "roofline": {"tps_per_card_limit": 1388.0, "peak_tflops_per_card": 752.0, "peak_source": "A3 per die x 2"}}
    curves = [{"metric": "critic/rewards/mean", "passed": True, "steps": [1, 2, 3], "values": [0.1, 0.2, 0.3],
               "baseline": {"steps": [1, 2, 3], "low": [0.05, 0.15, 0.25], "high": [0.15, 0.25, 0.35],
                            "mean": [0.1, 0.2, 0.3]}},
              {"metric": "response_length/mean", "passed": False, "steps": [1, 2, 3], "values": [10, 30, 90],
               "message": "3 of 3 steps outside the band, worst step 3: 90 vs 20-40"}]
    memory = [{"scale": "full-a3", "phase": "rollout", "peak": 50.0, "budget": 62.0, "fits": True,
               "components": {"weights": 30.0, "kv_cache": 20.0}},
              {"scale": "full-a3", "phase": "update", "peak": 70.0, "budget": 62.0, "fits": False,
               "components": {"weights": 40.0, "logits": 30.0}}]
    return make_report("night-1", "2026-11-01T02:00:00+00:00", bench_median=0.01, failing=True,
                       properties={"throughput": tp, "curves.verdicts": curves, "memory.phases": memory})


def test_report_page_loads_clean_with_table_and_plots(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(full_report()))
    seen = check_page(page)
    assert seen.errors == (), seen.errors
    assert seen.verdict == "FAIL" and seen.verdict_rows == 3
    assert seen.images == 4 and seen.broken_images == ()  # TPS per step, two curves, memory
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
