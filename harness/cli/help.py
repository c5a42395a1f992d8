"""What `--help` says for each subcommand beyond its options: a description, an example and the exit codes.
One table, so every command states them the same way and a self-test can hold each registered
subcommand to it (tests/test_cli_help.py)."""
from __future__ import annotations

from dataclasses import dataclass

BAD_INPUT = "2  bad input: one line on stderr naming the file or option"
INTERRUPTED = "130  interrupted: SIGINT (143 SIGTERM); one line, the previous results kept, nothing half-written"
CLOSED_PIPE = "141  stdout was closed early (`| head`), as for any tool SIGPIPE stops; nothing else printed"


@dataclass(frozen=True)
class CommandHelp:
    description: str
    example: str
    exits: tuple[str, ...]  # "CODE  meaning", besides BAD_INPUT and CLOSED_PIPE

    def epilog(self) -> str:
        codes = "\n".join(f"  {line}" for line in (*self.exits, BAD_INPUT, INTERRUPTED, CLOSED_PIPE))
        return f"example:\n  {self.example}\n\nexit codes:\n{codes}"


HELP = {
    "run": CommandHelp(
        "The main job: run a scale's suites (pytest suites -m <tier> --scale <scale>) in this process and write "
        "the report (report.json, .html, .md, junit.xml) to --report-dir; pytest's own output goes to "
        "<report-dir>/pytest.log. Tests whose hardware or stack is absent skip with the reason. Runs from any "
        "directory inside a clone (the nearest one above holding suites/) or, outside every clone, the suites of "
        "the clone the harness is installed from. pytest's cache is kept in the report directory, so "
        "`run -- --lf` reruns what failed in its previous run (--ff, --sw likewise).",
        "ascend-rl-harness run --scale tiny --report-dir reports -- --lf",
        ("0  every test that ran passed (and, with --history, no regression across the stored reports)",
         "1  a test failed, or a regression shows")),
    "scales": CommandHelp(
        "List the registered scales (harness/config/scales.py), one row each: the name --scale takes, its tier "
        "(the pytest marker that selects it: tiny, layer, reduced, moonlight, full), model, hardware profile, "
        "devices and cards, training TPxPPxEP and rollout TPxDPxEP plans, GBS x n and prompt/response lengths.",
        "ascend-rl-harness scales",
        ("0  listed",)),
    "plan": CommandHelp(
        "Show what a scale brings up: the model, the parallel plan (validated), verl's DAPO overrides, the "
        "environment and the command line; --validate composes the overrides in verl's own config schema "
        "(imports verl, ~20 s). With your own job (--recipe FILE: a launch script, read and never run, or a Hydra "
        "YAML; verl overrides after --) its settings win over the scale's, the plan is read back from them and the "
        "memory model gives its verdict on it.",
        "ascend-rl-harness plan --scale full-a3 --recipe my_a3_job.sh -- trainer.logger=[console,wandb]",
        ("0  the plan (and with --validate, verl's schema) accepts the job",
         "1  the job's plan breaks a rule megatron-core / vLLM enforce (named)")),
    "memory": CommandHelp(
        "Per-phase memory of one device of a scale (analytic model: weights, optimizer, activations, KV cache, "
        "...) against its budget with the scale's headroom; with --recipe / overrides after -- it reads every "
        "setting that changes memory and names those it cannot model.",
        "ascend-rl-harness memory --scale full-a2-gbs128 --phase prefill --chunked-prefill",
        ("0  every requested phase fits", "1  a phase does not fit")),
    "compare": CommandHelp(
        "Align a run's curves (reward, response length, loss, grad norm, rollout/actor mismatch) with a golden "
        "baseline, a verl nightly summary or one or more reference runs: per-step band, 5th-14th-step window, "
        "10-step slope, each within a tolerance from the references' own step noise and (with several) their "
        "spread, calibrated on held-out seeds (scripts/calibrate-curves).",
        "ascend-rl-harness compare runs/npu-run runs/gpu-run --json",
        ("0  aligned", "1  misaligned, or nothing could be judged")),
    "baseline": CommandHelp(
        "Golden baselines for curve alignment; `baseline record` derives one from reference runs.",
        "ascend-rl-harness baseline record runs/s0 runs/s1 runs/s2 --out golden.json",
        ("0  done",)),
    "baseline record": CommandHelp(
        "Derive a golden baseline (curves + tolerances) from reference runs (one works; more give tighter, surer "
        "bands); from 3 on, a leave-one-out self-check refuses runs that disagree with the others.",
        "ascend-rl-harness baseline record runs/s0 runs/s1 runs/s2 --out golden.json",
        ("0  golden written",)),
    "throughput": CommandHelp(
        "Tokens/s per device (verl's perf/throughput) and per card of a verl run over its steady window, beside "
        "the roofline, the scale's target and (with --baseline) a baseline run or verl nightly summary.",
        "ascend-rl-harness throughput runs/full-a3 --hardware a3 --scale full-a3",
        ("0  on target and no regression (or nothing to check)", "1  below the target or regressed")),
    "report": CommandHelp(
        "Render report JSON(s) to HTML + Markdown; several (or a trend-store directory): the trend page and "
        "regressions across them. --export tb|csv also writes the reports' curves (this run and the golden's "
        "runs) for TensorBoard or as wandb CSV.",
        "ascend-rl-harness report reports/report.json -o site/",
        ("0  rendered, no regression", "1  a regression or a failed run")),
    "launch": CommandHelp(
        "Submit a scale's DAPO job (or your --recipe / overrides on it: exactly what plan --format verl-cli prints) "
        "to a Ray cluster and watch it (--ray-address, default $RAY_ADDRESS), start a throwaway loopback-only "
        "cluster (--local; at --scale tiny your recipe's algorithm is rehearsed on CPU), or print a Kubernetes job "
        "manifest (--k8s; image, namespace and the shared PVC ascend-rl-harness-shared are stated in its options). "
        "--abort-on-fail stops the job at the first verdict it can no longer pass; --status/--logs/--stop JOB_ID "
        "inspect a submitted job.",
        "ascend-rl-harness launch --scale full-a3 --k8s --image registry/verl-ascend:TAG --namespace rl > job.yaml",
        ("0  the job succeeded and logged every step (or was submitted with --no-wait, or the manifest was printed)",
         "1  the job failed, timed out, lost a node or was aborted (--status: the job failed or was stopped)")),
    "doctor": CommandHelp(
        "Report the installed stack (CANN, driver, torch/torch_npu, vllm/vllm-ascend, verl, transformers, "
        "megatron-core, MindSpeed, mbridge, msprobe, Ray), the SoC and its memory; match it against "
        "harness/config/stacks.py and say which suites will run, skip or break; check the known bugs "
        "(harness/config/known_bugs.py) against it -- or a named stack (--stack) -- and your recipe.",
        "ascend-rl-harness doctor --stack requirements/npu-vllm-ascend-0.23.0.txt --recipe my_a3_job.sh",
        ("0  supported and no known bug certainly hits", "1  unsupported, or a known bug certainly hits")),
    "gate": CommandHelp(
        "The upgrade gated: build --from and --to as cached overlays over the installed stack (pkg==version lists, "
        "wheel files or a requirements file), run the same selection in each with `run --scale tiny` (each side's "
        "report set under --report-dir/A and /B), compare outcomes, the verl config each resolves and B's tiny verl "
        "curves against a golden from A's; when a test that passed on A fails on B, bisect the moved packages with "
        "the cheapest such test and name the package. --dry-run compares two NPU stack-table rows (moved packages, "
        "known-bug verdicts) and installs nothing.",
        "ascend-rl-harness gate --from verl==0.9.0 --to installed --select \"-k advantage\"",
        ("0  SAFE (nothing differs) or CHANGED (outcomes or config differ, nothing broke); --dry-run listed",
         "1  BROKEN: a test that passed on A fails on B")),
    "lab": CommandHelp(
        "One run of the tiny DAPO lab on CPU (harness/lab: transformers policy, reference rollout engine, verl's "
        "DAPO pieces), with a rollout fault injected on request; writes metrics.jsonl + meta.json to --out. "
        "Also the Ray job entry point (python -m harness.lab takes the same options).",
        "ascend-rl-harness lab --steps 30 --seed 0 --fault stale-absorbed --out runs/lab-s0",
        ("0  the run finished",)),
}
