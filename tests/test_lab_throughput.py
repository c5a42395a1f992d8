"""Self-tests: a tiny DAPO lab run is measurable by `ascend-rl-harness throughput`, because the lab logs verl's
own perf/timing metrics (compute_throughout_metrics / compute_timing_metrics over marked_timer phases).

The seeded bug is the lab's former formula, perf/throughput = generated tokens / step time (verl counts
prompt + response tokens of the trained batch and divides by step time x devices): the checker refused such
runs ("implies 0.35 devices"), and must keep refusing a lab that logs it.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from harness.cli import main

BUGGY_STEPS = 3


def test_cli_measures_a_lab_run_as_verl_does(tiny_lab_run, capsys):
    run_dir = Path(tiny_lab_run.meta.sources[0]).parent
    assert main(["throughput", str(run_dir), "--hardware", "cpu", "--devices", "1", "--json", "--per-step"]) == 0
    doc = json.loads(capsys.readouterr().out)
    logged = tiny_lab_run["perf/throughput"].as_dict()
    tokens = tiny_lab_run["perf/total_num_tokens"].as_dict()
    assert (doc["hardware"], doc["devices"], doc["cards"], doc["dies_per_card"]) == ("cpu", 1, 1, 1)
    assert doc["tps_per_device"] == pytest.approx(statistics.median(logged[s] for s in doc["window"]), rel=1e-9)
    assert doc["tps_per_card"] == doc["tps_per_device"]
    for step in doc["per_step"]:
        assert step["tokens"] == tokens[step["step"]]
        assert step["tps_per_device"] == pytest.approx(logged[step["step"]], rel=1e-9)
    # DAPO trains on GBS x n sequences (the kept groups): prompt + response tokens, never just the responses
    lab = tiny_lab_run.meta.extra["lab"]  # LabConfig as meta.json records it
    sequences = lab["gbs"] * lab["n"]
    prompt = tiny_lab_run["prompt_length/mean"].as_dict()  # every lab prompt is "ab=": 3 tokens
    full = [s for s, k in tiny_lab_run["train/kept_groups"].as_dict().items() if k == lab["gbs"]]
    assert full, "no step kept a full batch of groups"
    assert all(tokens[s] > sequences * prompt[s] for s in full)  # responses add at least one token each
    assert [p["name"] for p in doc["phases"]][:2] == ["gen", "reward"] and doc["phases"][0]["seconds"] > 0


def test_cli_refuses_a_lab_logging_generated_tokens_per_step(tmp_path, monkeypatch, capsys):
    """Seeded bug: the lab's old perf/throughput (generated tokens / step s), put in place of verl's function."""
    import torch
    from verl.trainer.ppo import metric_utils

    from harness.lab import LabConfig, run_lab

    def generated_tokens_per_step(batch, timing_raw, n_gpus):
        generated = int(torch.sum(batch.batch["response_mask"]))
        return {"perf/total_num_tokens": sum(batch.meta_info["global_token_num"]),
                "perf/throughput": generated / timing_raw["step"]}

    monkeypatch.setattr(metric_utils, "compute_throughout_metrics", generated_tokens_per_step)
    out = run_lab(LabConfig(steps=BUGGY_STEPS, seed=7), tmp_path / "buggy")
    assert main(["throughput", str(out), "--hardware", "cpu", "--devices", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # refused either as "not tokens / (step time x devices)" or as a device count disagreeing with --devices 1
    assert len(err) == 1 and "perf/throughput" in err[0], err
