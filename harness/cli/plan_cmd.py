"""`ascend-rl-harness scales` and `ascend-rl-harness plan`: what each scale brings up."""
from __future__ import annotations

import argparse
import sys

from harness.cli.args import scale_arg
from harness.config.scales import SCALES
from harness.numeric import json_text


def cmd_scales(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ascend-rl-harness scales")
    for col in ("scale", "tier", "model", "hardware", "devices", "cards", "train TPxPPxEP", "rollout TPxDPxEP",
                "GBS x n", "prompt/response"):
        # the name is what users copy into --scale: never wrap or truncate it (CI logs are 80 columns)
        table.add_column(col, no_wrap=col == "scale")
    for s in SCALES.values():
        t, r = s.plan.train, s.plan.rollout
        table.add_row(s.name, s.tier, s.model.name, s.hardware.name, str(s.devices), str(s.cards),
                      f"{t.tp}x{t.pp}x{t.ep}", f"{r.tp}x{r.dp}x{r.ep}", f"{s.batch.gbs}x{s.batch.n}",
                      f"{s.batch.max_prompt_length}/{s.batch.max_response_length}")
    # rich assumes 80 columns when stdout is not a terminal (CI logs, pipes) and would truncate every cell
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harness.config import recipe as recipes
    from harness.config.recipe import VERL_VERSION, validate_recipe

    scale = scale_arg(args.scale)
    doc = recipes.plan_document(scale, model_path=args.model_path, data_dir=args.data_dir)
    recipe = recipes.dapo_recipe(scale, model_path=args.model_path, data_dir=args.data_dir)
    # Only a command line someone will run depends on verl accepting it; composing in verl's schema imports verl
    # (~20 s on this CPU), so the plan itself answers at once unless asked (issue 15: plan took ~20 s).
    validate = args.format == "verl-cli" if args.validate is None else args.validate
    if validate:
        # Progress on stderr: stdout carries the JSON / command line.
        with Console(stderr=True).status(f"validating the {scale.name} overrides in verl {VERL_VERSION}'s config"):
            validate_recipe(recipe)  # RecipeError is a BadInput: one line naming the key, exit 2
    doc["validated_against_verl"] = VERL_VERSION if validate else None
    if args.format == "json":
        print(json_text(doc))
    elif args.format == "verl-cli":
        print(recipe.command_line())
    else:
        console = Console()
        t, r = scale.plan.train, scale.plan.rollout
        console.print(f"[bold]{scale.name}[/] ({scale.tier}): {scale.description}")
        console.print(f"model {scale.model.name}: {scale.model.num_hidden_layers} layers, "
                      f"{scale.model.total_params() / 1e9:.1f}B params "
                      f"({scale.model.total_params(active=True) / 1e9:.1f}B active)")
        console.print(f"hardware {scale.hardware.name}: {scale.devices} devices = {scale.cards} cards on "
                      f"{scale.nodes} nodes")
        console.print(f"train TP{t.tp} PP{t.pp} EP{t.ep} ETP{t.etp} CP{t.cp} DP{t.dp(scale.devices)} "
                      f"stage layers {list(t.stage_layers) or 'uniform'}; rollout TP{r.tp} DP{r.dp} EP{r.ep}")
        # overrides are copied into shells: no rich markup ([console,file]) and no wrapping at 80 columns
        console.print(f"entrypoint: python3 -m {doc['entrypoint']}", markup=False, soft_wrap=True)
        for key, value in doc["env"].items():
            console.print(f"  env {key}={value}", markup=False, soft_wrap=True)
        for override in doc["overrides"]:
            console.print(f"  {override}", markup=False, soft_wrap=True)
        if doc["router_replay"]:
            blocked = {k: v for k, v in doc["router_replay"]["blocked_on"].items() if v}
            console.print("router replay (R3) off: " + ("; ".join(f"{k}: {len(v)} blocker(s)" for k, v in
                                                                   blocked.items()) + " (plan --json names them)"
                                                         if blocked else "nothing known blocks it"), soft_wrap=True)
        verdict = (f"verl {VERL_VERSION} accepts the overrides" if validate else
                   f"overrides not checked against verl {VERL_VERSION}'s schema (--validate does, ~20 s)")
        console.print(f"[green]plan valid[/]; {verdict}", soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scales", help="list the registered scales")
    p.set_defaults(func=cmd_scales)
    p = sub.add_parser("plan", help="model, parallel plan, DAPO overrides and env for a scale")
    p.add_argument("--scale", required=True, help="scale name (see `scales`)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json", help="print JSON")
    fmt.add_argument("--format", dest="format", choices=("text", "json", "verl-cli"),
                     help="verl-cli prints a runnable verl command line")
    p.add_argument("--model-path", default=None, help="HF model directory written into the overrides "
                   "(default models/<model name>)")
    p.add_argument("--data-dir", default=None, help="directory with train.parquet and test.parquet (default data/dapo)")
    p.add_argument("--validate", action=argparse.BooleanOptionalAction, default=None,
                   help="compose the overrides in the installed verl's config and run verl's checks (imports verl, "
                        "~20 s); default: only for --format verl-cli, the command line you would run")
    p.set_defaults(func=cmd_plan, format="text")
