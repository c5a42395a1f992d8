"""The user's own verl job, read (never executed) into Hydra overrides and environment.

A recipe is what an Ascend RL engineer already runs: a launch script (cann-recipes-train's `verl_patches/scripts`,
verl's `examples/`, seed 002's A3 script) with `export` lines, variables, line continuations and one
`python3 -m verl.trainer.main_ppo key=value ...` command, or a Hydra YAML of verl's config. `read_recipe` turns
either into a `UserRecipe`: the overrides exactly as `main_ppo` would receive them (after the shell's quoting and
expansion) and the exported environment. Nothing in the file is run: a command substitution `$(...)` is left as
written and named in `notes`, and so is a variable the script never sets. The script is read with bash's grammar
(tree-sitter-bash, harness.config.shell): nested and positional defaults, arrays, functions, `$((...))`.

Overrides given on the command line after `--` come last, as on `main_ppo`'s command line.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.config.shell import read_script
from harness.errors import BadInput
from harness.io import open_input
from harness.redact import one_line

ENTRY_PREFIX = "verl.trainer."  # main_ppo, or a fork's entry (cann-recipes-train runs main_ppo_npu)
_PYTHON = re.compile(r"(.*/)?python(\d+(\.\d+)?)?$")
# A recipe is a launch script or a YAML of a few kB; /dev/zero or a 1 GB file is refused before it is read whole
# (issue 36: `--recipe /dev/zero` was read until memory ran out).
MAX_RECIPE_BYTES = 1 << 20
# A Hydra YAML's flattened keys: verl's whole config has ~1,000; a 300-byte alias bomb (each level a list of the
# previous level 9 times) names 10^9, which walking the aliases would build (issue 36).
MAX_YAML_VALUES = 100_000
# A wrapper that runs a script that runs the verl job: cann-recipes-train nests one level; a loop of wrappers stops.
MAX_WRAPPER_DEPTH = 4
# Hydra's own options of a `@hydra.main` program (main_ppo): not overrides.
_HYDRA_OPTIONS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"}
# verl 0.9.1 ships these top configs (verl/trainer/config/); ppo_megatron_trainer is ppo_trainer with the Megatron
# engine group (see harness.config.recipe's module docstring).
_CONFIG_GROUPS = {"ppo_trainer": (), "ppo_megatron_trainer": ("model_engine=megatron",)}


@dataclass(frozen=True)
class UserRecipe:
    """The overrides and environment of a user's verl job, and what could not be read as the file says."""

    source: str  # the file, or "the command line"
    overrides: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    entrypoint: str | None = None  # the module the script runs (None: a YAML or command-line overrides only)
    notes: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()  # shell variables the script uses and never sets (left as ${NAME} for the job's shell)
    # every file the reader read, the recipe first and then each script a wrapper runs: what `launch` names, so a
    # script planted where a wrapper looks for its target is never run unseen (issue 48)
    files_read: tuple[str, ...] = ()

    def override_map(self) -> dict[str, str | None]:
        """Key (without +/++/~) -> value as written; None for a deletion (`~key`)."""
        return dict(split_override(o, self.source) for o in self.overrides)


def split_override(override: str, where: str = "override") -> tuple[str, str | None]:
    """`key=value` / `+key=value` / `++key=value` -> (key, value); `~key[=value]` -> (key, None)."""
    if override.startswith("~"):
        return override.lstrip("~").partition("=")[0], None
    key, sep, value = override.partition("=")
    key = key.lstrip("+")
    if not sep or not re.fullmatch(r"[\w\-@/]+(\.[\w\-@/]+)*", key):
        raise BadInput(f"{where}: '{one_line(override)}' is not a Hydra override (key=value, +key=value or ~key)")
    return key, value


def override_key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def parse_recipe_env(items: Sequence[str], option: str = "--recipe-env") -> dict[str, str]:
    """--recipe-env's NAME=VALUE items as the environment the launch script is started with; BadInput naming
    `option` for an item that is no shell assignment. The one parser of `plan`/`launch`/`run` and the pytest plugin."""
    env = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise BadInput(f"{option} {item!r}: NAME=VALUE expected (a shell variable name, then =)")
        env[name] = value
    return env


def read_recipe(path: str | None = None, overrides: Sequence[str] = (),
                env: Mapping[str, str] | None = None) -> UserRecipe | None:
    """The user's job from `--recipe FILE` (a script started with `env`, --recipe-env) and/or overrides after `--`;
    None when neither is given."""
    if path is None and not overrides:
        return None
    recipe = UserRecipe(source="the command line")
    if path is not None:
        text = _read_bounded(path)
        recipe = parse_hydra_yaml(text, str(path)) if Path(path).suffix in (".yaml", ".yml") else \
            parse_launch_script(text, str(path), env)
    for override in overrides:
        split_override(override, "overrides after --")
    return dataclasses.replace(recipe, overrides=recipe.overrides + tuple(overrides),
                               files_read=recipe.files_read or ((str(path),) if path is not None else ()))


def _read_bounded(path: str) -> str:
    """The recipe's text: a regular file (a FIFO would block, a device never end: harness.io.open_input refuses
    both before a byte is read) of at most MAX_RECIPE_BYTES."""
    try:
        with open_input(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw = f.read(MAX_RECIPE_BYTES + 1)
    except BadInput as exc:
        raise BadInput(f"--recipe {exc}") from None
    except OSError as exc:
        raise BadInput(f"--recipe {path}: cannot read it ({type(exc).__name__}: {exc.strerror or exc})") from None
    except ValueError:  # os.open: "embedded null byte"
        raise BadInput(f"--recipe {path!r}: not a file path (it holds a NUL byte)") from None
    if max(size, len(raw)) > MAX_RECIPE_BYTES:
        raise BadInput(f"--recipe {path}: more than {MAX_RECIPE_BYTES >> 20} MiB; a launch script or Hydra YAML is a "
                       "few kB: is it the right file?")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadInput(f"--recipe {path}: not UTF-8 text (byte {exc.start}); is it the right file?") from None


# ---------------------------------------------------------------------------------------------------- Hydra YAML

def parse_hydra_yaml(text: str, source: str = "recipe.yaml") -> UserRecipe:
    """A Hydra YAML of verl's config (nested keys) as the flat overrides that set the same values."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"--recipe {source}: not YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:  # 5000 nested `[` or mappings: PyYAML's composer recurses per level
        raise BadInput(f"--recipe {source}: nested too deeply to be a Hydra config") from None
    except ValueError as exc:  # an integer of more than 4300 digits (Python's int() limit, in PyYAML's constructor)
        raise BadInput(f"--recipe {source}: a value no config takes ({str(exc).split(';')[0][:80]})") from None
    if not isinstance(doc, dict):
        raise BadInput(f"--recipe {source}: a Hydra config is a mapping of verl's config keys, got "
                       f"{type(doc).__name__}")
    notes = []
    for skipped in ("defaults", "hydra"):
        if doc.pop(skipped, None) is not None:
            notes.append(f"{source}: its `{skipped}:` section is not applied (the overrides compose in verl's own "
                         "ppo_trainer config)")
    out: list[str] = []
    try:
        _flatten("", doc, out, source)
    except RecursionError:
        raise BadInput(f"--recipe {source}: nested too deeply to be a Hydra config") from None
    except ValueError as exc:  # 0xfff... of 5000 digits: an int Python will not print back (repr's 4300 limit)
        raise BadInput(f"--recipe {source}: a value no config takes ({str(exc).split(';')[0][:80]})") from None
    return UserRecipe(source=source, overrides=tuple(out), notes=tuple(notes))


def _flatten(prefix: str, node, out: list[str], source: str, budget: list[int] | None = None) -> None:
    budget = budget if budget is not None else [MAX_YAML_VALUES]
    if isinstance(node, dict) and node:
        for key, value in node.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), value, out, source, budget)
    else:
        out.append(f"{prefix}={_yaml_value(node, budget, source)}")


def _spend(budget: list[int], source: str, n: int = 1) -> None:
    budget[0] -= n
    if budget[0] < 0:
        raise BadInput(f"--recipe {source}: more than {MAX_YAML_VALUES} values once its aliases are expanded (a YAML "
                       "alias bomb?); verl's whole config has about a thousand")


def _yaml_value(value, budget: list[int], source: str) -> str:
    _spend(budget, source)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_yaml_value(v, budget, source) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_yaml_value(v, budget, source)}" for k, v in value.items()) + "}"
    text = str(value)
    # Hydra's grammar: a plain word, an interpolation, or a quoted string
    if re.fullmatch(r"[\w./\-:]+", text) or re.fullmatch(r"\$\{[^}]*\}", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ---------------------------------------------------------------------------------------------------- launch script

def _is_entry(module: str) -> bool:
    """A verl job's main module: verl's trainer (`verl.trainer.main_ppo`, a fork's `main_ppo_npu`, the fully-async
    `verl.experimental.fully_async_policy.fully_async_main`) or a recipe's main (verl-recipe's
    `recipe.dapo.main_dapo`, `recipe.r1_ascend.main_ppo`, `recipe.async_flow.grpo_main`, `recipe.spo.spo_main_ppo`).
    A bare `main_gkd` run from a recipe's own directory is not: nothing says it is verl's."""
    if module.startswith(ENTRY_PREFIX):
        return not _NOT_RL.search(module[len(ENTRY_PREFIX):])
    parts = module.split(".")
    return len(parts) >= 2 and parts[0] in ("recipe", "verl_recipe", "verl") and "main" in parts[-1]


def parse_launch_script(text: str, source: str = "launch.sh", env: Mapping[str, str] | None = None, *,
                        args: Sequence[str] = (), chain: tuple[Path, ...] = ()) -> UserRecipe:
    """The `python3 -m verl.trainer.main_ppo ...` (or a recipe's main) command of a bash launch script: its
    overrides, and the environment the script exports (plus `NAME=value` prefixes of that command). The script is
    read with bash's grammar and never run (harness.config.shell). A wrapper with no verl command of its own that
    runs `bash other.sh` is followed into that script with the environment it exports, as bash passes it on
    (cann-recipes-train's train_deepseekv3_256die_*.sh export VLLM_DP_SIZE and run internal/train_grpo_*.sh), and
    with the arguments it passes; `chain` is the wrappers read so far (a cycle or a nest deeper than
    MAX_WRAPPER_DEPTH is refused as such)."""
    read = read_script(text, source, dict(env or {}), list(args))
    notes = list(read.notes)
    chain = (*chain, Path(source).resolve())
    mains = [c for c in read.commands if _entry_index(c.words) is not None]
    if not mains:
        if read.scripts_called:
            called, *called_args = read.scripts_called[0]
            file = _called_file(source, called, chain)
            inner = parse_launch_script(_read_bounded(str(file)), _shown(file), read.exported, chain=chain,
                                        args=called_args)
            note = (f"{source}: no verl command of its own; it runs {one_line(' '.join(read.scripts_called[0]))}, "
                    f"read as {_shown(file)} with the {len(read.exported)} variable(s) it exports")
            return dataclasses.replace(inner, source=source, notes=(*notes, note, *inner.notes),
                                       files_read=(source, *inner.files_read))
        runs = sorted({f"{_runs_module(c.words, i)} -m {c.words[i + 1]}" for c in read.commands
                       for i in range(1, len(c.words) - 1) if c.words[i] == "-m" and _runs_module(c.words, i)})
        files = sorted({f"{w} {c.words[i + 1]}" for c in read.commands for i, w in enumerate(c.words[:-1])
                        if _PYTHON.fullmatch(w) and c.words[i + 1].endswith(".py")})
        other = ""
        if files and not runs:  # verl's split_placement example: `python3 main_ppo_split.py` (issue 44: true cause)
            other = (f"; it runs `{one_line(files[0])}`, a script file rather than a module: the harness reads the "
                     "jobs verl runs as `python3 -m MODULE`")
        kind = next((k for word, k in _JOB_KINDS if runs and word in runs[0].rsplit(" ", 1)[-1].lower()), None)
        if kind:  # the true cause by name (issue 44: a generation job was refused as one that "names no model")
            other = f"; it runs `{one_line(runs[0])}`: {kind}, not an RL job the harness plans"
        elif runs:
            other = (f"; it runs `{one_line(runs[0])}`, which is neither verl's trainer nor a recipe's main (a "
                     "distillation, SFT or generation trainer, or a tool, is not a job the harness plans)")
        raise BadInput(f"--recipe {source}: no `python3 -m verl.trainer.main_ppo ...` (or a recipe's "
                       f"`python3 -m recipe.<name>.main_...`) command in it{other}")
    if len(mains) > 1:
        raise BadInput(f"--recipe {source}: {len(mains)} verl commands (lines {', '.join(str(m.line) for m in mains)});"
                       " keep the one to plan in its own file")
    main = mains[0]
    words = main.words
    at = _entry_index(words)
    entrypoint = words[at + 1]
    overrides: list[str] = []
    args = iter(words[at + 2:])
    for word in args:
        name, eq, value = word.partition("=")
        if name in _HYDRA_OPTIONS:
            value = value if eq else next(args, "")
            if name in ("--config-name", "-cn"):
                config = Path(value).name.removesuffix(".yaml")
                if config in _CONFIG_GROUPS:
                    overrides.extend(_CONFIG_GROUPS[config])
                elif config.endswith(("megatron_trainer", "mindspeed_trainer")):
                    # a recipe's own Megatron config (verl-recipe dapo/config/dapo_megatron_trainer.yaml composes
                    # ppo_megatron_trainer; cann-recipes-train's ppo_mindspeed_trainer.yaml sets strategy: megatron
                    # for actor, ref and critic): the Megatron engine group; its own keys are not read
                    overrides.append("model_engine=megatron")
                    notes.append(f"{source}:{main.line}: --config-name {value}: a recipe's Megatron config; "
                                 "composed as ppo_megatron_trainer (its own settings are not read)")
                else:
                    notes.append(f"{source}:{main.line}: --config-name {value}: not a config verl ships "
                                 "(ppo_trainer, ppo_megatron_trainer); the overrides compose in ppo_trainer")
            continue
        if word.startswith("-"):
            notes.append(f"{source}:{main.line}: {word}: an option, not a Hydra override; not passed on")
            continue
        if not eq and not word.startswith("~"):
            notes.append(f"{source}:{main.line}: {word!r}: not key=value; not passed on")
            continue
        overrides.append(word)
    for override in overrides:
        split_override(override, f"--recipe {source}:{main.line}")
    env = {**read.exported, **main.prefix}
    return UserRecipe(source=source, overrides=tuple(overrides), env=env, entrypoint=entrypoint,
                      notes=tuple(notes), unset=tuple(read.unset), files_read=(source,))


def _called_file(source: str, called: str, chain: tuple[Path, ...]) -> Path:
    """The script a wrapper (`source`, the last of `chain`) runs by `bash CALLED`, found as bash finds it: a relative
    path in the working directory, then beside the wrapper (where `bash "$(dirname "$0")/x.sh"` points), and
    nowhere else. It walked every ancestor up to `/` (issue 48: a `scripts/train.sh` planted in a shared parent
    became the job). BadInput, naming the cause, for a target found nowhere, one reached through a link that leaves
    the job's tree (the working directory and the recipe's own directory), a cycle, or a nest deeper than
    MAX_WRAPPER_DEPTH."""
    shown = one_line(called)
    if "$" in called or Path(called).is_absolute():
        raise BadInput(f"--recipe {source}: it runs {shown}, a path of the machine that runs the job (not read "
                       "here): pass that file to --recipe")
    cwd, beside = Path.cwd(), Path(source).resolve().parent
    roots = (cwd.resolve(), chain[0].parent)
    candidate = next((base / called for base in (cwd, beside) if (base / called).is_file()), None)
    if candidate is None:
        raise BadInput(f"--recipe {source}: it runs {shown}, found neither in the working directory ({cwd}) nor "
                       f"beside it ({beside}); run from the directory bash runs it from, or pass that file to "
                       "--recipe")
    real = candidate.resolve()
    if not any(real.is_relative_to(root) for root in roots):
        raise BadInput(f"--recipe {source}: it runs {shown}, which resolves to {real}, outside the job's tree "
                       f"({' and '.join(dict.fromkeys(map(str, roots)))}); a link out of it is not followed: pass "
                       "that file to --recipe")
    names = " runs ".join(_shown(f) for f in (*chain, real))
    if real in chain:
        raise BadInput(f"--recipe {source}: a wrapper cycle ({names}); bash would never reach a verl command")
    if len(chain) > MAX_WRAPPER_DEPTH:
        raise BadInput(f"--recipe {source}: wrappers nest more than {MAX_WRAPPER_DEPTH} deep ({names}); pass the "
                       "script with the verl command to --recipe")
    return candidate


def _shown(file: Path) -> str:
    """A path as the user would type it: relative to the working directory when it is below it."""
    try:
        return str(file.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(file)


# What runs a module (`X -m MODULE`): python, torchrun (issue 44: verl's SFT and some RL examples), or an
# interpreter the script leaves to its caller (`$PYTHON -m`, kept as `${PYTHON}` when the script never sets it).
_LAUNCHER = re.compile(r"(.*/)?torchrun$")
_UNSET_INTERPRETER = re.compile(r"\$\{\w+\}$")
# verl.trainer modules that are not an RL job (issue 44: refused for the true cause, not "names no model")
_NOT_RL = re.compile(r"sft|generation|eval")
_JOB_KINDS = (("sft", "an SFT job"), ("generation", "a generation job"), ("eval", "an evaluation job"),
              ("distill", "a distillation job"))


def _runs_module(words: list[str], i: int) -> str | None:
    """The interpreter whose `-m` words[i] is: `python [-u ...] -m` (possibly behind a launcher such as
    `ray job submit ... --` or `uv run ...`), `torchrun [options] -m`, `${PYTHON} -m`; None for another `-m`."""
    j = i - 1
    while j > 0 and re.fullmatch(r"-[uBOsSEIX]+", words[j]):  # python's own flags before -m
        j -= 1
    if _PYTHON.fullmatch(words[j]) or _UNSET_INTERPRETER.fullmatch(words[j]):
        return words[j]
    return next((w for w in words[:i] if _LAUNCHER.fullmatch(w)), None)


def _entry_index(words: list[str]) -> int | None:
    """Index of `-m` in the command that runs a verl job's entry module (_runs_module, _is_entry)."""
    for i in range(1, len(words) - 1):
        if words[i] == "-m" and _is_entry(words[i + 1]) and _runs_module(words, i):
            return i
    return None
