"""Distributed bring-up (issue 7): the Ray Jobs launcher (`ray_job`, CLI `launch` in `cli`), bare-metal
K8s manifests (`k8s`), the loopback-only local Ray cluster that proves the launcher in CI (`local`), the
nightly run's failure lines (`nightly`) and rollout replay in verl's RolloutSkip layout (`replay`). The harness drives verl's own engine on an
existing Ray cluster; it never schedules work itself."""
