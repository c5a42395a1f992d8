"""The command line as a new user meets it: every subcommand's --help has a
description, an example and its exit codes; --version; bad options and closed pipes end in one line or silence."""
from __future__ import annotations

import subprocess
import sys

import pytest

from harness import __version__
from harness.cli import PROG, build_parser, main, subcommands
from harness.cli.help import HELP

COMMANDS = [" ".join(path) for path, _ in subcommands(build_parser())]


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_every_subcommand_is_documented():
    # a new subcommand without an entry in harness/cli/help.py fails here (seeded: the parser's own list)
    assert {"run", "scales", "plan", "memory", "compare", "baseline record", "throughput", "report", "launch",
            "doctor", "lab"} <= set(COMMANDS)
    assert set(COMMANDS) <= set(HELP), sorted(set(COMMANDS) - set(HELP))


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_description_example_and_exit_codes(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = _help(capsys, command)
    doc = HELP[command]
    assert doc.description.split()[0] in out and f"example:\n  {doc.example}" in out, out
    assert f"ascend-rl-harness {command}" in doc.example  # the example runs the command it documents
    codes = out.split("exit codes:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in codes][-3:] == ["2", "130", "141"] and codes[0].strip().startswith("0 "), out
    description = out.split("\n\n")[1]  # after the usage block
    assert all(len(line) <= 80 for line in description.splitlines()), description


def test_version_and_scales_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"{PROG} {__version__}"
    out = _help(capsys, "scales")
    assert "List the registered scales" in out and "tier" in out and "--scale" in out


def test_lab_is_a_subcommand_with_its_defaults(capsys, monkeypatch):
    from harness.lab import LabConfig

    monkeypatch.setenv("COLUMNS", "200")
    out = _help(capsys, "lab")
    for option, value in (("--steps", LabConfig.steps), ("--seed", LabConfig.seed), ("--gbs", LabConfig.gbs),
                          ("--n", LabConfig.n), ("--mini-batch", LabConfig.ppo_mini_batch_size)):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(option + " "))
        assert f"(default {value}" in line, line
    assert "rollout or trainer fault to inject (default none" in out


@pytest.mark.parametrize("argv, option", [
    (["lab", "--steps", "0", "--out", "x"], "--steps"), (["lab", "--n", "1", "--out", "x"], "--n"),
    (["lab", "--gbs", "-2", "--out", "x"], "--gbs"), (["lab", "--mini-batch", "0", "--out", "x"], "--mini-batch"),
    (["launch", "--scale", "tiny", "--k8s", "--timeout", "nan"], "--timeout"),
    (["launch", "--scale", "tiny", "--k8s", "--timeout", "-1"], "--timeout"),
    (["throughput", "run.jsonl", "--devices", "x"], "--devices"), (["plan"], "--scale"), (["nope"], "nope"),
    (["launch", "--scale", "full-a3", "--k8s", "--pvc", "Shared_PVC"], "--pvc")])
def test_bad_options_are_one_line_exit_2(argv, option, capsys):
    # argparse's own complaints too: one line (not a usage block) and exit 2 returned, not raised
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and option in err and err.startswith(PROG), err


@pytest.mark.parametrize("argv", [["plan", "--scale", "full-a3", "--json"], ["plan", "--scale", "full-a3"],
                                  ["memory", "--scale", "full-a3", "--json"], ["memory", "--scale", "full-a3"]])
def test_a_closed_pipe_exits_quietly(argv):
    # `ascend-rl-harness plan ... | true`: the reader is gone before the command writes (both print paths: plain
    # print and rich's console)
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b"", err.decode()


def test_compare_table_keeps_metric_names_whole_at_80_columns(tmp_path, capsys, monkeypatch):
    # the table once folded `critic/rewards/mea|n` at 80 columns (a CI log's width)
    import json

    monkeypatch.setenv("COLUMNS", "80")
    names = ("critic/rewards/mean", "training/rollout_probs_diff_mean")
    paths = []
    for i in range(4):
        path = tmp_path / f"r{i}.jsonl"
        path.write_text("".join(json.dumps({"step": s, "data": {names[0]: 0.05 * s + 0.01 * i,
                                                                names[1]: 0.001 * (1 + 0.1 * i)}}) + "\n"
                                for s in range(1, 21)))
        paths.append(str(path))
    assert main(["compare", *paths]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    # a verdict in a few lines, not a table whose detail column folds 8 verdicts into 67 lines (25 into ~140)
    verdicts = [line for line in lines if line.split() and line.split()[0] in names]
    assert len(lines) <= 3 * len(verdicts) + 4, "\n".join(lines)
    for name in names:
        assert any(line.split() and line.split()[0] == name for line in lines), "\n".join(lines)
