"""Distributed bring-up: which job each scale runs (`jobs`; the tiny scale's inputs: `tiny_verl`), the Ray Jobs
launcher that runs any of them (`ray_job`), bare-metal K8s manifests (`k8s`) and the loopback-only local Ray cluster
that proves the launcher in CI (`local`). The harness drives verl's own engine on an existing Ray cluster; it never
schedules work itself. The `launch` command is harness.cli.launch_cmd."""
