"""verl's metric keys and the files of a run directory, named once.

Metric keys are what verl 0.9.1 logs (verl/trainer/ppo/metric_utils.py `compute_data_metrics`,
`compute_timing_metrics`, `compute_throughout_metrics`; verl/utils/debug/metrics.py `calculate_debug_metrics`);
file names are what the harness, verl's FileLogger ($VERL_FILE_LOGGER_PATH) and the launcher write.
"""
from __future__ import annotations

# ---------------------------------------------------------------- metric keys (verl)
REWARD = "critic/rewards/mean"
RESPONSE_LENGTH = "response_length/mean"
PROMPT_LENGTH = "prompt_length/mean"
PG_LOSS = "actor/pg_loss"
GRAD_NORM = "actor/grad_norm"
# verl's policy-loss diagnostics (verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla's pg_metrics; the
# actor's entropy from dp_actor.update_policy): what verl's nightly and NeMo-RL's test suites read besides the reward
ENTROPY = "actor/entropy"
PG_CLIPFRAC = "actor/pg_clipfrac"
PG_CLIPFRAC_LOWER = "actor/pg_clipfrac_lower"
RESPONSE_CLIP_RATIO = "response_length/clip_ratio"  # share of responses cut at max_response_length
# mean |p_rollout - p_actor| of the sampled tokens, in probability space: verl exponentiates both log-probs before
# taking the difference (verl/utils/debug/metrics.py calculate_debug_metrics); _max / _std likewise
ROLLOUT_PROBS_DIFF = "training/rollout_probs_diff_mean"
ROLLOUT_PROBS_DIFF_MAX = "training/rollout_probs_diff_max"
ROLLOUT_PROBS_DIFF_STD = "training/rollout_probs_diff_std"
# verl's rollout-correction diagnostics, logged every step (verl/trainer/ppo/rollout_corr_helper.py
# compute_offpolicy_metrics): log-ratios are training (old_log_prob) minus rollout log-probs of the sampled tokens
ROLLOUT_CORR = "rollout_corr/"
ROLLOUT_CORR_KL = ROLLOUT_CORR + "kl"  # mean(log p_rollout - log p_training): signed, ~0 when they agree
ROLLOUT_CORR_K3_KL = ROLLOUT_CORR + "k3_kl"  # mean(exp(r) - 1 - r): non-negative, cannot cancel across tokens
ROLLOUT_CORR_CHI2_TOKEN = ROLLOUT_CORR + "chi2_token"  # E[rho^2] - 1 of the token ratios
ROLLOUT_CORR_LOG_PPL_ABS_DIFF = ROLLOUT_CORR + "log_ppl_abs_diff"  # mean |log ppl_training - log ppl_rollout|
# Present only when algorithm.rollout_correction.rollout_is (TIS / IcePop weights) or rollout_rs (rejection) is set
ROLLOUT_IS_PREFIX = ROLLOUT_CORR + "rollout_is_"
ROLLOUT_RS_PREFIX = ROLLOUT_CORR + "rollout_rs_"
THROUGHPUT = "perf/throughput"  # tokens / (step s x torch devices): per die on A3
TOTAL_TOKENS = "perf/total_num_tokens"  # prompt + response tokens of the trained batch
TIMING_PREFIX = "timing_s/"
STEP_TIME = TIMING_PREFIX + "step"
# The RL step's phases as verl's ray_trainer times them (marked_timer names); others follow by name.
PHASE_ORDER = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
# Top-level sections of verl's metric keys: a slash path under one of these is a verl metric.
VERL_SECTIONS = ("actor", "critic", "perf", "timing_s", "timing_per_token_ms", "response_length", "prompt_length",
                 "training", "val-core", "val-aux", "global_seqlen", "rollout_corr", "response", "mfu")

# ---------------------------------------------------------------- files of a run directory
METRICS_FILE = "metrics.jsonl"  # verl FileLogger ($VERL_FILE_LOGGER_PATH)
META_FILE = "meta.json"  # run metadata (scale, hardware, devices, versions): the lab and the launcher write it
LAUNCH_FILE = "launch.json"  # the launcher's verdict of the job
HYDRA_DIR = "hydra"  # verl's Hydra run directory in a run directory: HYDRA_DIR/.hydra/config.yaml, its resolved config
HYDRA_CONFIG = f"{HYDRA_DIR}/.hydra/config.yaml"
JOB_LOG_FILE = "job.log"  # the job's driver log, kept whatever the verdict
