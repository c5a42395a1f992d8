"""`ascend-rl-harness launch`: submit a scale's DAPO job to a Ray cluster and watch it, print a K8s job
manifest for bare-metal clusters, or prove the launcher on a loopback-only local Ray cluster.

Exit 0 the job succeeded and logged every step, 1 it failed / timed out / lost a node, 2 bad input.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from harness.errors import BadInput


def cmd_launch(args: argparse.Namespace) -> int:
    from harness.cli.args import scale_arg
    from harness.launch.ray_job import check_steps

    scale = scale_arg(args.scale)
    check_steps(args.steps)
    if args.k8s:
        from harness.launch.k8s import manifest_yaml

        print(manifest_yaml(scale, image=args.image, namespace=args.namespace, steps=args.steps, pvc=args.pvc), end="")
        return 0
    if args.local and args.ray_address:
        raise BadInput("--local starts its own cluster; drop --ray-address (or --local)")
    if not args.local and not args.ray_address:
        raise BadInput("--ray-address is required (the dashboard of an existing cluster, http://HEAD:8265), "
                       "or --local for a throwaway loopback-only cluster, or --k8s for a manifest")
    if args.timeout is None:
        # every CPU-tier launch is bounded: verl's main_ppo hangs instead of exiting when a weight sync fails
        from harness.launch.tiny_verl import TIMEOUT_S

        args.timeout = TIMEOUT_S if scale.tier == "tiny" else 3600.0
    run_dir = Path(args.run_dir or f"runs/{scale.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    from harness.launch import local

    if args.local and not local.isolated():
        # re-execute this very command as PID 1 of a loopback-only network namespace
        argv = [sys.executable, "-m", "harness.cli", "launch", "--scale", scale.name, "--local",
                "--run-dir", str(run_dir), "--timeout", str(args.timeout)]
        argv += ["--steps", str(args.steps)] if args.steps is not None else []
        argv += ["--resume"] if args.resume else []
        argv += ["--seed", str(args.seed)] + (["--fault", args.fault] if args.fault else [])
        from harness.launch.tiny_verl import one_at_a_time

        with one_at_a_time() if scale.tier == "tiny" else contextlib.nullcontext():
            return local.run_isolated(argv, timeout_s=args.timeout + 120).returncode
    from rich.console import Console

    from harness.launch.ray_job import job_for_scale, launch

    console = Console(stderr=True)
    spec = job_for_scale(scale, run_dir, steps=args.steps, resume=args.resume, seed=args.seed, fault=args.fault)
    if args.local:
        # tiny: its inputs are written while the cluster starts (the job's own prepare step then finds them done)
        preparing = _prepare_tiny(run_dir, args) if scale.tier == "tiny" else None
        with local.local_cluster() as url:
            console.print(f"local Ray cluster at {url}, network interfaces {local.interfaces()}")
            if preparing is not None:
                preparing.wait()  # a failure there is the job's own prepare step's to report
            result = launch(url, spec, timeout_s=args.timeout, console=console)
    else:
        result = launch(args.ray_address, spec, timeout_s=args.timeout, console=console)
    style = "green" if result.ok else "red"
    console.print(f"[bold {style}]{result.line()}[/]")
    return 0 if result.ok else 1


def _prepare_tiny(run_dir: Path, args: argparse.Namespace):
    import subprocess

    from harness.launch.tiny_verl import DEFAULT_STEPS, prepare_argv

    argv = prepare_argv(run_dir, seed=args.seed, steps=args.steps or DEFAULT_STEPS, fault=args.fault,
                        python=sys.executable)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli.args import SEED, positive_float, whole
    from harness.launch.k8s import AUTH_SECRET, DEFAULT_IMAGE, SHARED_CLAIM, SHARED_MOUNT

    p = sub.add_parser("launch", help="submit a scale's DAPO job to Ray (or print a K8s manifest)")
    p.add_argument("--scale", required=True, help="scale name (see `scales`)")
    p.add_argument("--ray-address", help="Ray dashboard / job server of an existing cluster (http://HEAD:8265)")
    p.add_argument("--local", action="store_true",
                   help="start a throwaway Ray cluster in a loopback-only network namespace (needs root)")
    p.add_argument("--run-dir", help="where the job writes metrics, rollouts, profiles, logs (shared storage)")
    p.add_argument("--steps", type=whole(1), help="training steps (default: 15 for tiny, 20 otherwise)")
    p.add_argument("--timeout", type=positive_float, help="seconds before the job is stopped (verdict timeout; "
                                                 "default 3600, tiny 600)")
    p.add_argument("--seed", type=SEED, default=0, help="tiny: seed of the model, data and rollout")
    p.add_argument("--fault", help="tiny: seed a rollout fault (the vLLM worker extension: stale-absorbed, "
                                   "frozen-rollout) or an algorithmic regression (harness.config.cpu_tier "
                                   "TRAINER_FAULTS, e.g. no-optimizer-step)")
    p.add_argument("--resume", action="store_true", help="resume the run in --run-dir from its checkpoints")
    p.add_argument("--k8s", action="store_true", help="print a Kubernetes job manifest (head + workers) and exit")
    p.add_argument("--image", default=DEFAULT_IMAGE,
                   help="container image for --k8s (an image reference: registry/name:tag, pulled Always, or "
                        "name@sha256:..., pulled IfNotPresent; default %(default)s, built by docker/npu.Dockerfile)")
    p.add_argument("--namespace", default="default",
                   help=f"Kubernetes namespace for --k8s (default %(default)s); it must hold the --pvc claim and the "
                        f"Secret {AUTH_SECRET} (key `token`: Ray's cluster token)")
    p.add_argument("--pvc", default=SHARED_CLAIM,
                   help=f"PersistentVolumeClaim for --k8s, mounted at {SHARED_MOUNT} in every pod: models/, data/, "
                        "runs/ (default %(default)s)")
    p.set_defaults(func=cmd_launch)
