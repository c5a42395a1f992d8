"""Distributed bring-up (issue 7): the Ray Jobs launcher (`ray_job`), bare-metal K8s manifests (`k8s`)
and rollout replay in verl's RolloutSkip layout (`replay`). The harness drives verl's own engine on an
existing Ray cluster; it never schedules work itself."""
