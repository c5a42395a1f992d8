"""Self-tests of the nightly cost ledger (harness.perf.ledger, `python -m harness.report.nightly`'s COST line):
card-hours used, saved by an early abort (steps left x step time x cards), wasted had the abort been a false alarm.
Counting dies as cards doubles every figure and fails the 30.6 card-hours of one seed 002 A3 step."""
from __future__ import annotations

import pytest

from harness.errors import BadInput
from harness.perf.ledger import cost_ledger, from_json
from harness.report.nightly import main

SEED002_STEP_S, A3_CARDS = 859.68, 128


def test_one_seed002_a3_step_is_30_6_card_hours():
    ledger = cost_ledger("seed002", [SEED002_STEP_S], A3_CARDS, planned_steps=1)
    assert ledger.card_hours_used == pytest.approx(30.6, abs=0.05)
    assert ledger.card_hours_saved == 0.0 and ledger.card_hours_false_alarm is None


def test_abort_saves_the_steps_left_and_a_false_one_wastes_the_steps_run():
    ledger = cost_ledger("nan-grad", [900.0, SEED002_STEP_S, SEED002_STEP_S, 870.0, 850.0], A3_CARDS,
                         planned_steps=100, aborted_at=5)
    # median step 859.68 s: 95 steps left x 859.68 s x 128 cards
    assert ledger.card_hours_saved == pytest.approx(95 * SEED002_STEP_S * A3_CARDS / 3600)
    assert ledger.card_hours_false_alarm == pytest.approx(ledger.card_hours_used)
    assert ledger.card_hours_used == pytest.approx((900 + 2 * SEED002_STEP_S + 870 + 850) * A3_CARDS / 3600)
    assert from_json(ledger.to_json()) == ledger  # what the report stores reads back the same
    unknown = cost_ledger("nan-grad", [SEED002_STEP_S], A3_CARDS, aborted_at=1)
    assert unknown.card_hours_saved is None and "planned steps unknown" in unknown.line()


def test_empty_or_cardless_ledger_is_bad_input():
    with pytest.raises(BadInput, match="no step times"):
        cost_ledger("r", [], A3_CARDS)
    with pytest.raises(BadInput, match="0 cards"):
        cost_ledger("r", [1.0], 0)
    with pytest.raises(BadInput, match="cost.ledger property"):
        from_json({"run": "r"})


def test_nightly_prints_and_summarises_the_ledger(tmp_path, capsys):
    from harness.report.schema import SCHEMA, SCHEMA_VERSION, RunReport, TestVerdict, machine_info, write_report

    ledger = cost_ledger("full-a3-night", [SEED002_STEP_S] * 5, A3_CARDS, planned_steps=100, aborted_at=5)
    test = TestVerdict("suites/perf/test_throughput_target.py::test_tps_per_card_no_regression_vs_baseline[full]",
                       "passed", 1.0, "", (), {"cost.ledger": ledger.to_json()})
    report = RunReport(schema=SCHEMA, schema_version=SCHEMA_VERSION, created="2026-12-02T00:00:00Z", name="nightly",
                       commit=None, dirty=None, scale="full-a3", plan=None, command=(), machine=machine_info(),
                       tests=(test,), duration_s=1.0, exit_status=0)
    path = write_report(report, tmp_path / "report.json")
    summary = tmp_path / "summary.md"
    assert main(["--summary", str(summary), str(path)]) == 0
    (cost,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("COST")]
    assert cost.startswith("COST full-a3 full-a3-night: 152.8 card-hours used (5 steps x 860 s x 128 cards); "
                           "saved 2,903.8 by the abort at step 5 of 100; a false alarm would have wasted 152.8")
    assert "saved 2,903.8" in summary.read_text()
