"""One verdict per output: every command takes --json, and what it prints is one JSON document with a top-level
`passed` (bool) and `state` (str) that agree with its exit code (0 exactly when passed). Seeded by what the harness
did before: `throughput --json` printed `verdict: null` while exiting 1 on a baseline regression, and `compare
--json` carried `ok`, `aligned` and `state` that could disagree. The table of cases must name every command the
parser registers, so a new command without a JSON verdict fails here."""
from __future__ import annotations

import json
import textwrap

import pytest
from faults import write_runs

from harness.cli import build_parser, main, subcommands

SUITE = textwrap.dedent('''
    import pytest

    @pytest.mark.tiny
    def test_ok():
        pass

    @pytest.mark.tiny
    def test_broken():
        assert 1 == 2, "seeded failure"
''')


def _leaves() -> set[str]:
    """Every runnable (sub)command: `baseline` only groups `baseline record`."""
    found = {" ".join(path): child for path, child in subcommands(build_parser())}
    return {name for name, child in found.items() if not any(other.startswith(name + " ") for other in found)}


def _inputs(root):
    """Real inputs for each command, made once: verl FileLogger runs, a bad run, a golden, reports, a suites tree."""
    runs = write_runs(root / "runs", n=4)
    bad = root / "runs" / "bad.jsonl"
    bad.write_text("".join(json.dumps({"step": s, "data": {
        "critic/rewards/mean": 0.9 - 0.05 * s, "timing_s/step": 20.0, "perf/total_num_tokens": 5000.0,
        "perf/throughput": 25.0}}) + "\n" for s in range(1, 21)))  # half the reference runs' speed, on 10 devices
    (root / "suites").mkdir()
    (root / "suites" / "test_json_tree.py").write_text(SUITE)
    from fixtures.report import make_report
    from harness.report.schema import write_report

    good = write_report(make_report("good", "2026-11-01T02:00:00+00:00", tps=120.0), root / "good.json")
    failed = write_report(make_report("failed", "2026-11-02T02:00:00+00:00", tps=120.0, failing=True),
                          root / "failed.json")
    return {"runs": runs, "bad": str(bad), "good": str(good), "failed": str(failed)}


def _cases(root, inputs) -> dict[str, list[tuple[list[str], int | None]]]:
    """command -> [(argv, the exit code it must give, or None where the machine decides)]."""
    runs, out = inputs["runs"], str(root / "out")
    return {
        "run": [(["run", "--scale", "tiny", "--report-dir", out + "/run-ok", "--json", "--", "-k", "test_ok"], 0),
                (["run", "--scale", "tiny", "--report-dir", out + "/run-bad", "--json"], 1),
                (["run", "--scale", "tiny", "--report-dir", out + "/run-none", "--json", "--", "-k", "nothing"], 1)],
        "scales": [(["scales", "--json"], 0)],
        "plan": [(["plan", "--scale", "tiny", "--json"], 0)],
        "memory": [(["memory", "--scale", "tiny", "--json"], 0),
                   (["memory", "--scale", "full-a2-gbs32", "--micro-batch", "12", "--json"], 1)],  # logits OOM
        "compare": [(["compare", runs[0], *runs[1:], "--json"], 0), (["compare", inputs["bad"], *runs, "--json"], 1)],
        "baseline record": [(["baseline", "record", *runs, "--out", out + "/golden.json", "--json"], 0)],
        "throughput": [(["throughput", runs[0], "--hardware", "a2", "--devices", "10", "--json"], 0),
                       (["throughput", runs[0], "--hardware", "a2", "--devices", "10", "--target", "1e6", "--json"], 1),
                       # the seeded case: a baseline regression, exit 1, with `verdict: null` and no `passed`
                       (["throughput", inputs["bad"], "--hardware", "a2", "--devices", "10", "--baseline", runs[0],
                         "--json"], 1)],
        "report": [(["report", inputs["good"], "-o", out + "/pages-ok", "--json"], 0),
                   (["report", inputs["good"], inputs["failed"], "-o", out + "/pages-bad", "--json"], 1)],
        "launch": [(["launch", "--scale", "full-a3", "--k8s", "--json"], 0)],
        "doctor": [(["doctor", "--json"], None)],
        "lab": [(["lab", "--steps", "1", "--gbs", "2", "--n", "2", "--out", out + "/lab", "--json"], 0)],
        # a real gate's document (two `run`s, ~40 s) is held to this contract by tests/test_gate.py's _gate, on its
        # seeded BROKEN gate (exit 1) and its SAFE reference (exit 0)
        "gate": [(["gate", "--dry-run", "--from", "vllm-ascend-0.20.2rc1", "--to", "vllm-ascend-0.23.0", "--json"], 0)],
    }


def test_every_command_prints_one_verdict_that_its_exit_code_agrees_with(tmp_path, monkeypatch, capsys):
    inputs = _inputs(tmp_path)
    cases = _cases(tmp_path, inputs)
    assert set(cases) == _leaves(), "a command without a JSON verdict case: " + str(_leaves() ^ set(cases))
    monkeypatch.chdir(tmp_path)  # `run` finds the suites tree here
    seen = {}
    for command, runs in cases.items():
        for argv, expected in runs:
            capsys.readouterr()
            code = main(argv)
            out = capsys.readouterr().out
            try:
                doc = json.loads(out)  # stdout holds the JSON and nothing else (progress goes to stderr)
            except ValueError:
                pytest.fail(f"{' '.join(argv)}: stdout is not one JSON document: {out[:500]!r}")
            assert isinstance(doc.get("passed"), bool) and isinstance(doc.get("state"), str) and doc["state"], argv
            assert list(doc)[:2] == ["passed", "state"], (argv, list(doc)[:4])  # the verdict first
            assert code == (0 if doc["passed"] else 1), (argv, code, doc["passed"], doc["state"])
            if expected is not None:
                assert code == expected, (argv, code, doc["state"])
            seen.setdefault(command, []).append(doc["state"])
    assert seen["throughput"] == ["NOT JUDGED", "BELOW TARGET", "REGRESSED"], seen["throughput"]
    assert seen["run"] == ["PASS", "FAIL", "NO TESTS"] and seen["memory"] == ["FITS", "DOES NOT FIT"]
    assert seen["compare"] == ["ALIGNED", "MISALIGNED"] and seen["report"] == ["PASS", "FAIL"]


def test_a_launch_result_is_a_verdict_document():
    # a real launch needs a Ray cluster (tests/test_launch_local.py runs them); its JSON is LaunchResult's
    import dataclasses

    from harness.cli.output import verdict
    from harness.launch.ray_job import LaunchResult

    for state, steps, ok in (("succeeded", 3, True), ("failed", 2, False), ("timeout", 1, False)):
        result = LaunchResult(state, "job", "/r", "m", steps, 3, 1.0, "http://h:8265")
        doc = verdict(result.ok, result.verdict.upper(), dataclasses.asdict(result))
        assert doc["passed"] is ok and doc["state"] == state.upper() and list(doc)[:2] == ["passed", "state"]
