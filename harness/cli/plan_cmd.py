"""`ascend-rl-harness scales` and `ascend-rl-harness plan`: what each scale brings up."""
from __future__ import annotations

import argparse

from harness.cli.args import add_job_arguments
from harness.cli.output import emit, verdict
from harness.config.scales import SCALES, plural


def scale_rows() -> list[dict]:
    """One row per registered scale: what `scales` shows (and `scales --json` prints)."""
    rows = []
    for s in SCALES.values():
        t, r = s.plan.train, s.plan.rollout
        rows.append({"scale": s.name, "tier": s.tier, "model": s.model.name, "runs_on": s.runs_on,
                     "sharded_as": s.sharded_as, "hardware": s.hardware.name, "devices": s.devices, "cards": s.cards,
                     "nodes": s.nodes, "train": f"TP{t.tp} PP{t.pp} EP{t.ep}",
                     "rollout": f"TP{r.tp} DP{r.dp} EP{r.ep}", "gbs": s.batch.gbs, "n": s.batch.n,
                     "max_prompt_length": s.batch.max_prompt_length,
                     "max_response_length": s.batch.max_response_length, "description": s.description})
    return rows


def cmd_scales(args: argparse.Namespace) -> int:
    from rich import box
    from rich.table import Table

    from harness.cli.output import NARROW, console

    rows = scale_rows()
    if args.json:
        return emit(verdict(True, "LISTED", {"scales": rows}))
    out = console()
    if out.width < NARROW:  # a table of 7 columns at 80 folds every cell over 5 lines: one line per scale instead
        for row in rows:
            out.print(f"[bold]{row['scale']}[/] ({row['tier']}): {row['model']} on {row['runs_on']}; plan "
                      f"{row['sharded_as']}: train {row['train']}, rollout {row['rollout']}; GBS {row['gbs']} x "
                      f"{row['n']}, {row['max_prompt_length']}/{row['max_response_length']} tokens")
        return 0
    table = Table(title="ascend-rl-harness scales", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("scale", "tier", "model", "runs on", "plan sharded as", "train / rollout", "GBS x n, tokens"):
        # the name is what users copy into --scale: never wrap or truncate it
        table.add_column(col, no_wrap=col in ("scale", "tier"), overflow="fold")
    for row in rows:
        table.add_row(row["scale"], row["tier"], row["model"], row["runs_on"], row["sharded_as"],
                      f"{row['train']} / {row['rollout']}",
                      f"{row['gbs']} x {row['n']}, {row['max_prompt_length']}/{row['max_response_length']}")
    out.print(table)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from harness.cli.args import job_from_args
    from harness.cli.output import console as output_console
    from harness.config import recipe as recipes
    from harness.config.recipe import VERL_VERSION, check_recipe, installed_verl
    from harness.errors import PlanError
    from harness.redact import redact, redact_doc

    job = job_from_args(args)
    scale, recipe = job.scale, job.recipe
    if args.strict and job.ignored:
        from harness.errors import BadInput

        raise BadInput(f"--strict: {job.user.source}: verl {recipes.verl_release()}'s main_ppo ignores "
                       f"{len(job.ignored)} key(s): {'; '.join(job.ignored)}")
    if job.plan_error and args.format == "verl-cli":
        # no runnable command line exists for a plan megatron-core cannot run
        raise PlanError(f"{job.user.source if job.user else scale.name}: {job.plan_error}")
    doc = recipes.plan_document(scale, recipe=recipe)
    # Only a command line someone will run depends on verl accepting it; composing in verl's schema imports verl
    # (~20 s on this CPU), so the plan itself answers at once unless asked (plan used to take ~20 s).
    validate = (args.format == "verl-cli" or args.verl is not None) if args.validate is None else args.validate
    installed = installed_verl(missing_ok=True)
    verl = args.verl or installed or VERL_VERSION  # the verl the verdict names: the installed one unless --verl
    if validate:
        # Progress on stderr: stdout carries the JSON / command line.
        with output_console(stderr=True).status(f"validating the {scale.name} overrides in verl {verl}'s config"):
            if args.verl and args.verl not in (installed, (installed or "").split("+")[0]):  # 0.9.1+ascend is 0.9.1
                recipes.validate_against(recipe, args.verl)  # that verl's shipped schema, fetched once and cached
            else:
                check_recipe(recipe)  # RecipeError is a BadInput: one line naming the key, exit 2 (cached)
    doc["validated_against_verl"] = verl if validate else None
    section, judged = _recipe_section(job)
    doc.update(section)
    doc["prediction"] = _prediction_section(scale, recipe.overrides, judged.memory.options)
    # One verdict: a plan whose memory does not fit is not valid (`plan` said "plan valid" while `memory` exited 1
    # on the same input).
    valid = doc["valid"]
    # a recipe's exports can hold a token or a password: what plan prints goes through harness.redact (a CI log
    # or a pasted plan once carried HF_TOKEN in clear)
    doc = redact_doc(doc)
    if args.format == "json":  # `passed`: the plan holds (a user's recipe can break a rule: exit 1, plan_error says)
        return emit(verdict(valid, ("VALIDATED" if validate else "VALID") if valid else "INVALID", doc))
    elif args.format == "verl-cli":
        print(redact(recipe.command_line()))
        if not valid:  # `plan --format verl-cli > job.sh` exited 1 with nothing on stderr (issue 44)
            output_console(stderr=True).print(f"PLAN INVALID: {redact(doc['invalid'])}", markup=False,
                                              soft_wrap=True)
    else:
        _print_plan(job, doc, validate, explain=args.explain, verl=verl)
    return 0 if valid else 1


def _recipe_section(job):
    """What `plan` adds for a user's recipe: what it read, its notes, the plan rule it breaks and the memory verdict
    of the analytic model on the job as it will run (harness.memory.job_options.judge: the verdict `memory` and
    `launch` give); with the verdict itself."""
    from harness.memory.job_options import judge

    judged = judge(job)
    memory = judged.memory
    verdict = ({"fits": None, "error": judged.error} if judged.error else
               {"fits": judged.fits, "phases": [p.to_json() for p in judged.phases]})
    invalid = judged.invalid(job)
    out = {"valid": invalid is None, "invalid": invalid, "plan_error": job.plan_error,
           "memory": {**verdict, "modelled": list(memory.modelled), "not_modelled": list(memory.unmodelled)}}
    if job.user is None:
        return out, judged
    out["recipe"] = {"source": job.user.source, "entrypoint": job.recipe.entrypoint, "read": list(job.read),
                     "notes": list(job.notes), "user_overrides": list(job.user.overrides),
                     "user_env": dict(job.user.env), "engine": job.engine, "warnings": list(job.warnings),
                     "unset_shell_variables": list(job.user.unset),
                     # each final key and where it came from, as Hydra's --cfg job shows the composed job
                     "origins": {k: job.origins.get(k, "harness") for k in job.recipe.override_map()}}
    return out, judged


def _prediction_section(scale, overrides=(), memory=None) -> dict:
    """Step time, TPS/card and seconds per phase the phase model (harness.perf) predicts for the plan as its verl
    overrides run it (bypass mode skips old_log_prob) and with seed 002's patches, plus the what-if sweep;
    `predicted: false` and why where it has no model (CPU hardware)."""
    from harness.errors import BadInput
    from harness.perf.model import TRUST, features_from_overrides, predict
    from harness.perf.published import SEED002_FEATURES
    from harness.perf.whatif import what_if

    features = features_from_overrides(overrides)
    try:
        stock = predict(scale, features=features, memory=memory)
    except BadInput as exc:
        return {"predicted": False, "reason": str(exc)}
    patched = predict(scale, features=SEED002_FEATURES, memory=memory)
    return {"predicted": True, **stock.to_json(), "with_seed002_patches": {
        "features": patched.to_json()["features"], "step_s": patched.step_s, "tps_per_card": patched.tps_per_card},
        "what_if": what_if(scale, features, memory), "trust": TRUST}


def _print_prediction(console, prediction: dict, explain: bool = False) -> None:
    if not prediction["predicted"]:
        console.print(f"prediction: none ({prediction['reason']})", markup=False, soft_wrap=True)
        return
    w, patched = prediction["workload"], prediction["with_seed002_patches"]
    console.print(f"predicted: step {prediction['step_s']:.0f} s, {prediction['tps_per_card']:.1f} TPS/card (as its "
                  f"overrides run; with seed 002's patches {patched['tps_per_card']:.1f}); workload "
                  f"{w['mean_prompt']:.0f}/{w['mean_response']:.0f} tokens, {w['source']}", markup=False,
                  soft_wrap=True)
    console.print("  " + ", ".join(f"{p['name']} {p['seconds']:.1f} s" for p in prediction["phases"]), markup=False,
                  soft_wrap=True)
    if not explain:
        return
    from rich import box
    from rich.table import Table

    # the sweep as a table, one knob a row (issue 47: it was one 300-character line)
    wi = prediction["what_if"]
    table = Table(title=f"what-if: {wi['moves_tps_most']} moves TPS/card most (--json lists each variant)",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("knob", "range", "best value", "TPS/card"):
        table.add_column(col, justify="left" if col == "knob" else "right", no_wrap=True)
    for knob, v in wi["knobs"].items():
        if v["best_value"] is not None:
            table.add_row(knob, f"{v['span']:.0%}", str(v["best_value"]), f"{v['best_tps_per_card']:.1f}")
    console.print(table)
    console.print(f"trust: {prediction['trust']}", markup=False)


def _print_plan(job, doc: dict, validate: bool, explain: bool = False, verl: str | None = None) -> None:
    """The plan on one screen: the job, its verdicts and the prediction; `explain` adds every override with its
    origin, the what-if sweep and how far to trust the prediction (issue 47: plan printed 78-116 lines)."""
    from rich.markup import escape

    from harness.cli.output import console as output_console
    from harness.config.recipe import verl_release
    from harness.redact import one_line

    scale = job.scale
    console = output_console()
    t, r = scale.plan.train, scale.plan.rollout
    console.print(f"[bold]{scale.name}[/] ({scale.tier}): {scale.description}")
    if job.user is not None:
        role = (f"planned as its own job ({job.engine}); the scale {scale.name} gives the hardware and what it leaves "
                "unset (each key's origin below)" if job.user.entrypoint else "its settings win over the scale's")
        console.print(f"recipe {escape(job.user.source)}: {len(job.user.overrides)} override(s), "
                      f"{len(job.user.env)} environment variable(s); {role}")
        for note in job.notes:  # one line each: a newline in a script's value printed fake verdict lines
            console.print(f"  note: {one_line(note, 400)}", markup=False, soft_wrap=True)
    console.print(f"model {scale.model.name}: {scale.model.num_hidden_layers} layers, "
                  f"{scale.model.total_params() / 1e9:.1f}B params "
                  f"({scale.model.total_params(active=True) / 1e9:.1f}B active)")
    console.print(f"hardware {scale.hardware.name}: {plural(scale.devices, 'device')} = "
                  f"{plural(scale.cards, 'card')} on {plural(scale.nodes, 'node')}")
    recompute = (f"recompute {t.recompute.method} {t.recompute.num_layers}" if t.recompute else "no recompute")
    console.print(f"train TP{t.tp} PP{t.pp} EP{t.ep} ETP{t.etp} CP{t.cp} DP{t.dp(scale.devices)} "
                  f"stage layers {list(t.stage_layers) or 'uniform'}, {recompute}; rollout TP{r.tp} DP{r.dp} EP{r.ep}")
    b = scale.batch
    console.print(f"batch GBS {b.gbs} x n {b.n}, prompt/response {b.max_prompt_length}/{b.max_response_length}, "
                  f"micro batch {b.micro_batch_size_per_device}")
    # overrides are copied into shells: no rich markup ([console,file]) and no wrapping at 80 columns
    console.print(f"entrypoint: python3 -m {doc['entrypoint']} with {plural(len(doc['overrides']), 'override')} and "
                  f"{plural(len(doc['env']), 'environment variable')}"
                  + ("" if explain else " (--explain lists them; --format verl-cli prints the command)"),
                  markup=False, soft_wrap=True)
    origins = doc.get("recipe", {}).get("origins", {})
    for key, value in doc["env"].items() if explain else ():  # masked already (redact_doc); one line whatever it holds
        console.print(f"  env {key}={one_line(value, 400)}", markup=False, soft_wrap=True)
    for override in doc["overrides"] if explain else ():  # with its origin, as Hydra's --cfg job (still copyable)
        origin = origins.get(override.lstrip("+~").partition("=")[0])
        console.print(f"  {override}" + (f"  # {origin}" if origin else ""), markup=False, soft_wrap=True)
    for warning in doc.get("recipe", {}).get("warnings", []):
        console.print(f"warning: {warning}", markup=False, soft_wrap=True)
    if doc.get("router_replay"):
        blocked = {k: v for k, v in doc["router_replay"]["blocked_on"].items() if v}
        console.print("router replay (R3) off: " + ("; ".join(f"{k}: {len(v)} blocker(s)" for k, v in
                                                               blocked.items()) + " (plan --json names them)"
                                                     if blocked else "nothing known blocks it"), soft_wrap=True)
    memory = doc.get("memory")
    if memory is not None:
        if memory["fits"] is None:
            console.print(f"memory: not modelled ({memory['error']})", markup=False)
        else:
            bad = [p for p in memory["phases"] if not p["fits"]]
            head = "every phase fits" if not bad else f"{len(bad)} of {len(memory['phases'])} phase(s) do not fit: " + \
                ", ".join(f"{p['phase']} " + (p["refused"] or f"{p['peak_gib']:.1f} GiB") for p in bad)
            console.print(f"memory: {head} (per device, budget {memory['phases'][0]['budget_gib']:g} GiB; "
                          "`memory` with the same arguments shows each component)", markup=False, soft_wrap=True)
        for item in memory["not_modelled"]:
            console.print(f"  memory does not model: {item}", markup=False, soft_wrap=True)
    _print_prediction(console, doc["prediction"], explain)
    verl = verl or verl_release()
    checked = (f"verl {verl} accepts the overrides" if validate else
               f"overrides not checked against verl {verl}'s schema (--validate does, ~20 s)")
    if job.plan_error:
        console.print(f"[bold red]PLAN INVALID[/]: {escape(job.plan_error)}; {checked}", soft_wrap=True)
    elif not doc["valid"]:
        console.print(f"[bold red]PLAN INVALID[/]: {escape(doc['invalid'])} (`memory` shows each component); "
                      f"{checked}", soft_wrap=True)
    else:
        console.print(f"[green]plan valid[/]; {checked}", soft_wrap=True)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scales", help="list the registered scales")
    p.add_argument("--json", action="store_true", help="print JSON: `passed`, `state` and one object per scale")
    p.set_defaults(func=cmd_scales)
    p = sub.add_parser("plan", help="model, parallel plan, DAPO overrides and env for a scale")
    p.add_argument("--scale", help="scale name (see `scales`): the hardware profile and what the recipe leaves unset; "
                   "optional with --recipe (the recipe's model, world, engine and algorithm are planned)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json", help="print JSON")
    fmt.add_argument("--format", dest="format", choices=("text", "json", "verl-cli"),
                     help="verl-cli prints a runnable verl command line")
    add_job_arguments(p)
    p.add_argument("--verl", metavar="VERSION",
                   help="validate against that verl release's shipped config schema (fetched from the package index "
                        "once, cached; implies --validate); default: the installed verl")
    p.add_argument("--strict", action="store_true",
                   help="refuse (exit 2) a recipe with keys verl's trainer composes and then ignores (legacy "
                        "reward_model.*, custom_reward_function.*); default: a note")
    p.add_argument("--explain", action="store_true",
                   help="also list every override with its origin, the what-if sweep (a table) and how far to trust "
                        "the prediction (default: one screen: the plan, its verdicts, the prediction)")
    p.add_argument("--validate", action=argparse.BooleanOptionalAction, default=None,
                   help="compose the overrides in the installed verl's config and run verl's checks (imports verl, "
                        "~20 s); default: only for --format verl-cli, the command line you would run")
    p.set_defaults(func=cmd_plan, format="text")
