"""`ascend-rl-harness compare` and `ascend-rl-harness baseline record`.

compare CANDIDATE [BASELINE...] : the candidate is a run (log file or run directory); the baseline is one golden
file, one verl Ascend nightly baseline summary (`key: value` per metric), or one or more reference runs (their
spread sets the bands; one is enough: its own step noise sets them then); with no baseline only the absolute
sanity limits apply. `--exact` compares a run with the reference run of the same seed value for value. Exit 0
aligned, 1 misaligned (or nothing could be judged), 2 bad input; `--json` carries the same verdict as `passed`.
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from harness.cli.output import emit, verdict
from harness.errors import BadInput
from harness.io import refuse_input

MAX_PRINTED_WARNINGS = 20


def output_file(value: str, option: str) -> Path:
    """A file the command will write: not a directory, in a directory that exists (checked before any long
    ingest, and instead of a traceback from the atomic rename)."""
    path = Path(value)
    if path.is_dir():
        raise BadInput(f"{option} {path}: is a directory; name a file in it")
    if path.exists() and not path.is_file():
        raise BadInput(f"{option} {path}: exists and is not a regular file")
    if not path.parent.is_dir():
        raise BadInput(f"{option} {path}: directory {path.parent} does not exist; create it first")
    return path


def _load_runs(paths: list[str], lenient: bool, status) -> list:
    from harness.metrics.ingest import load_run

    runs = []
    for path in paths:
        status.update(f"ingesting {path}")
        runs.append(load_run(path, strict=not lenient))
    return runs


def resolve_baseline(paths: list[str], metrics: tuple[str, ...] | None, lenient: bool, status):
    """(Baseline | Summary, reference Runs): one golden file, one nightly summary, or reference runs turned into a
    Baseline (bands from their spread)."""
    from harness.metrics.baseline import FAMILY_METRICS, Baseline, is_baseline_file, load_baseline
    from harness.metrics.ingest import is_summary_file, load_summary

    special = [p for p in paths if is_baseline_file(p) or is_summary_file(p)]
    if special:
        if len(paths) > 1:
            raise BadInput(f"{special[0]}: a golden baseline or nightly summary must be the only BASELINE (got "
                           f"{len(paths)}); pass either one such file or reference runs")
        return (load_baseline(special[0]) if is_baseline_file(special[0]) else load_summary(special[0])), []
    runs = _load_runs(paths, lenient, status)
    wanted = metrics or tuple(m for m in FAMILY_METRICS if all(m in r for r in runs))
    if not wanted:
        raise BadInput(f"{paths[0]}: the reference runs share none of the alignment metrics "
                       f"({', '.join(FAMILY_METRICS)})")
    return Baseline.from_runs(runs, wanted), runs


def cmd_compare(args: argparse.Namespace) -> int:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from harness.cli.output import NARROW
    from harness.cli.output import console as output_console
    from harness.metrics import curves
    from harness.metrics.baseline import Baseline, is_baseline_file
    from harness.metrics.ingest import is_summary_file
    from harness.metrics.run import Summary

    console = output_console(stderr=args.json)
    if is_baseline_file(args.candidate) or is_summary_file(args.candidate):
        raise BadInput(f"{args.candidate}: a golden baseline or nightly summary cannot be the candidate; pass a run's "
                       "logs or directory")
    plot = output_file(args.plot, "--plot") if args.plot else None
    if plot:
        refuse_input(plot, [args.candidate, *args.baselines], "--plot")
    metrics = tuple(args.metric) if args.metric else None
    with console.status("loading runs") as status:
        (candidate,) = _load_runs([args.candidate], args.lenient, status)
        baseline, ref_runs = resolve_baseline(args.baselines, metrics, args.lenient, status) if args.baselines else (
            None, [])
    if args.exact and not isinstance(baseline, Baseline):
        raise BadInput("--exact needs a golden file or reference runs that record their seeds")
    if plot and not isinstance(baseline, Baseline):
        raise BadInput("--plot draws the candidate against a band: pass a golden file or reference runs")
    if isinstance(baseline, Summary):
        alignment = curves.compare_summary(candidate, baseline, metrics)
    elif baseline is None:
        verdicts = curves.check_sanity(candidate, metrics=metrics)
        if not verdicts:
            raise BadInput(f"{args.candidate}: logs none of the metrics with sanity limits; pass a BASELINE")
        alignment = curves.CurveAlignment(candidate=candidate.name, baseline="sanity limits", verdicts=verdicts,
                                          against_reference=False)
    elif args.exact:
        alignment = curves.compare_exact(candidate, baseline, metrics, allow_partial=args.allow_partial)
    else:
        alignment = curves.compare(candidate, baseline, metrics)
    warnings = [w for run in (candidate, *ref_runs) for w in run.meta.warnings]
    if plot:
        curves.plot(alignment, candidate, baseline, plot)
    if args.json:
        return emit(verdict(alignment.passed, alignment.state,
                            {**alignment.to_json(), "warnings": warnings, "plot": str(plot) if plot else None}))
    else:
        results = {True: "[green]ok[/]", False: "[red]FAIL[/]", None: "[yellow]not judged[/]"}
        # issue 47: 25 verdicts printed 93 lines with the failures in the middle; failures first, then what was not
        # judged, then the passes (--failed-only: the failures alone)
        order = {False: 0, None: 1, True: 2}
        shown = sorted((v for v in alignment.verdicts if not args.failed_only or v.passed is False),
                       key=lambda v: order[v.passed])
        # At 80 columns the table's detail column folded ~25 verdicts into ~140 lines: there, one line per verdict.
        if console.width < NARROW:
            console.print(escape(f"{candidate.name} vs {alignment.baseline}"))
            for v in shown:  # the name first and whole: rich wraps at spaces, names hold none
                console.print(f"{escape(v.metric)} {v.statistic} {results[v.passed]}: {escape(v.where)}: "
                              f"{escape(v.detail)}")
        else:
            # Names never fold (`critic/rewards/mea|n`): the metric column keeps the longest name whole, no vertical
            # rules, and only the free-text detail (prefixed with the steps it covers) wraps.
            table = Table(title=escape(f"{candidate.name} vs {alignment.baseline}"), box=box.SIMPLE_HEAD,
                          pad_edge=False)
            table.add_column("metric", no_wrap=True,
                             min_width=max((len(v.metric) for v in shown), default=6))
            table.add_column("statistic", no_wrap=True, overflow="ellipsis")
            table.add_column("result", no_wrap=True)
            table.add_column("where: detail", overflow="fold", ratio=1)
            for v in shown:
                table.add_row(escape(v.metric), v.statistic, results[v.passed], escape(f"{v.where}: {v.detail}"))
            console.print(table)
        for w in warnings[:MAX_PRINTED_WARNINGS]:
            console.print(f"[yellow]warning[/] {escape(w)}")
        if len(warnings) > MAX_PRINTED_WARNINGS:
            console.print(f"[yellow]... {len(warnings) - MAX_PRINTED_WARNINGS} more warnings[/] (see --json)")
        for note in alignment.notes:
            console.print(f"[yellow]{escape(note)}[/]")
        if plot:
            console.print(f"plot: {escape(str(plot))}")
        console.print(f"[{'green' if alignment.passed else 'red'}]{escape(alignment.summary())}[/]")
    return 0 if alignment.passed else 1


def _calibrated(path: str | None) -> tuple[dict, dict]:
    """`--calibration FILE` (what scripts/calibrate-curves --out writes) -> ({metric: (band, window, trend)}, {metric:
    rest share}): the file's measured noise inflation of each metric it calibrated, and the update's clip fraction's
    floor where it measured one (CurveTolerance.rest_share; a calibration written before it has none)."""
    from harness.io import read_json
    from harness.metrics.baseline import FAMILY_METRICS, INFLATED_STATISTICS, is_update_clip_name

    if path is None:
        return {}, {}
    doc = read_json(path, missing="no such calibration; write one with scripts/calibrate-curves --out FILE")
    inflation = doc.get("inflation") if isinstance(doc, dict) else None
    if not isinstance(inflation, dict) or not inflation or not all(
            m in FAMILY_METRICS and isinstance(f, list) and len(f) == len(INFLATED_STATISTICS)
            and all(type(x) in (int, float) and 1 <= x < math.inf for x in f) for m, f in inflation.items()):
        raise BadInput(f"--calibration {path}: needs \"inflation\": metric -> [band, window, trend] factors >= 1 "
                       "for judged metrics (scripts/calibrate-curves --out writes it)")
    shares = doc.get("rest_share", {})
    if not isinstance(shares, dict) or not all(m in FAMILY_METRICS and is_update_clip_name(m)
                                               and type(v) in (int, float) and 0 < v <= 2 for m, v in shares.items()):
        raise BadInput(f"--calibration {path}: \"rest_share\" must be the update's clip fraction -> the share of the "
                       "reward window's steps in (0, 2] (scripts/calibrate-curves --out writes it)")
    return {m: tuple(map(float, f)) for m, f in inflation.items()}, {m: float(v) for m, v in shares.items()}


def _tolerances(specs, inflation: dict | None = None, precision: str | None = None,
                rest_shares: dict | None = None) -> dict:
    """`--tolerance METRIC:FIELD=VALUE[,FIELD=VALUE...]` -> {metric: CurveTolerance} over the metric's defaults at
    the runs' `precision` (the rollout/actor agreement's floors follow it), with a calibration's `inflation` and
    `rest_shares` (_calibrated)."""
    import dataclasses

    from harness.metrics.baseline import UPDATE_CLIP_NAMES, CurveTolerance, default_tolerance, is_update_clip_name

    kinds = {f.name: f.type for f in dataclasses.fields(CurveTolerance)
             if f.type in ("float", "int", "float | None", "tuple[int, int]")}
    out = {m: default_tolerance(m, precision).with_inflation(f) for m, f in (inflation or {}).items()}
    for m, share in (rest_shares or {}).items():
        out[m] = dataclasses.replace(out.get(m) or default_tolerance(m, precision), rest_share=share)
    for spec in specs:
        if "rest_share=" in spec and ":" in spec and not is_update_clip_name(spec.rpartition(":")[0]):
            raise BadInput(f"--tolerance {spec!r}: rest_share is the policy update's clip fraction's floor "
                           f"({', '.join(UPDATE_CLIP_NAMES)}); other metrics have none")
        metric, _, fields = spec.rpartition(":")
        try:
            pairs = dict(item.split("=", 1) for item in fields.split(","))
            if not metric or not pairs.keys() <= kinds.keys():
                raise ValueError
            values = {k: _tolerance_value(kinds[k], v) for k, v in pairs.items()}
            out[metric] = dataclasses.replace(out.get(metric) or default_tolerance(metric, precision), **values)
        except (ValueError, OverflowError):  # 1e309 is inf: no tolerance, and int(inf) overflowed
            raise BadInput(f"--tolerance {spec!r}: use METRIC:FIELD=VALUE[,FIELD=VALUE...] with FIELD one of "
                           f"{', '.join(sorted(kinds))} (spike_limit=none: no spike judged; window=FIRST-LAST "
                           "logged steps)") from None
        except BadInput as exc:  # a value out of its field's range (CurveTolerance.validate), an unknown metric
            raise BadInput(f"--tolerance {spec!r}: {exc}") from None
    return out


def _tolerance_value(kind: str, text: str) -> int | float | tuple[int, int] | None:
    """A --tolerance field's value as its field's type ("none" where the field takes None: a share's spike_limit;
    FIRST-LAST for the window, the logged steps its statistic covers); a non-finite or fractional integer is no
    value, and CurveTolerance checks the window's range."""
    if kind == "float | None" and text.strip().lower() in ("none", "null"):
        return None
    if kind == "tuple[int, int]":
        steps = re.fullmatch(r"(\d{1,6})-(\d{1,6})", text)
        if steps is None:
            raise ValueError(text)
        return int(steps[1]), int(steps[2])
    value = float(text)
    if not math.isfinite(value) or (kind == "int" and not value.is_integer()):
        raise ValueError(text)
    return int(value) if kind == "int" else value


def cmd_baseline_record(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from harness.cli.output import console as output_console
    from harness.metrics import curves, power, stats
    from harness.metrics.baseline import (
        FAMILY_METRICS,
        Baseline,
        check_windows_reached,
        default_tolerance,
        run_precision,
    )

    console = output_console(stderr=args.json)  # --json: stdout carries only the JSON
    out = refuse_input(output_file(args.out, "--out"), args.runs, "--out")  # even with --force
    inflation, rest_shares = _calibrated(args.calibration)
    _tolerances(args.tolerance or (), inflation, rest_shares=rest_shares)  # bad input before the (long) ingest
    if out.exists() and not args.force:  # check before the (possibly long) ingest
        raise BadInput(f"{out}: a baseline already exists; pass --force to replace it")
    with console.status("loading reference runs") as status:
        runs = _load_runs(args.runs, args.lenient, status)
    metrics = tuple(args.metric) if args.metric else tuple(m for m in FAMILY_METRICS if all(m in r for r in runs))
    if not metrics:
        raise BadInput(f"{args.runs[0]}: the runs share none of the alignment metrics; choose some with --metric")
    tolerances = _tolerances(args.tolerance or (), inflation, run_precision(runs[0]), rest_shares)
    check_windows_reached(runs, {m: tol for m, tol in tolerances.items() if m in metrics and tol.window != (
        default_tolerance(m, run_precision(runs[0])).window)})  # the default window on short runs: not judged
    baseline = Baseline.from_runs(runs, metrics, tolerances=tolerances)
    check = curves.self_check(baseline, runs)
    if check is not None and check.flagged and not args.keep_flagged:
        run, failure = check.flagged[0]
        raise BadInput(f"reference run {run} disagrees with the other {len(runs) - 1} ({failure}); "
                       f"{len(check.flagged)} of {len(runs)} runs flagged: inspect and drop it, or pass --keep-flagged")
    if check is not None:
        baseline.provenance["self_check"] = check.to_json()
    baseline = power.with_power(baseline)
    baseline.save(out, force=args.force)
    for w in (w for r in runs for w in r.meta.warnings):
        console.print(f"[yellow]warning[/] {escape(w)}")
    steps = [s for b in baseline.metrics.values() for s in (b.steps[0], b.steps[-1])]
    if args.json:  # refusing a run (a flagged self-check) is bad input, exit 2: a written golden passed
        return emit(verdict(True, "RECORDED", {
            "out": str(out), "metrics": list(metrics), "runs": [r.name for r in runs],
            "steps": [min(steps), max(steps)], "precision": baseline.precision,
            "self_check": check.to_json() if check is not None else None, "power": baseline.power,
            "constants": sorted(baseline.constants), "warnings": [w for r in runs for w in r.meta.warnings]}))
    console.print(f"[green]baseline written[/] {escape(str(out))}: {len(metrics)} metrics from {len(runs)} run(s), "
                  f"steps {min(steps)}-{max(steps)}, precision {baseline.precision or 'unknown'}")
    if check is None:
        console.print(f"[yellow]{len(runs)} run(s): no leave-one-out self-check below {stats.MIN_CALIBRATED_RUNS}; "
                      "compares against it are judged by the runs' step noise (more runs: tighter, surer bands)[/]")
    else:
        console.print(f"self-check (leave-one-out): {len(check.flagged)} of {len(runs)} runs flagged against the "
                      f"others, false-alarm rate {check.false_alarm_rate:.0%}")
        for run, failure in check.flagged:
            console.print(f"[yellow]flagged (kept: --keep-flagged)[/] {escape(run)}: {escape(failure)}")
    console.print(f"{len(baseline.constants)} constant metrics stored (a candidate must reproduce them exactly)")
    # issue 43: a golden that cannot fail a run which stops learning is said so when it is made, not found later
    console.print(f"power (smallest shift each statistic flags in {power.POWER:.0%} of candidates):")
    for line in power.lines(baseline.power):
        console.print(escape(line))
    if baseline.power["weak"]:
        console.print(f"[red]{escape(baseline.power['advice'])}[/]")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="align a run's curves with a baseline (exit 0 aligned, 1 misaligned)")
    p.add_argument("candidate", help="the run under test: a verl log file or run directory")
    p.add_argument("baselines", nargs="*", metavar="BASELINE",
                   help="one golden file, one verl nightly summary (key: value), or reference run(s); none: only "
                        "the absolute sanity limits")
    p.add_argument("--metric", action="append", help="metric to compare (repeatable; default: the alignment set)")
    p.add_argument("--exact", action="store_true",
                   help="same-seed exact mode: the candidate must equal the reference run of its seed at every step")
    p.add_argument("--json", action="store_true",
                   help="print JSON: `passed`, `state` (ALIGNED, MISALIGNED, NOT COMPARED) and every verdict")
    p.add_argument("--plot", metavar="PNG", help="write a candidate-vs-band plot")
    p.add_argument("--failed-only", action="store_true",
                   help="print only the failed verdicts (and the summary line); --json always carries every verdict")
    p.add_argument("--lenient", action="store_true",
                   help="skip corrupt lines/pairs, truncated lines and duplicate steps (counted in the warnings) "
                        "instead of refusing the log")
    p.add_argument("--allow-partial", action="store_true",
                   help="--exact: compare the steps the candidate logged (a shorter run); without --exact a run too "
                        "short for a statistic is always 'not judged' on it")
    p.set_defaults(func=cmd_compare)

    b = sub.add_parser("baseline", help="golden baselines for curve alignment")
    bsub = b.add_subparsers(dest="baseline_command", required=True, metavar="ACTION")
    r = bsub.add_parser("record", help="derive a golden baseline (curves + tolerances) from reference runs; a "
                                       "leave-one-out self-check refuses runs that disagree with the others")
    r.add_argument("runs", nargs="+", metavar="RUN",
                   help="reference runs (log files or run directories), 1 or more (3+ for the self-check)")
    r.add_argument("--out", required=True, help="golden JSON file to write")
    r.add_argument("--force", action="store_true", help="replace an existing baseline")
    r.add_argument("--keep-flagged", action="store_true",
                   help="record even when the self-check flags a run (the flags are kept in the provenance)")
    r.add_argument("--metric", action="append", help="metric to record (repeatable; default: the alignment set)")
    r.add_argument("--lenient", action="store_true", help="skip log irregularities (counted in the warnings)")
    r.add_argument("--json", action="store_true", help="print JSON: `passed`, `state` RECORDED, the golden's metrics, "
                                                       "runs, steps and self-check")
    r.add_argument("--calibration", metavar="FILE",
                   help="your recipe's calibration (scripts/calibrate-curves --out): the noise inflation it measured "
                        "for each metric it calibrated; --tolerance wins over it")
    r.add_argument("--tolerance", action="append", metavar="METRIC:FIELD=VALUE[,...]",
                   help="override a metric's default tolerance (repeatable), e.g. "
                        "training/rollout_probs_diff_mean:band_atol=1e-6,window_atol=1e-6 or "
                        "critic/rewards/mean:window=21-30 (the logged steps the window statistic covers)")
    r.set_defaults(func=cmd_baseline_record)
