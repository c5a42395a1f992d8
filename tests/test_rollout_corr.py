"""Self-tests of the rollout-correction verdicts (harness.metrics.rollout_corr), on verl 0.9.1's own rollout-correction
code: the exact TIS / IcePop arithmetic on known log-ratios, and the checker on metrics verl computes from a clean
and from a mismatched rollout. The real-trainer proof (the tiny verl run passes, `--fault stale-absorbed` fails)
is in tests/test_tiny_verl.py."""
from __future__ import annotations

import math

import pytest
import torch

from harness.metrics.keys import ROLLOUT_CORR_K3_KL, ROLLOUT_CORR_KL, ROLLOUT_PROBS_DIFF
from harness.metrics.rollout_corr import check_rollout_correction
from harness.metrics.run import Run, RunMeta, Series


def _batch(log_ratio: torch.Tensor, rollout_log_probs: torch.Tensor | None = None):
    """A DataProto as verl's trainer hands it to the correction: training (old) and rollout log-probs, mask."""
    from verl import DataProto

    rollout = rollout_log_probs if rollout_log_probs is not None else torch.full_like(log_ratio, -1.0)
    return DataProto.from_dict(tensors={"old_log_probs": rollout + log_ratio, "rollout_log_probs": rollout,
                                        "response_mask": torch.ones_like(log_ratio, dtype=torch.int64)})


def _correct(log_ratio, **config):
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    return compute_rollout_correction_and_add_to_batch(_batch(log_ratio), RolloutCorrectionConfig(**config))


KNOWN = torch.tensor([[math.log(3.0), math.log(0.25), 0.0]])  # training / rollout probability ratios 3, 1/4, 1


def test_tis_clamps_known_ratios():
    """TIS (one threshold, 2): weights min(rho, 2) = [2, 0.25, 1]; one token of three clamped high, one below 1/2."""
    batch, metrics = _correct(KNOWN, rollout_is="token", rollout_is_threshold=2.0)
    torch.testing.assert_close(batch.batch["rollout_is_weights"], torch.tensor([[2.0, 0.25, 1.0]]))
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((2 + 0.25 + 1) / 3)


def test_icepop_masks_known_ratios():
    """IcePop ("0.5_2.0"): weights outside [0.5, 2] are zeroed: the first two tokens; the third keeps 1."""
    batch, metrics = _correct(KNOWN, rollout_is="token", rollout_is_threshold="0.5_2.0")
    torch.testing.assert_close(batch.batch["rollout_is_weights"], torch.tensor([[0.0, 0.0, 1.0]]))
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 3)


def test_rejection_masks_known_ratios():
    """Token-level rejection (token_k1, ratio bounds 0.5..2): the response mask drops the first two tokens."""
    batch, metrics = _correct(KNOWN, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    assert batch.batch["response_mask"].tolist() == [[0, 0, 1]]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 3)


def _run(steps: list[dict[str, float]], **extra) -> Run:
    keys = set().union(*steps)
    series = {k: Series(tuple(range(1, len(steps) + 1)), tuple(s[k] for s in steps)) for k in keys}
    return Run("synthetic", series, RunMeta(extra={"precision": "fp32", **extra}))


def _verl_metrics(noise: float, seed: int) -> dict[str, float]:
    """verl's own metrics (plus probs_diff the way verl's debug metrics compute it) for a batch of 8 x 16 tokens
    whose training log-probs differ from the rollout's by Gaussian noise of `noise`, TIS on."""
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(8, 16, generator=g) * 5
    ratio = noise * torch.randn(8, 16, generator=g)
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    _, metrics = compute_rollout_correction_and_add_to_batch(
        _batch(ratio, rollout), RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0))
    diff = ((rollout + ratio).exp() - rollout.exp()).abs()
    metrics.update({ROLLOUT_PROBS_DIFF: float(diff.mean()), "training/rollout_probs_diff_max": float(diff.max()),
                    "training/rollout_probs_diff_std": float(diff.std())})
    return metrics


TIS_ON = {"config": {"algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0}}}}


def test_clean_rollout_passes_with_tis_on():
    """fp32 noise (1e-7 per token, as the clean tiny verl run): every band holds, TIS weights ~1, none clamped."""
    result = check_rollout_correction(_run([_verl_metrics(1e-7, s) for s in range(5)], **TIS_ON))
    assert result.ok, result.message()
    judged = {v.metric for v in result.verdicts}
    assert {ROLLOUT_CORR_KL, ROLLOUT_CORR_K3_KL, "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_ratio_fraction_high"} <= judged


def test_mismatched_rollout_fails():
    """A rollout computing with other weights (log-ratios of ~0.5): out of band, TIS clamping tokens."""
    result = check_rollout_correction(_run([_verl_metrics(0.5, s) for s in range(5)], **TIS_ON))
    failed = {v.metric for v in result.failures}
    assert {ROLLOUT_CORR_K3_KL, "rollout_corr/chi2_token", "rollout_corr/rollout_is_ratio_fraction_high"} <= failed
    assert "rollout_corr/k3_kl" in result.message()


def test_tis_turned_on_but_not_logged_fails():
    """The config turns TIS on, the run logs no rollout_is_* key (the correction did not run): a failure."""
    steps = [{k: v for k, v in _verl_metrics(1e-7, s).items() if "rollout_is" not in k} for s in range(3)]
    result = check_rollout_correction(_run(steps, **TIS_ON))
    assert not result.ok and "rollout_corr/rollout_is_mean" in result.missing
    assert result.findings()[0].check == "rollout_corr.missing"
    assert check_rollout_correction(_run(steps)).ok  # TIS off: the IS keys are not expected


def test_one_spike_fails_fp32_but_not_bf16():
    """fp32 allows no step out of band; bf16 allows 5 % spikes (one in 20 steps), not two."""
    steps = [_verl_metrics(1e-7, s) for s in range(20)]
    steps[7] = {**steps[7], ROLLOUT_CORR_KL: 5e-4}
    assert not check_rollout_correction(_run(steps)).ok
    bf16 = [{**s, ROLLOUT_CORR_KL: 2e-3} for s in steps]
    bf16[3] = {**bf16[3], ROLLOUT_CORR_KL: 0.5}
    assert check_rollout_correction(_run(bf16), precision="bf16").ok
    bf16[4] = {**bf16[4], ROLLOUT_CORR_KL: 0.5}
    assert not check_rollout_correction(_run(bf16), precision="bf16").ok


def test_a_job_that_truncates_sampling_is_not_judged_on_the_bands():
    """A rollout sampling with top_p < 1 or top_k > 0 logs the truncated distribution's logprobs against the actor's
    full softmax: seed 002's recipe (top_p 0.9, top_k 50) sat 0.02-0.08 off on every clean run, and a CPU night on it
    failed this verdict each time. Nothing is judged then, saying why (the suite skips on it); the defaults (top_p
    1, top_k -1: verl 0.9.1's rollout.yaml) are judged, and a mismatched rollout still fails."""
    mismatched = [_verl_metrics(0.5, s) for s in range(5)]

    def sampling(**rollout):
        return check_rollout_correction(_run(mismatched, config={"actor_rollout_ref": {"rollout": rollout}}))

    truncated = sampling(top_p=0.9, top_k=50, temperature=1.0)
    assert not truncated.ok and not truncated.failures and not truncated.verdicts
    assert truncated.not_judged.startswith("a rollout that samples the full softmax; this run samples with top_p "
                                           "0.9, top_k 50") and "not judged" in truncated.message()
    assert sampling(top_k=20).not_judged and sampling(top_p=0.95).not_judged
    full = sampling(top_p=1.0, top_k=-1)
    assert not full.not_judged and ROLLOUT_CORR_K3_KL in {v.metric for v in full.failures}
    assert not sampling(top_p=1, top_k=0).not_judged  # vLLM: top_k 0 or -1 is off
