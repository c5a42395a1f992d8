"""`ascend-rl-harness throughput RUN`: tokens/s per device (verl's perf/throughput) and per card of a verl run,
beside the roofline, the scale's target and (with --baseline) a baseline run or verl nightly summary.
Exit 0 on target and no regression (or nothing to check), 1 below either, 2 bad input."""
from __future__ import annotations

import argparse
import math

from harness.cli.output import emit, verdict
from harness.config.hardware import PROFILES
from harness.errors import BadInput


def _validate(devices, sequences, warmup, target, tolerance) -> None:
    """Option values argparse's types let through: each refused naming the option (`--devices 0` used to be
    ignored, `--target -1` passed a run with TPS -12.3)."""
    for option, value in (("--devices", devices), ("--sequences", sequences)):
        if value is not None and value < 1:
            raise BadInput(f"{option} {value}: must be a positive whole number")
    if warmup < 0:
        raise BadInput(f"--warmup {warmup}: must be >= 0")
    if target is not None and not (math.isfinite(target) and target > 0):
        raise BadInput(f"--target {target}: must be a positive finite TPS/card")
    if not (math.isfinite(tolerance) and 0 <= tolerance < 1):
        raise BadInput(f"--tolerance {tolerance}: must be a fraction in [0, 1) (0.05 = verl nightly's -5 %)")


def throughput_document(paths: list[str], hardware: str | None, devices: int | None, sequences: int | None,
                        warmup: int, scale_name: str | None, target: float | None, *, statistic: str = "median",
                        baseline: str | None = None, tolerance: float | None = None, per_step: bool = True) -> dict:
    """What `throughput --json` prints: `passed` and `state` (ON TARGET, or the failed checks joined by AND: BELOW
    TARGET, REGRESSED, PHASE REGRESSED; NOT JUDGED: neither a target nor a baseline to check), then
    Throughput.to_dict() + target, roofline, and the checks `target_check`, `baseline` and `phases_check` (each
    timing_s phase vs a baseline run's; null when not made)."""
    from harness.config.roofline import roofline
    from harness.config.scales import get_scale
    from harness.metrics.ingest import is_summary_file, load_run, load_summary
    from harness.metrics.keys import PROMPT_LENGTH, RESPONSE_LENGTH
    from harness.metrics.throughput import (
        baseline_tps_per_card,
        check_phases,
        check_regression,
        check_target,
        throughput,
    )

    run = load_run(*paths)
    scale = get_scale(scale_name or run.meta.scale) if scale_name or run.meta.scale else None
    name = hardware or run.meta.hardware or (scale.hardware.name if scale else None)
    if name not in PROFILES:
        raise BadInput(f"--hardware {name!r}: pass one of {', '.join(PROFILES)} (dies per card and peak come from it)")
    profile = PROFILES[name]
    sequences = sequences or (scale.batch.sequences if scale else None)
    reference = None
    if baseline is not None:
        reference = load_summary(baseline) if is_summary_file(baseline) else load_run(baseline)
        if is_summary_file(baseline):
            statistic = "nightly"  # the summary holds verl's mean of steps 5-14: measure the run the same way
    tp = throughput(run, profile, devices=devices or run.meta.devices, sequences=sequences, warmup=warmup,
                    statistic=statistic, devices_from="--devices" if devices else "the run's meta.json devices")
    doc = tp.to_dict(per_step=per_step)
    target = target if target is not None else (scale.targets.tps_per_card if scale else None)
    doc["target"] = target
    doc["roofline"] = None
    if scale is not None:
        window = list(tp.window)
        if PROMPT_LENGTH in run and RESPONSE_LENGTH in run:
            p, r = run[PROMPT_LENGTH].as_dict(), run[RESPONSE_LENGTH].as_dict()
            lengths = [p[s] + r[s] for s in window if s in p and s in r]
            mean_tokens = sum(lengths) / len(lengths) if lengths else None
        else:
            mean_tokens = tp.tokens_per_step / scale.batch.sequences
        roof = roofline(scale, mean_tokens)
        doc["roofline"] = roof.to_dict() | {"fraction": roof.fraction(tp.tps_per_card)}
    doc["target_check"] = None
    if target is not None:
        v = check_target(tp, target)
        doc["target_check"] = {"passed": v.ok, "message": v.message()}
    doc["baseline"] = None
    if reference is not None:
        value, kind = baseline_tps_per_card(reference, profile, sequences=sequences, warmup=warmup)
        tol = tolerance if tolerance is not None else (scale.targets.regression_tolerance if scale else 0.05)
        v = check_regression(tp, value, tol, baseline_statistic=kind)
        doc["baseline"] = {"source": baseline, "tps_per_card": value, "statistic": kind, "passed": v.ok,
                           "message": v.message()}
    # every timing_s/<phase> against the golden run's (a nightly summary holds no per-step phases: not judged)
    doc["phases_check"] = None
    if reference is not None and not is_summary_file(baseline):
        pv = check_phases(tp, run, reference, tolerance if tolerance is not None else 0.05)
        doc["phases_check"] = pv.to_dict() | {"message": pv.message()}
    below = doc["target_check"] is not None and not doc["target_check"]["passed"]
    regressed = doc["baseline"] is not None and not doc["baseline"]["passed"]
    phase = doc["phases_check"] is not None and not doc["phases_check"]["passed"]
    state = " AND ".join(s for s, bad in (("BELOW TARGET", below), ("REGRESSED", regressed),
                                          ("PHASE REGRESSED", phase)) if bad) or (
        "ON TARGET" if doc["target_check"] or doc["baseline"] else "NOT JUDGED")
    return verdict(not (below or regressed or phase), state, doc)


def cmd_throughput(args: argparse.Namespace) -> int:
    _validate(args.devices, args.sequences, args.warmup, args.target, args.tolerance if args.tolerance is not None
              else 0.05)
    doc = throughput_document(args.run, args.hardware, args.devices, args.sequences, args.warmup, args.scale,
                              args.target, statistic=args.statistic, baseline=args.baseline,
                              tolerance=args.tolerance, per_step=args.per_step or not args.json)
    if args.json:
        return emit(doc)
    else:
        from rich.markup import escape
        from rich.table import Table

        from harness.cli.output import console as output_console
        from harness.config.scales import plural

        console = output_console()
        # "1 devices = 1 cpu cards" read as written: counts agree with their nouns
        devices = f"{plural(doc['devices'], 'device')} = {plural(doc['cards'], doc['hardware'] + ' card')}"
        if args.per_step:
            table = Table(title=escape(f"throughput of {doc['run']} ({devices})"))
            for col in ("step", "tokens", "step s", "TPS/device (verl)", "TPS/card"):
                table.add_column(col, justify="right")
            window = set(doc["window"])
            for p in doc["per_step"]:
                mark = "" if p["step"] in window else " (not in window)"
                table.add_row(f"{p['step']}{mark}", f"{p['tokens']:.0f}", f"{p['step_time_s']:.2f}",
                              f"{p['tps_per_device']:.1f}", f"{p['tps_per_card']:.1f}")
            console.print(table)
        console.print(escape(f"throughput of {doc['run']}: {devices}, {plural(len(doc['per_step']), 'step')} "
                             "(--per-step lists them)"))
        console.print(f"[bold]TPS/card {doc['tps_per_card']:.1f}[/] ({escape(doc['statistic_text'])}), "
                      f"TPS/device {doc['tps_per_device']:.1f}")
        for ph in doc["phases"]:
            console.print(f"  {escape(ph['name']):>14}: {ph['seconds']:9.2f} s  {ph['share']:6.1%} of the "
                          f"{ph['steps']} window steps it ran in")
        if doc["roofline"]:
            r = doc["roofline"]
            console.print(f"roofline {r['tps_per_card_limit']:.0f} TPS/card ({r['flops_per_token']['total'] / 1e9:.0f} "
                          f"GFLOP/token at {r['peak_tflops_per_card']:g} TFLOPS/card; measured {r['fraction']:.1%})"
                          if r["tps_per_card_limit"] else "roofline: no peak figure for this hardware")
        for w in doc["warnings"]:
            console.print(f"[yellow]warning[/] {escape(w)}")
        for key in ("target_check", "baseline", "phases_check"):
            if doc[key]:
                shown = "[green]PASS[/]" if doc[key]["passed"] else "[red]FAIL[/]"
                console.print(f"{shown}: {escape(doc[key]['message'])}")
        why = ": neither a target (--target, --scale) nor a --baseline to check" if doc["state"] == "NOT JUDGED" else ""
        console.print(f"[{'green' if doc['passed'] else 'red'}]{doc['state']}[/]{why}")
    return 0 if doc["passed"] else 1


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli.args import fraction, real, whole
    from harness.metrics.throughput import STATISTICS
    from harness.numeric import MAX_STEP, METRIC_LIMIT

    p = sub.add_parser("throughput", help="TPS per device (verl) and per card of a verl run, beside the roofline")
    p.add_argument("run", nargs="+", metavar="RUN", help="run directory or log file(s) (segments of one run)")
    p.add_argument("--hardware", choices=sorted(PROFILES), help="hardware profile (default: the run's meta.json)")
    p.add_argument("--devices", type=whole(1), help="torch devices of the run (dies on A3); default: verl's own count")
    p.add_argument("--sequences", type=whole(1), help="GBS x n, only for runs without perf/total_num_tokens")
    p.add_argument("--warmup", type=whole(0, MAX_STEP), default=1, help="leading steps the median skips (default 1)")
    p.add_argument("--statistic", choices=STATISTICS, default="median",
                   help="median of the steps after --warmup (default), or nightly: verl's Ascend nightly mean of the "
                        "5th-14th logged steps (forced when --baseline is a nightly summary)")
    p.add_argument("--scale", help="scale of the run: roofline and default target")
    p.add_argument("--target", type=real(0.0, METRIC_LIMIT, low_open=True),
                   help="TPS/card the run must reach (default: the scale's target)")
    p.add_argument("--baseline", metavar="REF",
                   help="a baseline run, or a verl nightly baseline summary (key: value): no regression beyond "
                        "--tolerance; a baseline run also judges every timing_s phase (slower than the golden by "
                        "more than --tolerance or its noise fails, naming the phase)")
    p.add_argument("--tolerance", type=fraction, help="allowed relative regression (default: the scale's, else 0.05)")
    p.add_argument("--per-step", action="store_true", help="list every step (JSON: the per_step rows)")
    p.add_argument("--json", action="store_true", help="print JSON (the summary; --per-step adds the rows)")
    p.set_defaults(func=cmd_throughput)
