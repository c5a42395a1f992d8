"""The user's own verl job, read (never executed) into Hydra overrides and environment.

A recipe is what an Ascend RL engineer already runs: a launch script (cann-recipes-train's `verl_patches/scripts`,
verl's `examples/`, seed 002's A3 script) with `export` lines, variables, line continuations and one
`python3 -m verl.trainer.main_ppo key=value ...` command, or a Hydra YAML of verl's config. `read_recipe` turns
either into a `UserRecipe`: the overrides exactly as `main_ppo` would receive them (after the shell's quoting and
expansion) and the exported environment. Nothing in the file is run: a command substitution `$(...)` is left as
written and named in `notes`, and so is a variable the script never sets. Arithmetic `$((1024 * 2))`, which verl's
own example scripts use for lengths, is evaluated by a small integer evaluator (no eval).

Overrides given on the command line after `--` come last, as on `main_ppo`'s command line.
"""
from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import BadInput

ENTRY_PREFIX = "verl.trainer."  # main_ppo, or a fork's entry (cann-recipes-train runs main_ppo_npu)
_PYTHON = re.compile(r"(.*/)?python(\d+(\.\d+)?)?$")
_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGNMENT = re.compile(r"([A-Za-z_]\w*)=(.*)", re.S)
# Words that open or close shell control structures; the command follows them on the same line.
_RESERVED = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "{", "}", "!", "time"}
_DECLARE = {"export", "local", "readonly", "declare", "typeset"}
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
        raise BadInput(f"{where}: {override!r} is not a Hydra override (key=value, +key=value or ~key)")
    return key, value


def override_key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def read_recipe(path: str | None = None, overrides: Sequence[str] = ()) -> UserRecipe | None:
    """The user's job from `--recipe FILE` and/or overrides after `--`; None when neither is given."""
    if path is None and not overrides:
        return None
    recipe = UserRecipe(source="the command line")
    if path is not None:
        file = Path(path)
        try:
            text = file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"--recipe {path}: cannot read it ({type(exc).__name__}: {exc})") from None
        parse = parse_hydra_yaml if file.suffix in (".yaml", ".yml") else parse_launch_script
        recipe = parse(text, str(path))
    for override in overrides:
        split_override(override, "overrides after --")
    return UserRecipe(source=recipe.source, overrides=recipe.overrides + tuple(overrides), env=recipe.env,
                      entrypoint=recipe.entrypoint, notes=recipe.notes)


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


def _flatten(prefix: str, node, out: list[str], source: str) -> None:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), value, out, source)
    else:
        out.append(f"{prefix}={_yaml_value(node)}")


def _yaml_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_yaml_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    # Hydra's grammar: a plain word, an interpolation, or a quoted string
    if re.fullmatch(r"[\w./\-:]+", text) or re.fullmatch(r"\$\{[^}]*\}", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ---------------------------------------------------------------------------------------------------- launch script

class _Script:
    """What reading a launch script gathers, line by line, the way bash would see it."""

    def __init__(self, source: str):
        self.source = source
        self.variables: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.notes: list[str] = []
        self.commands: list[tuple[int, list[str], dict[str, str]]] = []  # (line, words, prefix assignments)
        self.scripts_called: list[str] = []
        self.line = 0

    def note(self, text: str) -> None:
        message = f"{self.source}:{self.line}: {text}"
        if message not in self.notes:
            self.notes.append(message)


def parse_launch_script(text: str, source: str = "launch.sh") -> UserRecipe:
    """The `python3 -m verl.trainer.main_ppo ...` command of a bash launch script: its overrides, and the
    environment the script exports (plus `NAME=value` prefixes of that command)."""
    script = _Script(source)
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        start = number
        line = lines[number]
        # line continuations: a backslash right before the newline joins the next line
        while line.endswith("\\") and not line.endswith("\\\\") and number + 1 < len(lines):
            number += 1
            line = line[:-1] + " " + lines[number]
        number += 1
        script.line = start + 1
        for words in _commands(line, script):
            _run(words, script)
    mains = [c for c in script.commands if _entry_index(c[1]) is not None]
    if not mains:
        called = f"; it runs {', '.join(script.scripts_called)}: pass that file to --recipe" \
            if script.scripts_called else ""
        raise BadInput(f"--recipe {source}: no `python3 -m verl.trainer.main_ppo ...` command in it{called}")
    if len(mains) > 1:
        raise BadInput(f"--recipe {source}: {len(mains)} verl commands (lines {', '.join(str(m[0]) for m in mains)});"
                       " keep the one to plan in its own file")
    line, words, prefix = mains[0]
    script.line = line
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
                else:
                    script.note(f"--config-name {value}: not a config of verl 0.9.1 (ppo_trainer, "
                                "ppo_megatron_trainer); the overrides compose in ppo_trainer")
            continue
        if word.startswith("-"):
            script.note(f"{word}: an option, not a Hydra override; not passed on")
            continue
        if not eq and not word.startswith("~"):
            script.note(f"{word!r}: not key=value; not passed on")
            continue
        overrides.append(word)
    for override in overrides:
        split_override(override, f"--recipe {source}:{line}")
    env = {**script.env, **prefix}
    return UserRecipe(source=source, overrides=tuple(overrides), env=env, entrypoint=entrypoint,
                      notes=tuple(script.notes))


def _entry_index(words: list[str]) -> int | None:
    """Index of `-m` in `python -m verl.trainer.X ...` (possibly behind a launcher such as `ray job submit --`)."""
    for i in range(1, len(words) - 1):
        if words[i] == "-m" and words[i + 1].startswith(ENTRY_PREFIX) and _PYTHON.fullmatch(words[i - 1]):
            return i
    return None


def _run(words: list[str], script: _Script) -> None:
    """Record what one simple command does to the script's variables and environment (nothing is executed)."""
    while words and words[0] in _RESERVED:
        words = words[1:]
    if not words:
        return
    if words[0] in _DECLARE:
        exported = words[0] == "export"
        for word in words[1:]:
            if word.startswith("-"):
                continue
            found = _ASSIGNMENT.fullmatch(word)
            if found:
                script.variables[found[1]] = found[2]
                if exported:
                    script.env[found[1]] = found[2]
            elif exported and word in script.variables:
                script.env[word] = script.variables[word]
        return
    prefix = {}
    while words and _ASSIGNMENT.fullmatch(words[0]):
        name, value = _ASSIGNMENT.fullmatch(words[0]).groups()
        prefix[name] = value
        words = words[1:]
    if not words:  # plain assignments
        script.variables.update(prefix)
        for name in prefix:
            if name in script.env:  # an exported variable stays exported
                script.env[name] = prefix[name]
        return
    if words[0] in ("bash", "sh", "source", ".") and len(words) > 1 and words[1].endswith(".sh"):
        script.scripts_called.append(words[1])
    script.commands.append((script.line, words, prefix))


def _commands(line: str, script: _Script) -> list[list[str]]:
    """The simple commands of one logical line as word lists, after bash's quoting and expansion (no word comes
    from running anything). Pipes, `;`, `&&`, `||` and `&` separate commands; redirections are dropped."""
    commands: list[list[str]] = []
    words: list[str] = []
    current: list[str] = []
    started = skip_target = False
    i, n = 0, len(line)

    def finish_word():
        nonlocal current, started, skip_target
        if started:
            word = "".join(current)
            if skip_target:
                skip_target = False
            elif word != "\0":  # "\0": a lone `$@`, which adds no word
                words.append(word.replace("\0", ""))
        current, started = [], False

    while i < n:
        c = line[i]
        if c in " \t":
            finish_word()
            i += 1
        elif c == "#" and not started:
            break
        elif c in ";|&":
            finish_word()
            if line.startswith(">", i + 1) and c == "&":  # &> file
                skip_target = True
                i += 2
                continue
            if words:
                commands.append(words)
            words = []
            i += 2 if line[i:i + 2] in ("&&", "||", ";;") else 1
        elif c in "<>":
            # `2>&1`, `> log`, `>> log`, `< in`: the fd number before it is not a word, and neither is the target
            if started and "".join(current).isdigit():
                current, started = [], False
            finish_word()
            i += 1
            while i < n and line[i] in "<>":
                i += 1
            if i < n and line[i] == "&":  # >&2: duplicate a descriptor, no file word follows
                i += 1
                while i < n and line[i].isdigit():
                    i += 1
            else:
                skip_target = True
        elif c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise BadInput(f"--recipe {script.source}:{script.line}: unterminated single quote")
            current.append(line[i + 1:end])
            started = True
            i = end + 1
        elif c == '"':
            i += 1
            started = True
            while True:
                if i >= n:
                    raise BadInput(f"--recipe {script.source}:{script.line}: unterminated double quote")
                c = line[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < n and line[i + 1] in '"\\$`':
                    current.append(line[i + 1])
                    i += 2
                elif c == "$":
                    text, i = _dollar(line, i, script)
                    current.append(text)
                else:
                    current.append(c)
                    i += 1
        elif c == "\\":
            current.append(line[i + 1] if i + 1 < n else "")
            started = True
            i += 2
        elif c == "$":
            text, i = _dollar(line, i, script)
            started = True
            # an unquoted expansion splits into words at whitespace, as bash does -- except in an assignment
            # (`X=$V`, `export X=$V`: bash assigns the whole value)
            assignment = re.match(r"[A-Za-z_]\w*=", "".join(current))
            parts = [text] if assignment else re.split(r"[ \t\n]+", text)
            for k, part in enumerate(parts):
                if k:
                    finish_word()
                    started = True
                current.append(part)
            if text.strip() == "" and text != "\0":
                started = bool(current and "".join(current))
        elif c == "`":
            end = line.find("`", i + 1)
            end = n - 1 if end < 0 else end
            current.append(line[i:end + 1])
            started = True
            script.note(f"command substitution {line[i:end + 1]} is not run; left as written")
            i = end + 1
        else:
            current.append(c)
            started = True
            i += 1
    finish_word()
    if words:
        commands.append(words)
    return commands


def _closing(line: str, start: int, opening: str, closing: str) -> int:
    """Index of the `closing` that balances the `opening` at `start`; -1 if there is none on the line."""
    depth = 0
    for j in range(start, len(line)):
        if line[j] == opening:
            depth += 1
        elif line[j] == closing:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _dollar(line: str, i: int, script: _Script) -> tuple[str, int]:
    """Expand the `$...` at line[i]; returns (text, index after it)."""
    rest = line[i + 1:]
    if rest.startswith("(("):
        end = _closing(line, i + 1, "(", ")")  # the `)` that closes the outer `(`: `$(( ... ))`
        if end < 0 or line[end - 1] != ")":
            raise BadInput(f"--recipe {script.source}:{script.line}: unterminated $((")
        return str(_arithmetic(line[i + 3:end - 1], script)), end + 1
    if rest.startswith("("):
        end = _closing(line, i + 1, "(", ")")
        end = len(line) - 1 if end < 0 else end
        text = line[i:end + 1]
        script.note(f"command substitution {text} is not run; left as written")
        return text, end + 1
    if rest.startswith("{"):
        end = line.find("}", i + 2)
        if end < 0:
            raise BadInput(f"--recipe {script.source}:{script.line}: unterminated ${{")
        return _parameter(line[i + 2:end], script), end + 1
    if rest[:1] in ("@", "*") or rest[:1].isdigit() or rest[:1] in ("#", "?", "$", "!"):
        if rest[:1] in ("@", "*") or rest[:1].isdigit():
            script.note(f"${rest[:1]}: the script's own arguments are not known; pass them after --")
        return "\0", i + 2
    found = _NAME.match(rest)
    if not found:
        return "$", i + 1
    return _parameter(found[0], script), i + 1 + found.end()


def _parameter(expression: str, script: _Script) -> str:
    """`NAME`, `NAME:-default`, `NAME-default`, `NAME:=default` as bash expands them from the script's variables."""
    found = re.fullmatch(r"([A-Za-z_]\w*)(:?[-=+?])?(.*)", expression, re.S)
    if not found:
        script.note(f"${{{expression}}}: not expanded; left as written")
        return f"${{{expression}}}"
    name, op, word = found.groups()
    value = script.variables.get(name)
    empty = value is None or (op or "").startswith(":") and value == ""
    if op in ("-", ":-", "=", ":="):
        if empty:
            default = "".join(_expand_plain(word, script))
            if op in ("=", ":="):
                script.variables[name] = default
            return default
        return value
    if op in ("+", ":+"):
        return "" if empty else "".join(_expand_plain(word, script))
    if value is None:
        script.note(f"${name} is not set in the script; left as written")
        return f"${{{name}}}"
    return value


def _expand_plain(word: str, script: _Script) -> list[str]:
    """Expansions inside a ${NAME:-default} word (no quoting there)."""
    out, i = [], 0
    while i < len(word):
        if word[i] == "$":
            text, i = _dollar(word, i, script)
            out.append(text.replace("\0", ""))
        else:
            out.append(word[i])
            i += 1
    return out


_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
          ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _arithmetic(expression: str, script: _Script) -> int:
    """bash integer arithmetic ($((...))) over the script's variables: + - * / % ** and parentheses only."""
    text = "".join(_expand_plain(expression, script))

    def value(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            raw = script.variables.get(node.id, "0") or "0"
            try:
                return int(raw)
            except ValueError:
                raise BadInput(f"--recipe {script.source}:{script.line}: ${{{node.id}}}={raw!r} in $(( {text} )) "
                               "is not a whole number") from None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise BadInput(f"--recipe {script.source}:{script.line}: division by zero in $(( {text} ))")
            if isinstance(node.op, ast.Pow) and (right < 0 or right > 64):
                raise BadInput(f"--recipe {script.source}:{script.line}: exponent {right} in $(( {text} ))")
            return _ARITH[type(node.op)](left, right)
        raise BadInput(f"--recipe {script.source}:{script.line}: $(( {text} )) uses what the harness does not "
                       "evaluate (only + - * / % ** on whole numbers and variables)")

    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise BadInput(f"--recipe {script.source}:{script.line}: $(( {text} )) is not arithmetic") from None
    return value(tree.body)
