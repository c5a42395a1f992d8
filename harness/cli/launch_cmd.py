"""`ascend-rl-harness launch`: submit a scale's DAPO job -- or your own recipe on a scale -- to a Ray cluster and watch
it, print a K8s job manifest for bare-metal clusters, prove the launcher on a loopback-only local Ray cluster, or
inspect a submitted job by id (`--status / --logs / --stop JOB_ID`).

The cluster is `--ray-address`, else $RAY_ADDRESS (Ray's own convention), as its dashboard http://HEAD:8265.
Exit 0 the job succeeded and logged every step (or was submitted with --no-wait), 1 it failed / timed out / lost a
node / was aborted, 2 bad input.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path

from harness.cli.output import emit, verdict
from harness.config.cpu_tier import PATCHED_FAULTS
from harness.errors import BadInput


def _cluster_address(args: argparse.Namespace) -> str | None:
    """--ray-address, else $RAY_ADDRESS (what `ray job submit` reads), validated as a dashboard address naming the
    one it came from."""
    from harness.launch.address import dashboard_url

    if args.ray_address:
        return dashboard_url(args.ray_address, "--ray-address")
    if os.environ.get("RAY_ADDRESS"):
        return dashboard_url(os.environ["RAY_ADDRESS"], "RAY_ADDRESS")
    return None


def cmd_inspect(args: argparse.Namespace) -> int:
    """--status / --logs / --stop JOB_ID of a submitted job (Ray's JobSubmissionClient)."""
    from harness.launch.ray_job import job_logs, job_status, stop_job

    address = _cluster_address(args)
    if address is None:
        raise BadInput("--status/--logs/--stop need the cluster: --ray-address http://HEAD:8265 (or RAY_ADDRESS)")
    if args.logs:
        sys.stdout.write(job_logs(address, args.logs))
        return 0
    if args.stop:
        status = stop_job(address, args.stop)
        print(f"job {args.stop}: {status}")
        return 0
    doc = job_status(address, args.status)
    if args.json:  # `passed`: the job has not failed or been stopped (a running job passes so far)
        return emit(verdict(doc["status"] not in ("FAILED", "STOPPED"), doc["status"], doc))
    else:
        steps = f", {doc['steps_done']} step(s) logged in {doc['run_dir']}" if doc["steps_done"] is not None else ""
        launcher = f", launcher verdict {doc['verdict']}" if doc["verdict"] else ""
        message = f": {doc['message'].strip().splitlines()[-1][:200]}" if doc["message"].strip() else ""
        print(f"job {doc['job_id']} on {doc['address']}: {doc['status']}{steps}{launcher}{message}")
    return 1 if doc["status"] in ("FAILED", "STOPPED") else 0


def cmd_launch(args: argparse.Namespace) -> int:
    if args.status or args.logs or args.stop:
        return cmd_inspect(args)
    if not args.scale:
        raise BadInput("--scale is required (see `ascend-rl-harness scales`), or --status/--logs/--stop JOB_ID")
    from harness.cli.args import job_from_args, scale_arg
    from harness.launch.jobs import check_steps

    scale = scale_arg(args.scale)
    check_steps(args.steps)
    job = job_from_args(args, scale)  # the job `plan` prints for the same arguments
    forced = _refuse_invalid(job, args.force)
    _note_steps(job, args.steps)
    if job.user is not None and job.user.files_read:  # a wrapper's target is part of the job: never booked unnamed
        from harness.cli.output import console as output_console
        from harness.redact import one_line

        output_console(stderr=True).print("read: " + one_line(", ".join(job.user.files_read), 2000), markup=False,
                                          soft_wrap=True)
        for change in job.reduction:  # the reduced tier's changes to the recipe, as `run` and the tier print them
            output_console(stderr=True).print(one_line(change.line(), 2000), markup=False, soft_wrap=True)
    if args.k8s:  # the manifest's own checks (names, node count) cost nothing: before composing in verl's schema
        from harness.launch.k8s import manifest, manifest_yaml

        options = {"image": args.image, "namespace": args.namespace, "steps": args.steps, "pvc": args.pvc, "job": job,
                   "model_path": args.model_path, "data_dir": args.data_dir, "forced": forced}
        documents = manifest(scale, **options)
    # Validate before booking, in every mode (Ray, --k8s, --local): a misspelled or unknown key or a <placeholder>
    # got a 64-node manifest, exit 0 (issue 30). A tiny rehearsal submits the tiny scale's job with the user's
    # algorithm: that job is validated, and so are the keys it drops (a typo there was dropped and the run went on).
    from harness.cli.output import console as output_console
    from harness.config.recipe import check_recipe, check_rehearsal_keys, installed_verl
    from harness.errors import PlanError

    if job.plan_error and scale.tier != "tiny":
        raise PlanError(f"{job.user.source if job.user else scale.name}: {job.plan_error}")
    if scale.tier != "tiny" or job.user is not None:
        with output_console(stderr=True).status(f"validating the job in verl {installed_verl()}'s config"):
            check_recipe(job.recipe)
            if job.user is not None and scale.tier == "tiny":
                from harness.config.job import FORK_KEYS
                from harness.config.user_recipe import override_key

                dropped = [override_key(o) for o in job.user.overrides if not o.startswith(("+", "~"))
                           and o not in job.read]
                check_rehearsal_keys(job.user.source, dropped, FORK_KEYS)
    if args.k8s:
        if args.json:  # the documents as a JSON list (`kubectl apply -f` takes YAML: print it without --json)
            return emit(verdict(True, "MANIFEST", {"scale": scale.name, "manifest": documents}))
        print(manifest_yaml(scale, **options), end="")
        return 0
    address = None if args.local else _cluster_address(args)
    if args.local and args.ray_address:
        raise BadInput("--local starts its own cluster; drop --ray-address (or --local)")
    if not args.local and not address:
        raise BadInput("--ray-address is required (the dashboard of an existing cluster, http://HEAD:8265; or set "
                       "RAY_ADDRESS), or --local for a throwaway loopback-only cluster, or --k8s for a manifest")
    if scale.tier == "tiny":
        # every CPU-tier launch is bounded: verl's main_ppo hangs instead of exiting when a weight sync fails
        from harness.launch.tiny_verl import STALL_S, TIMEOUT_S

        args.timeout = TIMEOUT_S if args.timeout is None else args.timeout
        args.stall_timeout = STALL_S if args.stall_timeout is None else args.stall_timeout
    args.timeout = 3600.0 if args.timeout is None else args.timeout
    name = f"{scale.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if address:
        # a cluster job writes its logs on a cluster node: only storage both mount lets this host read them
        from harness.launch.jobs import RUN_ROOT_ENV, shared_run_root

        if args.run_dir and not os.path.isabs(args.run_dir):
            raise BadInput(f"--run-dir {args.run_dir}: with a cluster address give an absolute directory on storage "
                           f"every node and this host mount (or set ${RUN_ROOT_ENV} and drop --run-dir)")
        run_dir = Path(args.run_dir) if args.run_dir else shared_run_root() / name
    else:
        run_dir = Path(args.run_dir or f"runs/{name}").resolve()
    _refuse_a_held_run(run_dir, args.resume)
    from harness.launch import local

    if args.local and not local.isolated():
        from harness.launch.tiny_verl import one_at_a_time

        # re-execute this very command as PID 1 of a loopback-only network namespace
        with one_at_a_time() if scale.tier == "tiny" else contextlib.nullcontext():
            return local.run_isolated(_isolated_argv(args, scale.name, run_dir),
                                      timeout_s=args.timeout + 120).returncode
    from harness.cli.output import console as output_console
    from harness.launch.jobs import job_for_scale
    from harness.launch.ray_job import launch, stop_rules_for

    console = output_console(stderr=True)
    spec = job_for_scale(scale, run_dir, steps=args.steps, resume=args.resume, seed=args.seed, fault=args.fault,
                         user=job.user, model_path=args.model_path, data_dir=args.data_dir)
    # launch.json records what --force overrode, every file the job was read from and what the reduced tier changed
    spec = dataclasses.replace(spec, forced=forced, files_read=tuple(job.user.files_read) if job.user else (),
                               reduction=tuple(c.to_json() for c in job.reduction))
    rules = stop_rules_for(job) if args.abort_on_fail else ()
    kw = {"timeout_s": args.timeout, "stall_s": args.stall_timeout, "console": console, "stop_rules": rules,
          "wait": not args.no_wait}
    if args.local:
        # tiny: its inputs are written while the cluster starts (the job's own prepare step then finds them done)
        preparing = _prepare_tiny(run_dir, args) if scale.tier == "tiny" else None
        with local.local_cluster() as url:
            console.print(f"local Ray cluster at {url}, network interfaces {local.interfaces()}")
            if preparing is not None:
                preparing.wait()  # a failure there is the job's own prepare step's to report
            result = launch(url, spec, **kw)
    else:
        result = launch(address, spec, **kw)
    if args.json:  # the progress went to stderr: stdout carries only the JSON
        return emit(verdict(result.ok or result.verdict == "submitted", result.verdict.upper(),
                            dataclasses.asdict(result)))
    if result.verdict == "submitted":
        print(result.job_id)
        return 0
    style = "green" if result.ok else "red"
    from rich.markup import escape

    console.print(f"[bold {style}]{escape(result.line())}[/]")  # the job's message is text, not rich markup
    return 0 if result.ok else 1


def _refuse_invalid(job, force: bool) -> str | None:
    """Book only what `plan` calls valid, in every mode (issue 44: `launch --k8s` printed a manifest, exit 0, for a
    plan `plan` called INVALID on memory): one line and exit 2, unless --force, whose overridden reason is returned
    for launch.json / the manifest. A tiny rehearsal runs on CPU, where the memory model has no verdict to give."""
    from harness.errors import PlanError
    from harness.memory.job_options import judge

    if job.scale.tier == "tiny":
        return None
    reason = judge(job).invalid(job)
    if reason is None:
        return None
    where = job.user.source if job.user else job.scale.name
    if not force or job.plan_error:  # a broken plan rule is megatron-core's refusal: no --force books it
        raise PlanError(f"{where}: PLAN INVALID: {reason} (`plan` with the same arguments shows it; --force books it "
                        "anyway)")
    from harness.cli.output import console as output_console

    output_console(stderr=True).print(f"warning: --force: booking {where}, which `plan` calls INVALID: {reason}",
                                      markup=False, soft_wrap=True)
    return reason


def _note_steps(job, steps: int | None) -> None:
    """--steps wins over the recipe's own trainer.total_training_steps only when given, and says so."""
    own = job.recipe.override_map().get("trainer.total_training_steps")
    if steps is not None and own is not None and own.strip() != str(steps):
        from harness.cli.output import console as output_console

        output_console(stderr=True).print(f"note: --steps {steps} replaces the recipe's "
                                          f"trainer.total_training_steps={own}", markup=False, soft_wrap=True)


def _refuse_a_held_run(run_dir: Path, resume: bool) -> None:
    """Before anything is prepared or started: a run directory that holds a run is refused unless --resume. The
    refusal came from the launcher, after the tiny job's inputs (meta.json among them) had been rewritten."""
    from harness.metrics.keys import LAUNCH_FILE, META_FILE, METRICS_FILE

    if run_dir.exists() and not run_dir.is_dir():
        raise BadInput(f"--run-dir {run_dir}: exists and is not a directory; pass a new run directory")
    held = [name for name in (METRICS_FILE, META_FILE, LAUNCH_FILE) if (run_dir / name).exists()]
    if held and not resume:
        raise BadInput(f"--run-dir {run_dir}: already holds a run ({', '.join(held)}); pass a new --run-dir or "
                       "--resume")


def _isolated_argv(args: argparse.Namespace, scale: str, run_dir: Path) -> list[str]:
    """This launch again, for the loopback-only namespace: every option that shapes the job, paths absolute."""
    argv = [sys.executable, "-m", "harness.cli", "launch", "--scale", scale, "--local",
            "--run-dir", str(run_dir), "--timeout", str(args.timeout), "--seed", str(args.seed)]
    argv += ["--stall-timeout", str(args.stall_timeout)] if args.stall_timeout is not None else []
    argv += ["--steps", str(args.steps)] if args.steps is not None else []
    argv += ["--resume"] if args.resume else []
    argv += ["--fault", args.fault] if args.fault else []
    argv += ["--abort-on-fail"] if args.abort_on_fail else []
    argv += ["--force"] if args.force else []
    argv += ["--recipe", str(Path(args.recipe).resolve())] if args.recipe else []
    argv += [f"--recipe-env={item}" for item in args.recipe_env]
    argv += ["--model-path", args.model_path] if args.model_path else []
    argv += ["--data-dir", args.data_dir] if args.data_dir else []
    argv += ["--json"] if args.json else []  # the namespace's launch prints the verdict JSON
    return argv + (["--", *args.overrides] if args.overrides else [])


def _prepare_tiny(run_dir: Path, args: argparse.Namespace):
    import subprocess

    from harness.launch.tiny_verl import DEFAULT_STEPS, prepare_argv

    argv = prepare_argv(run_dir, seed=args.seed, steps=args.steps or DEFAULT_STEPS, fault=args.fault,
                        python=sys.executable)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli.args import SEED, add_job_arguments, positive_float, whole
    from harness.launch.k8s import AUTH_SECRET, DEFAULT_IMAGE, SHARED_CLAIM, SHARED_MOUNT

    p = sub.add_parser("launch", help="submit a scale's DAPO job (or your recipe) to Ray, print a K8s manifest, "
                                      "or inspect a submitted job")
    p.add_argument("--scale", help="scale name (see `scales`); required unless --status/--logs/--stop")
    p.add_argument("--ray-address", help="Ray dashboard / job server of an existing cluster (http://HEAD:8265; "
                                         "default $RAY_ADDRESS)")
    p.add_argument("--local", action="store_true",
                   help="start a throwaway Ray cluster in a loopback-only network namespace (needs root)")
    p.add_argument("--run-dir", help="where the job writes metrics, rollouts, profiles, logs (shared storage)")
    p.add_argument("--steps", type=whole(1), help="training steps (default: 15 for tiny, 20 otherwise)")
    p.add_argument("--timeout", type=positive_float, help="seconds before the job is stopped (verdict timeout; "
                                                 "default 3600)")
    p.add_argument("--stall-timeout", type=positive_float,
                   help="seconds without a new logged step (the first counted from submission) before the job is "
                        "stopped (verdict timeout; default none, tiny 600: a hung weight sync never exits)")
    p.add_argument("--seed", type=SEED, default=0, help="tiny: seed of the model, data and rollout")
    p.add_argument("--fault", help="tiny: seed a rollout fault (the vLLM worker extension: stale-absorbed, "
                                   "frozen-rollout), an algorithmic regression as overrides (harness.config.cpu_tier "
                                   "TRAINER_FAULTS, e.g. no-optimizer-step) or patched into verl's code "
                                   f"(PATCHED_FAULTS: {', '.join(PATCHED_FAULTS)})")
    p.add_argument("--resume", action="store_true", help="resume the run in --run-dir from its checkpoints")
    p.add_argument("--force", action="store_true",
                   help="book a job `plan` calls INVALID because its memory does not fit (a broken plan rule is "
                        "megatron-core's refusal and stays refused); the overridden reason is recorded in "
                        "launch.json (the manifest's annotations with --k8s)")
    p.add_argument("--abort-on-fail", action="store_true",
                   help="stop the job at the first verdict it can no longer pass (non-finite loss/grad, rollout "
                        "mismatch far beyond band, throughput far below target; harness/metrics/early_stop.py) and "
                        "record why; its outputs are kept")
    p.add_argument("--no-wait", action="store_true", help="print the job id once submitted and exit 0 (inspect it "
                                                          "with --status/--logs/--stop)")
    inspect = p.add_mutually_exclusive_group()
    inspect.add_argument("--status", metavar="JOB_ID", help="status of a submitted job (exit 1 failed or stopped)")
    inspect.add_argument("--logs", metavar="JOB_ID", help="print a submitted job's driver log")
    inspect.add_argument("--stop", metavar="JOB_ID", help="stop a submitted job")
    p.add_argument("--k8s", action="store_true", help="print a Kubernetes job manifest (head + workers) and exit")
    p.add_argument("--json", action="store_true",
                   help="print JSON: `passed` and `state` (the job's verdict: SUCCEEDED, FAILED, TIMEOUT, NODE-LOST, "
                        "STOPPED, ABORTED, SUBMITTED with --no-wait; MANIFEST with --k8s; Ray's status with "
                        "--status), then the launch result, the manifest documents or the status")
    p.add_argument("--image", default=DEFAULT_IMAGE,
                   help="container image for --k8s (an image reference: registry/name:tag, pulled Always, or "
                        "name@sha256:..., pulled IfNotPresent; default %(default)s, built by docker/npu.Dockerfile)")
    p.add_argument("--namespace", default="default",
                   help=f"Kubernetes namespace for --k8s (default %(default)s); it must hold the --pvc claim and the "
                        f"Secret {AUTH_SECRET} (key `token`: Ray's cluster token)")
    p.add_argument("--pvc", default=SHARED_CLAIM,
                   help=f"PersistentVolumeClaim for --k8s, mounted at {SHARED_MOUNT} in every pod: models/, data/, "
                        "runs/ (default %(default)s)")
    add_job_arguments(p)
    p.set_defaults(func=cmd_launch)
