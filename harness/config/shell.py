"""A launch script read the way bash reads it, with bash's own grammar (tree-sitter-bash), never run.

The hand-written line reader this replaces refused 40 of 82 upstream verl scripts (issue 30): a nested default
`${X:-"${HOME}/verl"}` ("unterminated ${"), a positional default `${1:-4}`, an arguments array passed as
`"${ARGS[@]}"` (dropped, so the Moonlight example was planned as the scale's DSV3 job). tree-sitter-bash parses what
bash parses (quotes inside expansions, arrays, functions, here-docs, `case`), and this module only *evaluates* the
parse tree over the script's own variables:

- assignments, `export`/`local`/`declare`/`readonly`, `unset`, arrays (`A=(...)`, `A+=(...)`, `"${A[@]}"`,
  `${A[i]}`, `${#A[@]}`), parameter operators (`:-` `-` `:=` `=` `:+` `+` `#` `##` `%` `%%` `/` `//` `#NAME`
  `:offset:len`), `$((...))` in bash's 64-bit integer arithmetic;
- functions: a call walks the body with its arguments as `$1...`;
- `$(...)` and backquotes are not run: the word is left as written and a note says so;
- the script's own arguments (`$1`, `$@`) are those a wrapper passes (`bash train.sh 2 1`), else unset, so
  `${1:-4}` is 4, as `bash run.sh` with no arguments gives;
- a command's name is a word like the others: `"${LAUNCH[@]}" -m verl.trainer.main_ppo`;
- a variable the script never sets is left as the shell reference `${NAME}` for the shell that runs the job, and
  listed in `unset` (it is no OmegaConf interpolation: issue 36);
- `case WORD in`: the first item whose pattern matches a known WORD is read (verl's Kimi K2.6 / GLM 5.1 example picks
  its model in a `case` with an `exit 1` default); an unknown WORD reads every item. `if` conditions are not
  evaluated: every branch is read, and an `exit` / `return` inside a branch or after `||` / `&&` is not taken;
- `env`: the environment a calling script exported (cann-recipes-train's wrapper exports VLLM_DP_SIZE and runs
  `bash ./verl_patches/scripts/internal/train_*.sh`), visible and exported, as bash passes it to a child.

Every expansion has a budget (issue 36): a word or variable of more than MAX_WORD_CHARS, more than
MAX_TOTAL_CHARS expanded in all, function calls nested deeper than MAX_CALL_DEPTH, statements nested deeper than
MAX_NESTING, an arithmetic expression nested deeper than MAX_ARITH_DEPTH, or more than MAX_WORK statements and
copies ends the read with one line naming the line. A product (a replace, a concatenation) is charged before it is
built. bash's arithmetic wraps at 64 bits, so an exponent chain `$((9**9**9**9))` costs nothing here either.
"""
from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field

from harness.errors import BadInput
from harness.redact import one_line

MAX_WORD_CHARS = 1 << 20  # one variable or word; a real override is < 4 kB, a doubling script passes 1 MB at line 21
MAX_TOTAL_CHARS = 32 << 20  # everything a script expands
MAX_CALL_DEPTH = 32  # function calls (a recursive function)
MAX_NESTING = 200  # nested statements / words (Python's recursion stays far from its limit)
MAX_ARITH_DEPTH = 200
MAX_STATEMENTS = 50_000  # statements walked, loops and calls included (a real launch script walks a few hundred)
# Work units: a statement walked, an array item copied (`A+=(x)` copies A, `"${A[@]}"` copies its items) and a field
# joined. A 2 MB script of `A+=(x)` lines copied A each line (issue 48: 85-100 s before the character budget
# stopped it); real launch scripts spend a few thousand.
MAX_WORK = 2_000_000
MAX_LIFT_WORD = 1024  # a default word lifted out of `${NAME:-word}` (_lift_defaults); real ones are < 200
MAX_LIFT_SCAN = 1 << 22  # characters _lift_defaults looks at in all
MAX_MESSAGE = 400  # characters of one error or note line
MAX_LIFTED = 256  # defaults lifted out of one script
_MASK = (1 << 64) - 1
_NAME = re.compile(r"[A-Za-z_]\w*")
DEFAULT_OPS = (":-", "-", ":=", "=", ":+", "+", ":?", "?")
_LIFTED = "__harness_default_"  # the variable a lifted `${NAME:-word}` becomes (no script names one so)
# `NAME<op>word` inside `${...}` (alternatives in DEFAULT_OPS order: `:-` is tried before `-`)
_DEFAULT = re.compile(rf"({_NAME.pattern})({'|'.join(map(re.escape, DEFAULT_OPS))})(.*)", re.S)


@functools.lru_cache(maxsize=1)
def _parser():
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


@dataclass
class Command:
    """One simple command after expansion: its line, words and `NAME=value` prefixes."""

    line: int
    words: list[str]
    prefix: dict[str, str]


@dataclass
class ShellRead:
    """What walking a script gathered."""

    commands: list[Command] = field(default_factory=list)
    variables: dict[str, str | list[str]] = field(default_factory=dict)
    exported: dict[str, str] = field(default_factory=dict)  # the environment the script exports
    notes: list[str] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)  # variables used but never set (left as ${NAME})
    # `bash FILE ARGS...` (a script run, not sourced): [FILE, *ARGS] as bash passes them (issue 48: `bash train.sh
    # 2 1` was read as if run with no arguments)
    scripts_called: list[list[str]] = field(default_factory=list)


_ABSENT = object()  # a variable a prefix assignment (`A=1 cmd`) set where none was


class _Nest:
    """The reader's nesting guard (MAX_NESTING), one object: a class built per statement cost more than the rest."""

    def __init__(self, reader):
        self.reader = reader

    def __enter__(self):
        self.reader.depth += 1
        if self.reader.depth > MAX_NESTING:
            raise self.reader.fail(f"nested more than {MAX_NESTING} deep; not a launch script")

    def __exit__(self, *exc):
        self.reader.depth -= 1


class _Unknowable(Exception):
    """An arithmetic operand only the running script knows (a command substitution's output)."""


class _Return(Exception):
    """`return` / `exit` inside a function or the script."""


class _Reader:
    def __init__(self, source: str, text: bytes, env: dict[str, str] | None = None, args: list[str] | None = None):
        self.source = source
        self.text = text
        self.out = ShellRead()
        self.vars = self.out.variables
        self.vars.update(env or {})
        self.exported_names: dict[str, None] = dict.fromkeys(env or {})  # in the order the script exports them
        self.conditional = 0  # inside an if/elif/else branch, an unmatched-case read, or after || / &&
        self.lifted: dict[str, tuple[str, str, object]] = {}  # placeholder -> (NAME, op, word node): _lift_defaults
        self.functions: dict[str, object] = {}
        self.positional: list[str] = list(args or ())
        self.line = 1
        self.depth = 0
        self.calls = 0
        self.statements = 0
        self.work = 0
        self._nest = _Nest(self)
        self.expanded = 0
        self.noted: set[str] = set()
        self.vars_unset: set[str] = set()

    # ------------------------------------------------------------------ errors, notes, budgets
    def fail(self, text: str) -> BadInput:
        return BadInput(one_line(f"--recipe {self.source}:{self.line}: {text}", MAX_MESSAGE))

    def note(self, text: str) -> None:
        # one bounded line: a note quotes the script (a 100 kB word, a newline that would print a fake verdict line)
        message = one_line(f"{self.source}:{self.line}: {text}", MAX_MESSAGE)
        if message not in self.noted:  # a set: 40k noted lines stay linear
            self.noted.add(message)
            self.out.notes.append(message)

    def spend(self, units: int) -> None:
        """Charge `units` of work (MAX_WORK) before it is done: a copy counts its items."""
        self.work += units
        if self.work > MAX_WORK:
            raise self.fail(f"more than {MAX_WORK} statements and copies (an array copied each line?); no launch "
                            "script needs that")

    def charge_size(self, size: int) -> None:
        """Refuse a word of `size` characters before it is built (MAX_WORD_CHARS)."""
        if size > MAX_WORD_CHARS:
            raise self.fail(f"a word expands to more than {MAX_WORD_CHARS >> 20} MiB (a variable that doubles each "
                            "line?); no launch script needs that")

    def join(self, acc: list[str], more: list[str]) -> list[str]:
        """_join, its product charged before it is built: `"$X$X$X..."` of a 1 MiB X built the whole word first."""
        if acc and more:
            self.spend(len(acc) + len(more))
            self.charge_size(len(acc[-1]) + len(more[0]))
        return _join(acc, more)

    def charge(self, value: str) -> str:
        if len(value) > MAX_WORD_CHARS:
            raise self.fail(f"a word expands to more than {MAX_WORD_CHARS >> 20} MiB (a variable that doubles each "
                            "line?); no launch script needs that")
        self.expanded += len(value)
        if self.expanded > MAX_TOTAL_CHARS:
            raise self.fail(f"the script expands to more than {MAX_TOTAL_CHARS >> 20} MiB of text; no launch script "
                            "needs that")
        return value

    def nest(self):
        return self._nest

    # ------------------------------------------------------------------ variables
    def get(self, name: str):
        if name.isdigit():
            k = int(name)
            if k == 0:
                return self.source
            return self.positional[k - 1] if k <= len(self.positional) else None
        return self.vars.get(name)

    def scalar(self, name: str) -> str | None:
        value = self.get(name)
        if isinstance(value, list):
            return value[0] if value else ""
        return value

    def assign(self, name: str, value, *, append: bool = False, export: bool = False) -> None:
        if append:
            old = self.vars.get(name)
            self.spend(len(old) if isinstance(old, list) else 1)  # the copy below
            if isinstance(value, list):
                value = (old if isinstance(old, list) else ([old] if old is not None else [])) + value
            else:
                value = (self.scalar(name) or "") + value
        if isinstance(value, list):
            for item in value:
                self.charge(item)
        else:
            self.charge(value)
        self.vars[name] = value
        if export:
            self.exported_names[name] = None

    def unknown(self, name: str) -> str:
        if name not in self.vars_unset:
            self.vars_unset.add(name)
            self.out.unset.append(name)
        self.note(f"${name} is not set in the script; left as ${{{name}}} for the shell that runs the job "
                  "(set it in the script, or pass the key after --)")
        return f"${{{name}}}"

    # ------------------------------------------------------------------ statements
    def run(self, node) -> None:
        self.statements += 1
        self.spend(1)
        if self.statements > MAX_STATEMENTS:
            raise self.fail(f"more than {MAX_STATEMENTS} statements walked (a loop or recursion?)")
        self.line = node.start_point[0] + 1
        kind = node.type
        with self.nest():
            if kind == "variable_assignment":
                self.assignment(node)
            elif kind == "variable_assignments":
                for child in node.named_children:
                    self.assignment(child)
            elif kind == "declaration_command":
                self.declaration(node)
            elif kind == "unset_command":
                for child in node.named_children:
                    if child.type in ("variable_name", "word"):
                        self.vars.pop(child.text.decode(), None)
            elif kind == "function_definition":
                name = node.child_by_field_name("name")
                body = node.child_by_field_name("body")
                if name is not None and body is not None:
                    self.functions[name.text.decode()] = body
            elif kind == "command":
                self.command(node)
            elif kind == "case_statement":
                self.case(node)
            elif kind in ("if_statement", "elif_clause", "else_clause", "while_statement", "case_item",
                          "compound_statement", "subshell", "list", "pipeline", "program", "redirected_statement",
                          "negated_command", "do_group"):
                # Conditions are not evaluated: every branch is read (a second verl command is named as such).
                branch = kind in ("if_statement", "elif_clause", "else_clause", "while_statement")
                for index, child in enumerate(node.named_children):
                    if child.type not in ("test_command", "comment") and not child.type.endswith("redirect") \
                            and child.type not in ("heredoc_body", "herestring_redirect"):
                        if kind == "case_item" and child in node.children_by_field_name("value"):
                            continue
                        # `a || exit 1`, `[ -f x ] && exit`: what follows the first command of a list is conditional
                        later = kind == "list" and index > 0
                        self.conditional += branch or later
                        try:
                            self.run(child)
                        finally:
                            self.conditional -= branch or later
            elif kind == "for_statement":
                self.for_loop(node)
            # comments, test commands, C-style for loops, here-doc bodies: nothing a job reads

    def case(self, node) -> None:
        """`case WORD in PATTERN) ... ;;`: the first matching item when WORD is known, else every item."""
        value_node = node.child_by_field_name("value")
        items = [c for c in node.named_children if c.type == "case_item"]
        before = len(self.out.unset)
        word = self.word_text(value_node) if value_node is not None else None
        known = word is not None and len(self.out.unset) == before and "$(" not in word and "`" not in word
        if known:
            for item in items:
                patterns = [v.text.decode() if v.type == "extglob_pattern" else self.word_text(v)
                            for v in item.children_by_field_name("value")]
                if any(fnmatch.fnmatchcase(word, p) for p in patterns):
                    self.run(item)
                    return
            return
        self.conditional += 1
        try:
            for item in items:
                self.run(item)
        finally:
            self.conditional -= 1

    def for_loop(self, node) -> None:
        variable = node.child_by_field_name("variable")
        values = [w for child in node.children_by_field_name("value") for w in self.words(child)]
        body = node.child_by_field_name("body")
        if variable is not None and values:
            # the body is read once, with the first value: a loop over jobs would otherwise plan several
            self.assign(variable.text.decode(), values[0])
            if len(values) > 1:
                self.note(f"for {variable.text.decode()} in ...: read once, with its first value {values[0]!r}")
        if body is not None:
            self.run(body)

    def assignment(self, node) -> dict[str, str] | None:
        name_node = node.child_by_field_name("name")
        value_node = node.child_by_field_name("value")
        if name_node is None:
            return None
        op = next((c.type for c in node.children if c.type in ("=", "+=")), "=")
        if name_node.type == "subscript":  # A[i]=v: the element
            name = name_node.child_by_field_name("name").text.decode()
            index = self.arith_text(name_node.child_by_field_name("index"))
            old = self.vars.get(name)
            items = old if isinstance(old, list) else ([old] if old is not None else [])
            value = self.word_text(value_node) if value_node is not None else ""
            if 0 <= index < 4096:
                items = items + [""] * (index + 1 - len(items))
                items[index] = value
                self.assign(name, items)
            return None
        name = name_node.text.decode()
        if value_node is not None and value_node.type == "array":
            value = [w for child in value_node.named_children for w in self.words(child)]
        else:
            value = self.word_text(value_node) if value_node is not None else ""
        self.assign(name, value, append=op == "+=")
        return {name: value if isinstance(value, str) else " ".join(value)}

    def declaration(self, node) -> None:
        keyword = node.children[0].type
        export = keyword == "export" or any(
            c.type == "word" and c.text.decode().startswith("-") and "x" in c.text.decode() for c in node.children)
        for child in node.named_children:
            if child.type == "variable_assignment":
                self.assignment(child)
                name = child.child_by_field_name("name")
                if export and name is not None and name.type == "variable_name":
                    self.exported_names[name.text.decode()] = None
            elif child.type == "variable_name" and export:
                self.exported_names[child.text.decode()] = None

    def command(self, node) -> None:
        prefix: dict[str, str] = {}
        words: list[str] = []
        name_node = node.child_by_field_name("name")
        saved: dict[str, object] = {}  # what the prefix assignments replace (a copy of every variable per command
        # was O(script) per statement: issue 48)
        for child in node.named_children:
            if child.type == "variable_assignment" and name_node is not None and child.end_byte <= name_node.start_byte:
                var = child.child_by_field_name("name")
                key = var.text.decode() if var is not None and var.type == "variable_name" else None
                if key is not None and key not in saved:
                    saved[key] = self.vars.get(key, _ABSENT)
                assigned = self.assignment(child)
                if assigned:
                    prefix.update(assigned)
            elif child.type.endswith("redirect") or child.type in ("comment", "heredoc_body"):
                continue
            else:
                words.extend(self.words(child))
        if name_node is None:
            return
        for key, old in saved.items():  # `A=1 cmd`: A is set for cmd only
            if old is _ABSENT:
                self.vars.pop(key, None)
            else:
                self.vars[key] = old
        if not words:
            return
        head = words[0]
        if head in ("return", "exit"):
            if self.conditional:  # a branch the reader cannot decide: bash may well not take it
                self.note(f"{head} inside a condition: not taken (conditions are not evaluated)")
                return
            raise _Return()
        if head in self.functions:
            self.call(head, words[1:])
            return
        if head in ("bash", "sh"):  # run, not sourced: `bash [-x ...] FILE.sh ARGS...`
            at = next((i for i, w in enumerate(words[1:], 1) if not w.startswith("-")), None)
            if at is not None and words[at].endswith(".sh"):
                self.out.scripts_called.append(words[at:])
        if head == "set" and len(words) > 1 and words[1] == "--":
            self.positional = words[2:]
        if head == "shift":
            self.positional = self.positional[1:]
        self.out.commands.append(Command(self.line, words, prefix))

    def call(self, name: str, args: list[str]) -> None:
        self.calls += 1
        if self.calls > MAX_CALL_DEPTH:
            raise self.fail(f"function {name} calls nest more than {MAX_CALL_DEPTH} deep (recursion?)")
        saved, self.positional = self.positional, args
        try:
            self.run(self.functions[name])
        except _Return:
            pass
        finally:
            self.positional = saved
            self.calls -= 1

    # ------------------------------------------------------------------ words
    def words(self, node) -> list[str]:
        """The fields one argument node expands to (word splitting of unquoted expansions, `"${A[@]}"`)."""
        fields, _ = self.fields(node, quoted=False)
        return [self.charge(f) for f in fields]

    def word_text(self, node) -> str:
        """A node's expansion as one string, as in an assignment (no word splitting)."""
        fields, _ = self.fields(node, quoted=True)
        return self.charge(" ".join(fields))

    def fields(self, node, *, quoted: bool) -> tuple[list[str], bool]:
        """(fields, literal): `literal` is whether the node makes a word even when it expands to nothing."""
        with self.nest():
            kind = node.type
            if kind == "comment":  # a comment inside an array or between continued lines
                return [], False
            if kind == "command_name":  # `"${LAUNCH[@]}" -m verl.trainer.main_ppo` (issue 44: 68 of verl main's 120
                # launch scripts) and `$PYTHON -m ...`: the name is a word like any other
                acc: list[str] = []
                literal = False
                for child in node.children:
                    f, lit = self.fields(child, quoted=quoted)
                    literal |= lit
                    acc = self.join(acc, f)
                return acc, literal
            if kind in ("word", "number", "variable_name", "regex", "extglob_pattern"):
                text = node.text.decode()
                if not quoted:
                    text = re.sub(r"\\(.)", r"\1", text, flags=re.S)
                return [text], True
            if kind == "raw_string":
                return [node.text.decode()[1:-1]], True
            if kind == "ansi_c_string":
                body = node.text.decode()[2:-1]
                try:
                    body = body.encode("latin-1", "backslashreplace").decode("unicode_escape")
                except UnicodeDecodeError:
                    pass
                return [body], True
            if kind in ("string", "translated_string"):
                return self.quoted_string(node), True
            if kind == "string_content":
                return [re.sub(r"\\([\"\\$`])", r"\1", node.text.decode())], True
            if kind == "concatenation":
                acc: list[str] = []
                literal = False
                for child in node.children:
                    f, lit = self.fields(child, quoted=quoted)
                    literal |= lit
                    if lit and not f:
                        f = [""]
                    acc = self.join(acc, f)
                return acc, literal
            if kind in ("simple_expansion", "expansion"):
                value = self.expansion(node)
                if isinstance(value, list):  # ${A[@]} / $@: one field per element, quoted or not
                    self.spend(len(value))
                    return list(value) if quoted else [w for v in value for w in v.split()], False
                if quoted:
                    return [value], True
                return value.split(), False
            if kind == "arithmetic_expansion":
                return [self.arith_word(node)], True
            if kind in ("command_substitution", "process_substitution"):
                text = node.text.decode()
                arith = _misparsed_arith(text) if kind == "command_substitution" else None
                if arith is not None:
                    return [self.arith_word(arith)], True
                self.note(f"command substitution {text} is not run; left as written")
                return [text], True
            if kind == "brace_expression":
                return [node.text.decode()], True
            # anything else (an operator token inside a concatenation, `~`, `=`): its text
            return [node.text.decode()], True

    def quoted_string(self, node) -> list[str]:
        acc: list[str] = [""]
        for child in node.children:
            if child.type == '"':
                continue
            if child.type in ("simple_expansion", "expansion"):
                value = self.expansion(child)
                acc = self.join(acc, list(value) if isinstance(value, list) else [value]) if value != [] else acc
            elif child.type == "arithmetic_expansion":
                acc = self.join(acc, [self.arith_word(child)])
            elif child.type == "command_substitution":
                f, _ = self.fields(child, quoted=True)
                acc = self.join(acc, f)
            elif child.type == "string_content":
                acc = self.join(acc, [re.sub(r"\\([\"\\$`])", r"\1", child.text.decode())])
            else:
                acc = self.join(acc, [child.text.decode()])
        return acc

    def default(self, name: str, value, op: str, word) -> str | list[str]:
        """`${NAME:-word}` and the other DEFAULT_OPS; `word()` expands the word only when bash would."""
        text = " ".join(value) if isinstance(value, list) else value
        empty = value is None or (op.startswith(":") and text == "")
        if op in (":-", "-"):
            return word() if empty else value
        if op in (":=", "="):
            if empty:
                default = word()
                self.assign(name, default)
                return default
            return value
        if op in (":+", "+"):
            return "" if empty else word()
        if empty:  # ${X:?message}: bash stops the script here
            raise self.fail(f"${{{name}:?}}: the script stops here when {name} is unset "
                            f"({word() or 'parameter null or not set'}); set it in the script or pass "
                            f"--recipe-env {name}=VALUE")
        return value

    def expansion(self, node) -> str | list[str]:
        """`$NAME`, `${...}`: a string, or a list for `@`-expansions."""
        if node.type == "simple_expansion":
            inner = node.named_children[0] if node.named_children else None
            if inner is None:
                return "$"
            name = inner.text.decode()
            if inner.type == "special_variable_name":
                return self.special(name)
            value = self.scalar(name)
            if value is None:
                return "" if name.isdigit() else self.unknown(name)
            return value
        # ${ ... }: the tokens between the braces
        parts = node.children[1:-1]
        if not parts:
            return ""
        length = parts[0].type == "#" and len(parts) == 2
        indirect = parts[0].type == "!"
        if length or indirect:
            parts = parts[1:]
        target = parts[0]
        rest = parts[1:]
        name, value = self.target(target)
        if indirect:
            value = self.scalar(value) if isinstance(value, str) and _NAME.fullmatch(value) else None
        if length:
            return str(len(value)) if isinstance(value, list) else str(len(value or ""))
        if not rest:
            if name in self.lifted:  # a default tree-sitter-bash cannot parse in place (_lift_defaults)
                var, op, word_node = self.lifted[name]
                return self.default(var, self.get(var), op, lambda: self.word_text(word_node) if word_node else "")
            if value is None:
                return "" if (name.isdigit() or name in ("@", "*")) else self.unknown(name)
            return value
        op = rest[0].type
        word_nodes = rest[1:]

        def word() -> str:
            return self.charge("".join(self.word_text(w) for w in word_nodes))

        text = " ".join(value) if isinstance(value, list) else value
        if op in DEFAULT_OPS:
            return self.default(name, value, op, word)
        if value is None:
            return self.unknown(name)
        if op in ("#", "##", "%", "%%"):
            return _trim(text, word(), op)
        if op in ("/", "//", "/#", "/%"):
            pattern = self.word_text(word_nodes[0]) if word_nodes else ""
            replacement = self.word_text(word_nodes[-1]) if len(word_nodes) > 1 else ""
            if not pattern:
                return text
            # the product's size is charged before it is built (issue 48: `${X//a/$Y}` on a 370-byte script asked
            # for 4 GiB before the word bound)
            count = text.count(pattern) if op == "//" else 1
            self.charge_size(len(text) + count * max(0, len(replacement) - len(pattern)))
            if op == "//":
                return text.replace(pattern, replacement)
            if op == "/#":
                return replacement + text[len(pattern):] if text.startswith(pattern) else text
            if op == "/%":
                return text[:-len(pattern)] + replacement if text.endswith(pattern) else text
            return text.replace(pattern, replacement, 1)
        if op == ":":
            numbers = [self.arith_text(w) for w in word_nodes if w.type not in (":",)]
            start = numbers[0] if numbers else 0
            end = None if len(numbers) < 2 else (start + numbers[1] if numbers[1] >= 0 else numbers[1])
            return text[start:end]
        if op in ("^^", ",,", "^", ","):
            return text.upper() if op.startswith("^") else text.lower()
        self.note(f"{node.text.decode()}: this expansion is not evaluated; left as written")
        return node.text.decode()

    def target(self, node) -> tuple[str, str | list[str] | None]:
        """The variable an expansion names and its value (a list for `A[@]`)."""
        if node.type == "subscript":
            name = node.child_by_field_name("name").text.decode()
            index = node.child_by_field_name("index")
            raw = self.get(name)
            items = raw if isinstance(raw, list) else ([raw] if raw is not None else None)
            key = index.text.decode() if index is not None else "0"
            if key in ("@", "*"):
                return name, items if items is not None else None
            if items is None:
                return name, None
            at = self.arith_text(index)
            return name, items[at] if -len(items) <= at < len(items) else ""
        name = node.text.decode()
        if node.type == "special_variable_name" or name in ("@", "*", "#", "?", "$", "!", "-"):
            return name, self.special(name)
        return name, self.get(name)

    def special(self, name: str):
        if name in ("@", "*"):
            if not self.positional:
                self.note(f"${name}: the script's own arguments are not known; pass them after --")
            return list(self.positional)
        if name == "#":
            return str(len(self.positional))
        return ""

    # ------------------------------------------------------------------ arithmetic
    def arith_text(self, node) -> int:
        if node is None:
            return 0
        if node.type in ("number", "word") and re.fullmatch(r"-?\d+", node.text.decode()):
            return int(node.text.decode())
        return self.arith_node(node, 0)

    def arith_word(self, node) -> str:
        """`$((...))` as a word: its value, or (over a value only the running script has: a command substitution's
        output) the expression left as written, with a note."""
        try:
            return str(self.arith(node))
        except _Unknowable as exc:
            text = node.text.decode()
            self.note(f"{text}: uses {exc} (known only when the script runs); left as written")
            return text

    def arith(self, node) -> int:
        inner = [c for c in node.named_children]
        if not inner:
            return 0
        value = 0
        for child in inner:  # `$((a, b))` -> the last
            value = self.arith_node(child, 0)
        return value

    def arith_node(self, node, depth: int) -> int:
        if depth > MAX_ARITH_DEPTH:
            raise self.fail(f"$(( )) nested more than {MAX_ARITH_DEPTH} deep")
        kind = node.type
        d = depth + 1
        if kind == "number":
            return self.number(node.text.decode())
        if kind in ("variable_name", "word"):
            return self.var_number(node.text.decode(), d)
        if kind in ("simple_expansion", "expansion"):
            value = self.expansion(node)
            value = value[0] if isinstance(value, list) and value else value
            return self.number_text(value or "0", d)
        if kind == "subscript":
            _, value = self.target(node)
            return self.number_text(value if isinstance(value, str) else "0", d)
        if kind == "parenthesized_expression":
            children = node.named_children
            return self.arith_node(children[-1], d) if children else 0
        if kind == "unary_expression":
            op = node.children[0].type
            value = self.arith_node(node.named_children[-1], d)
            return _wrap({"-": -value, "+": value, "!": int(not value), "~": ~value}.get(op, value))
        if kind == "binary_expression":
            left = node.child_by_field_name("left")
            right = node.child_by_field_name("right")
            op = node.child_by_field_name("operator")
            op = op.type if op is not None else node.children[1].type
            if op == "**" and left.type == "binary_expression" and _op(left) == "**":
                # tree-sitter-bash groups `a ** b ** c` as (a ** b) ** c; bash's ** is right-associative
                chain = [right]
                while left.type == "binary_expression" and _op(left) == "**":
                    chain.append(left.child_by_field_name("right"))
                    left = left.child_by_field_name("left")
                chain.append(left)
                value = self.arith_node(chain[0], d)
                for base in chain[1:]:
                    value = self.binary("**", self.arith_node(base, d), value)
                return value
            a = self.arith_node(left, d)
            if op == "&&":
                return int(bool(a) and bool(self.arith_node(right, d)))
            if op == "||":
                return int(bool(a) or bool(self.arith_node(right, d)))
            b = self.arith_node(right, d)
            return self.binary(op, a, b)
        if kind == "ternary_expression":
            cond, yes, no = node.named_children[:3]
            return self.arith_node(yes if self.arith_node(cond, d) else no, d)
        if kind == "arithmetic_expansion":
            return self.arith(node)
        raise self.fail(f"$(( {node.text.decode()} )) uses what the harness does not evaluate (bash integer "
                        "operators on numbers and variables only)")

    def binary(self, op: str, a: int, b: int) -> int:
        if op in ("/", "%") and b == 0:
            raise self.fail("division by zero in $(( ))")
        if op == "**":
            if b < 0:
                raise self.fail("exponent less than 0 in $(( ))")
            return _wrap(pow(a, b, 1 << 64))  # bash's 64-bit wrap, computed without the big power
        table = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
                 "/": lambda: abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1),
                 "%": lambda: abs(a) % abs(b) * (1 if a >= 0 else -1),
                 "<<": lambda: a << (b & 63), ">>": lambda: a >> (b & 63), "&": lambda: a & b, "|": lambda: a | b,
                 "^": lambda: a ^ b, "<": lambda: int(a < b), ">": lambda: int(a > b), "<=": lambda: int(a <= b),
                 ">=": lambda: int(a >= b), "==": lambda: int(a == b), "!=": lambda: int(a != b)}
        if op not in table:
            raise self.fail(f"operator {op} in $(( )) is not evaluated by the harness")
        return _wrap(table[op]())

    def number(self, text: str) -> int:
        try:
            if "#" in text:
                base, digits = text.split("#", 1)
                return _wrap(int(digits, int(base)))
            if re.fullmatch(r"0[xX][0-9a-fA-F]+", text):
                return _wrap(int(text, 16))
            if re.fullmatch(r"0[0-7]+", text):
                return _wrap(int(text, 8))
            if len(text) > 40:
                raise ValueError
            return _wrap(int(text))
        except ValueError:
            raise self.fail(f"{text[:40]!r} in $(( )) is not a number bash reads") from None

    def var_number(self, name: str, depth: int) -> int:
        value = self.scalar(name)
        return self.number_text(value or "0", depth)

    def number_text(self, value: str, depth: int) -> int:
        value = value.strip()
        if "$(" in value or "`" in value or value.startswith("${"):
            raise _Unknowable(value[:60])
        if re.fullmatch(r"[-+]?\d{1,40}", value):
            return _wrap(int(value))
        if _NAME.fullmatch(value):  # bash evaluates a variable's value as an expression: a name names another
            if depth > MAX_ARITH_DEPTH:
                raise self.fail(f"$(( )) nested more than {MAX_ARITH_DEPTH} deep")
            return self.var_number(value, depth + 1)
        raise self.fail(f"{value[:40]!r} in $(( )) is not a whole number")


def _lift_defaults(data: bytes) -> tuple[bytes, dict[str, tuple[str, str, bytes]]]:
    """tree-sitter-bash 0.25.1 ends in an ERROR node on defaults bash reads: a list `${TEST_FILE:-["/path"]}`
    (verl-recipe's entropy scripts), `${CONTENTS:-['npu','cpu']}` (verl's NPU profiling test), a parenthesised
    `${N:-$(((a + b) * 2))}` (verl's router-replay example). Each one-line `${NAME<op>word}` whose word holds `[` or
    `$((` becomes `${__harness_default_K}`, expanded from (NAME, op, word) when read; the line numbers hold."""
    text = data.decode("utf-8", "surrogateescape")
    out, lifted, i, budget = [], {}, 0, [MAX_LIFT_SCAN]
    while True:
        start = text.find("${", i)
        if start < 0 or budget[0] <= 0 or len(lifted) >= MAX_LIFTED:  # a hostile file stays cheap: the rest is
            # left as it is (and its parse error stands)
            break
        end = _closing_brace(text, start + 2, budget)
        match = _DEFAULT.fullmatch(text[start + 2:end]) if end is not None else None
        if match and ("[" in match[3] or "$((" in match[3]) and "\n" not in match[3]:
            key = f"{_LIFTED}{len(lifted)}"
            lifted[key] = (match[1], match[2], match[3].encode("utf-8", "surrogateescape"))
            out.append(text[i:start] + "${" + key + "}")
            i = end + 1
        else:
            out.append(text[i:start + 2])
            i = start + 2
    out.append(text[i:])
    return "".join(out).encode("utf-8", "surrogateescape"), lifted


def _closing_brace(text: str, at: int, budget: list[int]) -> int | None:
    """Index of the `}` closing a `${` whose body starts at `at` (nested `${`, quotes skipped), None on a newline
    or past MAX_LIFT_WORD characters; each character looked at is taken from `budget`."""
    depth, i = 1, at
    stop = min(len(text), at + MAX_LIFT_WORD)
    budget[0] -= stop - at
    while i < stop:
        c = text[i]
        if c == "\n":
            return None
        if c == "\\":
            i += 2
            continue
        if c in "'\"":
            close = text.find(c, i + 1)
            if close < 0:
                return None
            i = close + 1
            continue
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _word_node(word: bytes):
    """A word parsed on its own, as the value of `X=word`; None for an empty word or one that does not parse."""
    if not word:
        return None
    root = _parser().parse(b"X=" + word + b"\n").root_node
    value = root.named_children[0].child_by_field_name("value") if root.named_children else None
    return value if not root.has_error else None


def _misparsed_arith(text: str):
    """tree-sitter-bash parses `$((a + b))` inside `${X:-...}` as a command substitution of a subshell (verl's
    DSV3 671B example: `${PPO_MAX_TOKEN_LEN_PER_GPU:-$((max_prompt_length + max_response_length))}`); bash reads an
    arithmetic expansion there. The text parsed again on its own gives that node, or None when it is no `$((...))`."""
    if not (text.startswith("$((") and text.endswith("))")):
        return None
    value = _word_node(text.encode("utf-8", "surrogateescape"))
    return value if value is not None and value.type == "arithmetic_expansion" else None


def _op(node) -> str:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else node.children[1].type


def _wrap(value: int) -> int:
    value &= _MASK
    return value - (1 << 64) if value >> 63 else value


def _join(acc: list[str], more: list[str]) -> list[str]:
    if not acc:
        return list(more)
    if not more:
        return acc
    return [*acc[:-1], acc[-1] + more[0], *more[1:]]


def _trim(text: str, pattern: str, op: str) -> str:
    """`${X#p}` `${X##p}` `${X%p}` `${X%%p}` with glob patterns (fnmatch)."""
    if len(text) > 4096:  # each try is a match: bounded like the rest
        return text
    cuts = range(len(text) + 1)
    if op in ("#", "##"):
        order = cuts if op == "#" else reversed(cuts)
        for k in order:
            if fnmatch.fnmatchcase(text[:k], pattern):
                return text[k:]
        return text
    order = reversed(cuts) if op == "%" else cuts
    for k in order:
        if fnmatch.fnmatchcase(text[k:], pattern):
            return text[:k]
    return text


def read_script(text: str, source: str, env: dict[str, str] | None = None, args: list[str] | None = None) -> ShellRead:
    """Walk a bash script's parse tree (see the module docstring) with `env` as the inherited environment and
    `args` as its arguments ($1...: what a wrapper's `bash FILE ARGS` passes); BadInput for what bash would not
    run."""
    # bash drops a backslash-newline at the end of the input; tree-sitter-bash wants a line after it (upstream
    # scripts end on `"${ARGS[@]}" \` with no newline)
    data = text.encode("utf-8", "surrogateescape") + b"\n\n"
    tree = _parser().parse(data)
    root = tree.root_node
    reader = _Reader(source, data, env, args)
    if root.has_error:
        lifted_data, lifted = _lift_defaults(data)
        lifted_root = _parser().parse(lifted_data).root_node if lifted else root
        words = {k: (name, op, _word_node(word)) for k, (name, op, word) in lifted.items()}
        # an empty word (`${X:-}`) has no node; any other word that does not parse on its own keeps the error
        if not lifted_root.has_error and all(words[k][2] is not None or not lifted[k][2] for k in lifted):
            root, reader.lifted = lifted_root, words
    if root.has_error:
        bad = _first_error(root)
        reader.line = bad.start_point[0] + 1
        snippet = data[bad.start_byte:bad.start_byte + 40].decode("utf-8", "replace").splitlines()
        quote = {"'": "single", '"': "double"}.get(snippet[0].lstrip()[:1] if snippet else "")
        if quote and data.count(snippet[0].lstrip()[:1].encode(), bad.start_byte) % 2:
            raise reader.fail(f"unterminated {quote} quote")
        raise reader.fail(f"not bash that bash would run (syntax error near {(snippet or [''])[0]!r}); "
                          "check it with `bash -n`")
    try:
        reader.run(root)
    except _Return:
        pass
    except RecursionError:
        raise reader.fail("nested too deep to read") from None
    out = reader.out
    out.exported = {}
    for name in reader.exported_names:
        value = reader.vars.get(name)
        if value is not None:
            out.exported[name] = value if isinstance(value, str) else " ".join(value)
    return out


def _first_error(node):
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "ERROR" or n.is_missing:
            return n
        stack.extend(reversed(n.children))
    return node
