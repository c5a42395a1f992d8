"""`ascend-rl-harness compare` and `ascend-rl-harness baseline record`.

compare CANDIDATE BASELINE... : the candidate is a run (log file or run directory); the baseline is one golden
file or one or more reference runs (their spread sets the bands). Exit 0 aligned, 1 misaligned, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.errors import BadInput


def _load_runs(paths: list[str], lenient: bool, status) -> list:
    from harness.metrics.ingest import load_run

    runs = []
    for path in paths:
        status.update(f"ingesting {path}")
        runs.append(load_run(path, strict=not lenient))
    return runs


def resolve_baseline(paths: list[str], metrics: tuple[str, ...] | None, lenient: bool, status):
    """One golden file, or reference runs turned into a Baseline (tolerances from their spread)."""
    from harness.metrics.baseline import ALIGN_METRICS, Baseline, is_baseline_file, load_baseline

    goldens = [p for p in paths if is_baseline_file(p)]
    if goldens:
        if len(paths) > 1:
            raise BadInput(f"{goldens[0]}: a golden baseline file must be the only BASELINE (got {len(paths)}); "
                           "pass either one golden file or reference runs")
        return load_baseline(goldens[0]), []
    runs = _load_runs(paths, lenient, status)
    wanted = metrics or tuple(m for m in ALIGN_METRICS if all(m in r for r in runs))
    if not wanted:
        raise BadInput(f"{paths[0]}: the reference runs share none of the alignment metrics "
                       f"({', '.join(ALIGN_METRICS)})")
    return Baseline.from_runs(runs, wanted), runs


def cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from harness.metrics import curves
    from harness.metrics.baseline import is_baseline_file

    console = Console(stderr=args.json)
    if is_baseline_file(args.candidate):
        raise BadInput(f"{args.candidate}: a golden baseline cannot be the candidate; pass a run's logs or directory")
    metrics = tuple(args.metric) if args.metric else None
    with console.status("loading runs") as status:
        (candidate,) = _load_runs([args.candidate], args.lenient, status)
        baseline, ref_runs = resolve_baseline(args.baselines, metrics, args.lenient, status)
    alignment = curves.compare(candidate, baseline, metrics, allow_partial=args.allow_partial)
    warnings = [w for run in (candidate, *ref_runs) for w in run.meta.warnings]
    if args.plot:
        curves.plot(alignment, candidate, baseline, args.plot)
    if args.json:
        print(json.dumps({"aligned": alignment.aligned, "candidate": candidate.name, "baseline": baseline.name,
                          "verdicts": [v.to_json() for v in alignment.verdicts], "warnings": warnings,
                          "plot": args.plot}, indent=2))
    else:
        table = Table(title=f"{candidate.name} vs {baseline.name}")
        for col in ("metric", "statistic", "where", "result", "detail"):
            table.add_column(col, overflow="fold")
        for v in alignment.verdicts:
            result = {True: "[green]ok[/]", False: "[red]FAIL[/]", None: "[yellow]skip[/]"}[v.passed]
            table.add_row(v.metric, v.statistic, v.where, result, v.detail)
        console.print(table)
        for w in warnings[:20]:
            console.print(f"[yellow]warning[/] {w}")
        if len(warnings) > 20:
            console.print(f"[yellow]... {len(warnings) - 20} more warnings[/] (see --json)")
        if args.plot:
            console.print(f"plot: {args.plot}")
        console.print(("[green]" if alignment.aligned else "[red]") + alignment.summary() + "[/]")
    return 0 if alignment.aligned else 1


def _tolerances(specs) -> dict:
    """`--tolerance METRIC:FIELD=VALUE[,FIELD=VALUE...]` -> {metric: CurveTolerance} over the metric's defaults."""
    import dataclasses

    from harness.metrics.baseline import CurveTolerance, default_tolerance

    numeric = {f.name for f in dataclasses.fields(CurveTolerance) if f.type in ("float", "int")}
    out = {}
    for spec in specs:
        metric, _, fields = spec.rpartition(":")
        try:
            pairs = dict(item.split("=", 1) for item in fields.split(","))
            if not metric or not pairs.keys() <= numeric:
                raise ValueError
            values = {k: type(getattr(default_tolerance(metric), k))(float(v)) for k, v in pairs.items()}
        except ValueError:
            raise BadInput(f"--tolerance {spec!r}: use METRIC:FIELD=VALUE[,FIELD=VALUE...] with FIELD one of "
                           f"{', '.join(sorted(numeric))}") from None
        out[metric] = dataclasses.replace(out.get(metric) or default_tolerance(metric), **values)
    return out


def cmd_baseline_record(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harness.metrics.baseline import ALIGN_METRICS, Baseline

    console = Console()
    out = Path(args.out)
    if out.exists() and not args.force:  # check before the (possibly long) ingest
        raise BadInput(f"{out}: a baseline already exists; pass --force to replace it")
    with console.status("loading reference runs") as status:
        runs = _load_runs(args.runs, args.lenient, status)
    metrics = tuple(args.metric) if args.metric else tuple(m for m in ALIGN_METRICS if all(m in r for r in runs))
    if not metrics:
        raise BadInput(f"{args.runs[0]}: the runs share none of the alignment metrics; choose some with --metric")
    baseline = Baseline.from_runs(runs, metrics, tolerances=_tolerances(args.tolerance or ()))
    baseline.save(out, force=args.force)
    for w in (w for r in runs for w in r.meta.warnings):
        console.print(f"[yellow]warning[/] {w}")
    console.print(f"[green]baseline written[/] {out}: {len(metrics)} metrics from {len(runs)} run(s), steps "
                  f"{min(b.steps[0] for b in baseline.metrics.values())}-"
                  f"{max(b.steps[-1] for b in baseline.metrics.values())}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="align a run's curves with a baseline (exit 0 aligned, 1 misaligned)")
    p.add_argument("candidate", help="the run under test: a verl log file or run directory")
    p.add_argument("baselines", nargs="+", metavar="BASELINE", help="one golden file, or reference run(s)")
    p.add_argument("--metric", action="append", help="metric to compare (repeatable; default: the alignment set)")
    p.add_argument("--json", action="store_true", help="print verdicts as JSON")
    p.add_argument("--plot", metavar="PNG", help="write a candidate-vs-band plot")
    p.add_argument("--lenient", action="store_true",
                   help="accept truncated/corrupt log lines and duplicate steps as warnings instead of errors")
    p.add_argument("--allow-partial", action="store_true",
                   help="skip (not fail) window/trend statistics the candidate has not reached yet")
    p.set_defaults(func=cmd_compare)

    b = sub.add_parser("baseline", help="golden baselines for curve alignment")
    bsub = b.add_subparsers(dest="baseline_command", required=True, metavar="ACTION")
    r = bsub.add_parser("record", help="derive a golden baseline (curves + tolerances) from reference runs")
    r.add_argument("runs", nargs="+", metavar="RUN", help="reference runs (log files or run directories)")
    r.add_argument("--out", required=True, help="golden JSON file to write")
    r.add_argument("--force", action="store_true", help="replace an existing baseline")
    r.add_argument("--metric", action="append", help="metric to record (repeatable; default: the alignment set)")
    r.add_argument("--lenient", action="store_true", help="accept log irregularities as warnings")
    r.add_argument("--tolerance", action="append", metavar="METRIC:FIELD=VALUE[,...]",
                   help="override a metric's default tolerance (repeatable), e.g. "
                        "training/rollout_probs_diff_mean:band_atol=1e-6,window_atol=1e-6")
    r.set_defaults(func=cmd_baseline_record)
