"""`ascend-rl-harness memory --scale NAME | --recipe FILE`: per-phase memory of one device against its budget, with
a verdict.

Exit 0 when every requested phase fits with the scale's headroom, 1 when one does not, 2 on bad input.
"""
from __future__ import annotations

import argparse

from harness.cli.args import add_job_arguments
from harness.cli.output import emit, verdict
from harness.errors import BadInput
from harness.memory.phases import PHASES, MemoryOptions, PhaseMemory, plan_memory


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from harness.cli.args import job_from_args
    from harness.memory.job_options import memory_options

    job = job_from_args(args)
    scale = job.scale
    if args.gbs is not None:
        if args.gbs < 1:
            raise BadInput(f"--gbs {args.gbs}: must be a positive number of prompts per step")
        scale = replace(scale, batch=replace(scale.batch, gbs=args.gbs))
    if args.micro_batch is not None and args.micro_batch < 1:
        raise BadInput(f"--micro-batch {args.micro_batch}: must be >= 1")
    from harness.config.recipe import dropped_keys, installed_verl

    memory = memory_options(job, MemoryOptions(chunked_prefill=args.chunked_prefill, micro_batch=args.micro_batch))
    phases = (args.phase,) if args.phase else PHASES
    results = plan_memory(scale, memory.options, phases)
    ok = all(p.fits for p in results)
    # keys verl does not have: the model never reads them and launch refuses them (issue 44: memory dropped a
    # misspelled key silently where `plan --validate` named it)
    dropped = dropped_keys(job.recipe)
    if args.json:  # `passed`: every phase fits (each phase carries its own `fits`)
        return emit(verdict(ok, "FITS" if ok else "DOES NOT FIT",
                            {"scale": scale.name, "phases": [p.to_json() for p in results],
                             "recipe": job.user.source if job.user else None, "plan_error": job.plan_error,
                             "modelled": list(memory.modelled), "not_modelled": list(memory.unmodelled),
                             "not_in_verl": dropped, "verl": installed_verl()}))
    else:
        _print(scale.name, results, ok, memory, job, dropped)
    return 0 if ok else 1


def _print(scale: str, results: list[PhaseMemory], ok: bool, memory=None, job=None, dropped=()) -> None:
    from rich.markup import escape
    from rich.table import Table

    from harness.cli.output import console as output_console

    console = output_console()
    # One column per phase, one row per component: stays narrow with ten components.
    table = Table(title=f"memory per device, GiB: {scale}")
    table.add_column("component", no_wrap=True)  # names never fold at 80 columns (a CI log's width)
    for p in results:
        table.add_column(p.phase if p.stage is None else f"{p.phase} (stage {p.stage})", justify="right")
    for name in dict.fromkeys(k for p in results for k in p.components):
        table.add_row(name, *(f"{p.components[name]:.2f}" if name in p.components else "-" for p in results))
    table.add_row("[bold]peak[/]", *(f"[bold]{p.peak_gib:.2f}[/]" for p in results))
    table.add_row("usable", *(f"{p.budget_gib - p.headroom_gib:.2f}" for p in results))
    table.add_row("fits", *("[green]yes[/]" if p.fits else "[red]NO[/]" for p in results))
    console.print(table)
    for p in results:
        for note in p.notes:
            console.print(f"  {p.phase}: {escape(note)}")
    if job is not None and job.user is not None:
        modelled = ", ".join(memory.modelled) or "plan and batch only"
        console.print(f"recipe {escape(job.user.source)}: modelled {escape(modelled)}", soft_wrap=True)
        if job.plan_error:
            console.print(f"  the plan breaks {escape(job.plan_error)} (modelled as written)", soft_wrap=True)
    for item in (memory.unmodelled if memory else ()):
        console.print(f"  not modelled: {escape(item)}", soft_wrap=True)
    from harness.config.recipe import installed_verl

    for item in dropped:
        console.print(f"  dropped, not in verl {installed_verl()}'s config (launch refuses it): {escape(item)}",
                      soft_wrap=True)
    bad = [p for p in results if not p.fits]
    if ok:
        console.print(f"[bold green]PASS[/]: all {len(results)} phase(s) fit with headroom")
    else:
        refused = next((p for p in bad if p.refused), None)
        worst = max(bad, key=lambda p: p.peak_gib - p.budget_gib)
        why = (f"{refused.phase}: {refused.refused}" if refused else
               f"worst {worst.phase} {worst.peak_gib:.2f} GiB (largest component {worst.largest} "
               f"{worst.components[worst.largest]:.2f} GiB) vs {worst.budget_gib - worst.headroom_gib:.2f}")
        console.print(f"[bold red]FAIL[/]: {len(bad)} of {len(results)} phase(s) do not fit; {escape(why)}",
                      soft_wrap=True)


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli.args import whole

    p = sub.add_parser("memory", help="per-phase memory of a scale's device vs its budget (analytic model)")
    p.add_argument("--scale", help="scale name (see `scales`): the hardware profile and what the recipe leaves unset; "
                   "optional with --recipe (a launch script is planned as written, as `plan --recipe` does)")
    p.add_argument("--phase", choices=PHASES, help="only this phase (default: all)")
    p.add_argument("--gbs", type=whole(1), help="override the prompts per step (data.train_batch_size)")
    p.add_argument("--micro-batch", type=whole(1), help="override the micro batch per device (dynamic bsz packing)")
    p.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="rollout chunked (MLA) prefill on/off (default: the scale's)")
    p.add_argument("--json", action="store_true",
                   help="print JSON: `passed` (every phase fits) and `state`; each phase carries a boolean `fits`")
    add_job_arguments(p)
    p.set_defaults(func=run)
