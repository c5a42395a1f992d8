"""`ascend-rl-harness throughput RUN`: tokens/s per device (verl's perf/throughput) and per card of a verl run,
beside the roofline and the scale's target. Exit 0 on target (or no target), 1 below it, 2 bad input."""
from __future__ import annotations

import argparse
import json

from harness.config.hardware import PROFILES
from harness.errors import BadInput


def throughput_document(paths: list[str], hardware: str | None, devices: int | None, sequences: int | None,
                        warmup: int, scale_name: str | None, target: float | None) -> dict:
    """What `throughput --json` prints: Throughput.to_dict() + target, roofline and verdict."""
    from harness.config.roofline import roofline
    from harness.config.scales import get_scale
    from harness.metrics.ingest import load_run
    from harness.metrics.keys import PROMPT_LENGTH, RESPONSE_LENGTH
    from harness.metrics.throughput import check_target, throughput

    run = load_run(*paths)
    scale = get_scale(scale_name or run.meta.scale) if scale_name or run.meta.scale else None
    name = hardware or run.meta.hardware or (scale.hardware.name if scale else None)
    if name not in PROFILES:
        raise BadInput(f"--hardware {name!r}: pass one of {', '.join(PROFILES)} (dies per card and peak come from it)")
    sequences = sequences or (scale.batch.sequences if scale else None)
    tp = throughput(run, PROFILES[name], devices=devices or run.meta.devices, sequences=sequences, warmup=warmup)
    doc = tp.to_dict()
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
    doc["verdict"] = None
    if target is not None:
        v = check_target(tp, target)
        doc["verdict"] = {"passed": v.ok, "message": v.message()}
    return doc


def cmd_throughput(args: argparse.Namespace) -> int:
    doc = throughput_document(args.run, args.hardware, args.devices, args.sequences, args.warmup, args.scale,
                              args.target)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=f"throughput of {doc['run']} ({doc['devices']} devices = {doc['cards']} "
                            f"{doc['hardware']} cards)")
        for col in ("step", "tokens", "step s", "TPS/device (verl)", "TPS/card"):
            table.add_column(col, justify="right")
        for p in doc["per_step"]:
            mark = " (warm-up)" if p["step"] in doc["warmup"] else ""
            table.add_row(f"{p['step']}{mark}", f"{p['tokens']:.0f}", f"{p['step_time_s']:.2f}",
                          f"{p['tps_per_device']:.1f}", f"{p['tps_per_card']:.1f}")
        console = Console()
        console.print(table)
        console.print(f"[bold]TPS/card {doc['tps_per_card']:.1f}[/] (median of steps {doc['window'][0]}-"
                      f"{doc['window'][-1]}), TPS/device {doc['tps_per_device']:.1f}")
        for ph in doc["phases"]:
            console.print(f"  {ph['name']:>14}: {ph['seconds']:9.2f} s  {ph['share']:6.1%}")
        if doc["roofline"]:
            r = doc["roofline"]
            console.print(f"roofline {r['tps_per_card_limit']:.0f} TPS/card ({r['flops_per_token']['total'] / 1e9:.0f} "
                          f"GFLOP/token at {r['peak_tflops_per_card']:g} TFLOPS/card; measured {r['fraction']:.1%})"
                          if r["tps_per_card_limit"] else "roofline: no peak figure for this hardware")
        if doc["verdict"]:
            ok = doc["verdict"]["passed"]
            console.print(f"[{'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/]: "
                          f"{escape(doc['verdict']['message'])}")
    return 0 if doc["verdict"] is None or doc["verdict"]["passed"] else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("throughput", help="TPS per device (verl) and per card of a verl run, beside the roofline")
    p.add_argument("run", nargs="+", metavar="RUN", help="run directory or log file(s) (segments of one run)")
    p.add_argument("--hardware", choices=sorted(PROFILES), help="hardware profile (default: the run's meta.json)")
    p.add_argument("--devices", type=int, help="torch devices of the run (dies on A3); default: verl's own count")
    p.add_argument("--sequences", type=int, help="GBS x n, only for runs without perf/total_num_tokens")
    p.add_argument("--warmup", type=int, default=1, help="leading steps to skip (default 1)")
    p.add_argument("--scale", help="scale of the run: roofline and default target")
    p.add_argument("--target", type=float, help="TPS/card the run must reach (default: the scale's target)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_throughput)
