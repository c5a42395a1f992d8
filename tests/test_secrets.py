"""Credentials never reach an output: a token planted in --ray-address (and in a failing test's message) is
looked for in everything a run writes -- report JSON/HTML/Markdown, pytest.log, JUnit XML, the console -- and
every one of them goes through harness.redact.redact. Report directories never follow a symlink planted for a
lock, a log or a temporary file."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from faults import cli, env, one_line_exit_2, suites_tree

TOKEN = "s3cr3t-T0KEN-4711"
ADDRESS = f"http://admin:{TOKEN}@127.0.0.1:8265"
LEAKY = textwrap.dedent(f'''
    import pytest

    @pytest.mark.tiny
    def test_ok(record_property):
        record_property("cluster", {{"address": "{ADDRESS}"}})

    @pytest.mark.tiny
    def test_names_the_address():
        raise AssertionError("could not reach {ADDRESS}?token={TOKEN}")
''')


def _everything(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in root.rglob("*")
            if p.is_file() and p.suffix in (".json", ".html", ".md", ".log", ".xml")}


@pytest.mark.parametrize("runner", ["run", "pytest"])
def test_a_planted_token_reaches_no_output(tmp_path, runner):
    # seeded: --ray-address http://admin:TOKEN@host:8265 was written verbatim into report.json (`command`),
    # report.html and the console
    suites_tree(tmp_path, LEAKY)
    # the set's own junit.xml, and pytest's --junitxml of a user beside it
    extra = ["--ray-address", ADDRESS, "--junitxml", str(tmp_path / "out" / "pytest-junit.xml")]
    if runner == "run":
        proc = cli("run", "--scale", "tiny", "--report-dir", "out", "--", *extra, cwd=tmp_path,
                   env=env(HARNESS_RUN_ROOT=str(tmp_path)))  # required with a cluster address
    else:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--scale", "tiny",
                               "--report-dir", "out", *extra, "suites"], cwd=tmp_path,
                              env=env(HARNESS_RUN_ROOT=str(tmp_path)),
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    outputs = {"stdout": proc.stdout, "stderr": proc.stderr, **_everything(tmp_path / "out")}
    assert {"report.json", "report.html", "report.md", "junit.xml", "pytest-junit.xml"} <= set(outputs), sorted(outputs)
    assert (runner == "pytest") or "pytest.log" in outputs
    leaked = [name for name, text in outputs.items() if TOKEN in text]
    assert not leaked, leaked
    assert "admin" not in outputs["report.json"] and "127.0.0.1:8265" in outputs["report.json"]
    assert "could not reach" in outputs["report.json"]  # the failure is still told, without its secrets


@pytest.mark.parametrize(("text", "shown"), [
    (f"http://admin:{TOKEN}@h:8265", "http://***@h:8265"),
    (f"https://h/x?token={TOKEN}&page=2", "https://h/x?token=***&page=2"),
    (f"RAY_AUTH_TOKEN={TOKEN}", "RAY_AUTH_TOKEN=***"),
    (f"--ray-auth-token={TOKEN}", "--ray-auth-token=***"),
    (f"export HF_TOKEN={TOKEN} WANDB_API_KEY={TOKEN}", "export HF_TOKEN=*** WANDB_API_KEY=***"),
    (f"Authorization: Bearer {TOKEN}", "Authorization: Bearer ***"),
    ("step:1 - actor/pg_loss:0.5 - perf/total_num_tokens:4096", "step:1 - actor/pg_loss:0.5 - "
                                                                "perf/total_num_tokens:4096"),
])
def test_one_redaction_function(text, shown):
    from harness.redact import redact

    assert redact(text) == shown


def test_a_secret_option_value_is_redacted_in_a_command_line():
    from harness.redact import redact_argv

    assert redact_argv(["pytest", "--token", TOKEN, "--password", TOKEN, "--scale", "tiny"]) == [
        "pytest", "--token", "***", "--password", "***", "--scale", "tiny"]


def test_render_redacts_an_old_report_that_kept_a_token(tmp_path):
    import dataclasses

    from fixtures.report import make_report
    from harness.report.render import render_html, render_markdown

    report = dataclasses.replace(make_report("old", "2026-11-01T02:00:00+00:00"),
                                 command=("pytest", "--ray-address", ADDRESS))
    assert TOKEN not in render_html(report) and TOKEN not in render_markdown(report)


@pytest.mark.parametrize("planted", [".lock", ".pytest.log.new"])
def test_a_planted_symlink_in_the_report_directory_is_never_followed(tmp_path, planted):
    # seeded: run opened out/.lock and out/.pytest.log.new through planted symlinks: as root it overwrote the
    # files they pointed at
    suites_tree(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / planted).symlink_to(victim)
    proc = cli("run", "--scale", "tiny", "--report-dir", "out", cwd=tmp_path)
    if planted == ".lock":
        assert "symbolic link" in one_line_exit_2(proc, ".lock")
    else:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert victim.read_text() == "precious\n" and victim.stat().st_nlink == 1


def test_the_machine_lock_is_not_followed(tmp_path, monkeypatch):
    from harness.launch import tiny_verl

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    lock = tmp_path / "machine.lock"
    lock.symlink_to(victim)
    monkeypatch.setattr(tiny_verl, "MACHINE_LOCK", lock)
    from harness.errors import BadInput

    with pytest.raises(BadInput, match="symbolic link"):
        with tiny_verl.one_at_a_time():
            pass
    assert victim.read_text() == "precious\n"


def test_engine_says_it_imports_code(tmp_path):
    # --engine module:attr imports and runs that module by design: the README and --help say so
    from harness.cli import build_parser, subcommands

    readme = (os.path.dirname(__file__) + "/../README.md")
    text = open(readme).read()
    assert "imports and runs" in text and "--engine" in text
    lab = dict(subcommands(build_parser()))[("lab",)].format_help()
    assert "imports and runs" in " ".join(lab.split())
    plain = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--help"], cwd=tmp_path,
                           env=env(), capture_output=True, text=True, timeout=120)
    assert "imports and runs" in " ".join(plain.stdout.split())


# Issue 48: a secret under a name the redactor did not know (WANDB_KEY, *_PASS, PRIVATE_KEY, GH_PAT,
# +trainer.wandb_key) was printed, put in --json and stored as a plain env value in the K8s manifest.
SUFFIX_SECRETS = ["WANDB_KEY", "wandb_key", "SMTP_PASS", "PRIVATE_KEY", "GH_PAT", "db_passwd", "Mail-Password",
                  "AWS_SECRET", "+trainer.wandb_key", "++trainer.Wandb_Key", "OPENAI_CREDENTIAL", "ssh_private_key"]
NOT_SECRETS = ["data.prompt_key", "data.reward_fn_key", "max_num_batched_tokens", "bypass", "monkey", "compass",
               "actor_rollout_ref.rollout.balance_dp_token", "trainer.total_training_steps"]


@pytest.mark.parametrize("name", SUFFIX_SECRETS)
def test_a_secret_is_known_by_its_suffix_on_every_output(name):
    from harness.config.scales import get_scale
    from harness.launch.k8s import ENV_SECRET, _env
    from harness.redact import redact, redact_doc

    assert redact(f"x {name}={TOKEN} y") == f"x {name}=*** y"  # text: a command line, a note
    assert TOKEN not in str(redact_doc({name: TOKEN, "overrides": [f"{name}={TOKEN}"]}))  # --json
    env_var = name.lstrip("+").replace(".", "_").replace("-", "_")
    entry = next(e for e in _env(get_scale("tiny"), "/runs/x", {env_var: TOKEN}) if e["name"] == env_var)
    assert entry == {"name": env_var, "valueFrom": {"secretKeyRef": {"name": ENV_SECRET, "key": env_var}}}


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_a_setting_that_only_looks_like_a_secret_is_shown(name):
    from harness.redact import redact, redact_value

    assert redact(f"{name}=prompt") == f"{name}=prompt"
    assert redact_value(name, "prompt") == "prompt"


def test_redaction_is_linear():
    """The redaction regexes cannot backtrack quadratically: none nests a quantifier, and none whose leading
    character class repeats can start again inside a run of that class (a lookbehind guards it). The old
    `_CREDENTIALS` started a scan to the end of a word at every letter: one 300 kB word took minutes."""
    import re
    import re._constants as c
    import re._parser as sre

    from harness import redact as module

    def repeats(items, inside=False):
        for op, av in items:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                assert not inside, "a quantifier nested in a quantifier"
                repeats(av[2], inside or av[1] > 1)  # an optional group `(...)?` repeats nothing
            elif op is c.SUBPATTERN:
                repeats(av[-1], inside)
            elif op is c.BRANCH:
                for alternative in av[1]:
                    repeats(alternative, inside)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                repeats(av[1], inside)

    def unguarded(items) -> bool:
        items = list(items)
        while items and items[0][0] is c.SUBPATTERN:
            items = list(items[0][1][-1]) + items[1:]
        if not items or items[0][0] is c.ASSERT_NOT:
            return False
        if items[0][0] is c.BRANCH:
            return any(unguarded(list(alt) + items[1:]) for alt in items[0][1][1])
        leads_a_run = items[0][0] in (c.MAX_REPEAT, c.MIN_REPEAT)
        return leads_a_run or (items[0][0] is c.IN and len(items) > 1 and items[1][0] in (c.MAX_REPEAT, c.MIN_REPEAT))

    patterns = [v for v in vars(module).values() if isinstance(v, re.Pattern)]
    assert len(patterns) >= 6
    for pattern in patterns:
        parsed = sre.parse(pattern.pattern, pattern.flags)
        repeats(parsed)
        assert not unguarded(parsed), pattern.pattern
    word = "a" * 300_000  # and the property's case: a 300 kB word is kept as it is
    assert module.redact(word) == word and module.for_terminal(f"x://{word}") == f"x://{word}"
