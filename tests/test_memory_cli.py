"""`ascend-rl-harness memory`: exit 0 when every phase fits, 1 when one does not (the verdict names it),
2 on bad input; `--json` gives each phase a boolean `fits`."""
from __future__ import annotations

import json

from harness.cli import main


def test_fitting_scale_exits_0(capsys):
    assert main(["memory", "--scale", "full-a2-gbs128"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_logits_oom_exits_1_and_json_marks_the_phase(capsys):
    # seed 001's 2k -> 12k plan with 12 sequences per micro batch: the vocab-parallel logits of the update alone
    # ([12, 14336, 129280 / TP8] fp32, 3.5 copies) pass the 64 GB card
    assert main(["memory", "--scale", "full-a2-gbs32", "--micro-batch", "12", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    fits = {p["phase"]: p["fits"] for p in doc["phases"]}
    assert fits == {"rollout": True, "prefill": True, "old_log_prob": True, "ref_log_prob": True, "update": False}
    assert main(["memory", "--scale", "full-a2-gbs32", "--json"]) == 0  # the scale's own micro batch 2 fits
    assert doc["passed"] is False and doc["state"] == "DOES NOT FIT"


def test_no_chunked_prefill_flags_the_prefill(capsys):
    assert main(["memory", "--scale", "full-a2-gbs128", "--phase", "prefill", "--no-chunked-prefill"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "vanilla MLA prefill" in out
    assert main(["memory", "--scale", "full-a2-gbs128", "--phase", "prefill", "--chunked-prefill"]) == 0


def test_bad_input_exits_2(capsys):
    assert main(["memory", "--scale", "no-such-scale"]) == 2
    assert "--scale" in capsys.readouterr().err
    assert main(["memory", "--scale", "full-a3", "--gbs", "0"]) == 2
    assert "--gbs" in capsys.readouterr().err
