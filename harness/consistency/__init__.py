"""Train-inference consistency for MoE RL: routing agreement and router replay (`routing`), batch invariance of
the rollout engine (`invariance`). Checkers over what the engines return; the rollout-correction metrics of a run
are judged in harness.metrics.rollout_corr."""
