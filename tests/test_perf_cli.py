"""`plan` / `plan --recipe` carry the phase model's prediction (harness.perf): step time, TPS/card, seconds per phase,
the what-if sweep; a CPU scale says why it has none. Seconds (no verl import: --validate stays off)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.perf.model import PHASES

RECIPE = Path(__file__).parent / "recipes" / "seed002_a3_grpo.sh"


def _json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out)


def test_plan_json_carries_the_prediction(capsys):
    code, doc = _json(capsys, "plan", "--scale", "full-a3", "--json")
    assert code == 0 and doc["passed"] is True
    p = doc["prediction"]
    assert p["predicted"] is True and [ph["name"] for ph in p["phases"]] == list(PHASES)
    assert p["step_s"] == pytest.approx(sum(ph["seconds"] for ph in p["phases"]))
    # verl computes old_log_prob unless bypass mode; seed 002 skipped it (its 120 TPS/card assumes that)
    assert p["tps_per_card"] < p["with_seed002_patches"]["tps_per_card"]
    assert p["with_seed002_patches"]["tps_per_card"] == pytest.approx(120.0, rel=0.10)
    assert p["what_if"]["moves_tps_most"] in p["what_if"]["knobs"] and p["trust"]


def test_plan_recipe_json_predicts_the_recipe_plan(capsys):
    """A user's recipe: its plan breaks a megatron-core 0.12 rule (exit 1) and still gets a prediction and sweep."""
    code, doc = _json(capsys, "plan", "--scale", "full-a3", "--recipe", str(RECIPE), "--json")
    assert code == 1 and doc["passed"] is False
    p = doc["prediction"]
    assert p["predicted"] is True and p["tps_per_card"] > 0
    assert p["what_if"]["variants_validated"] is False
    assert all(v["tps_per_card"] for k in p["what_if"]["knobs"].values() for v in k["variants"])


def test_plan_cpu_scale_says_why_no_prediction(capsys):
    code, doc = _json(capsys, "plan", "--scale", "tiny", "--json")
    assert code == 0 and doc["prediction"] == {"predicted": False, "reason": doc["prediction"]["reason"]}
    assert "no phase model for hardware 'cpu'" in doc["prediction"]["reason"]


def test_plan_text_prints_the_prediction(capsys):
    assert main(["plan", "--scale", "full-a2-gbs128"]) == 0
    out = capsys.readouterr().out
    assert "predicted: step" in out and "TPS/card" in out and "update_actor" in out
    assert main(["plan", "--scale", "full-a2-gbs128", "--explain"]) == 0  # the sweep is behind --explain (issue 47)
    assert "what-if:" in capsys.readouterr().out


def test_bypass_mode_override_skips_old_log_prob(capsys):
    """verl 0.9.1 runs no old_log_prob forward under algorithm.rollout_correction.bypass_mode (ray_trainer.py fit):
    the prediction follows the command line, not a default."""
    _, stock = _json(capsys, "plan", "--scale", "full-a3", "--json")
    _, bypass = _json(capsys, "plan", "--scale", "full-a3", "--json", "--",
                      "algorithm.rollout_correction.bypass_mode=True")
    phase = {d: {p["name"]: p["seconds"] for p in doc["prediction"]["phases"]} for d, doc in
             (("stock", stock), ("bypass", bypass))}
    assert phase["stock"]["old_log_prob"] > 100 and phase["bypass"]["old_log_prob"] == 0.0
    assert bypass["prediction"]["tps_per_card"] == pytest.approx(bypass["prediction"]["with_seed002_patches"]
                                                                 ["tps_per_card"])
