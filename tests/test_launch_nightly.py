"""The nightly CI is well-formed: the workflow parses and runs ci/nightly.sh on verl's Ascend runner
labels; the script passes `bash -n`, runs the tiers in order with --strict-hardware, stores report JSON
in the trend store and publishes HTML; its failure lines name suite, metric and step."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.scales import TIERS, get_scale
from harness.report.nightly import main

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "nightly.sh"
WORKFLOW = ROOT / ".github" / "workflows" / "nightly-npu.yml"


def test_workflow_parses_and_runs_the_script_on_ascend_runners():
    doc = yaml.safe_load(WORKFLOW.read_text())
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert triggers["schedule"][0]["cron"] and "workflow_dispatch" in triggers
    job = doc["jobs"]["nightly"]
    runners = {row["runner"] for row in job["strategy"]["matrix"]["include"]}
    assert runners == {"linux-aarch64-a2b3-8", "linux-aarch64-a3-16"}  # A2: verl #5578
    assert {row["hardware"] for row in job["strategy"]["matrix"]["include"]} == {"a2", "a3"}
    runs = [step.get("run", "") for step in job["steps"]]
    assert any(r.strip() == "bash ci/nightly.sh" for r in runs)
    # the install step is the README's (scripts/install-npu-stack, which installs the harness itself last)
    assert any("npu-smi info" in r for r in runs) and any('scripts/install-npu-stack "$NPU_STACK"' in r for r in runs)
    assert job["env"]["TREND_STORE"].startswith("/data/") and "publish" in doc["jobs"]
    # each tier's JUnit XML (collected by the script into reports/nightly-*/junit/) becomes a check run, whatever
    # the night's verdict; the step summary is the script's (GITHUB_STEP_SUMMARY)
    junit = [s for s in job["steps"] if "junit" in str(s.get("uses", ""))]
    assert len(junit) == 1 and junit[0]["if"] == "always()", junit
    assert junit[0]["with"]["report_paths"] == "reports/nightly-*/junit/*.xml"
    assert doc["permissions"]["checks"] == "write"
    # a dispatched night runs the team's recipe against its goldens (ci/nightly.sh RECIPE / GOLDEN_DIR), as does the
    # CPU job's tiny rehearsal of it
    assert {"recipe", "golden_dir"} <= set(triggers["workflow_dispatch"]["inputs"])
    for env in (job["env"], doc["jobs"]["tiny-verl-cpu"]["steps"][-2]["env"]):
        assert "inputs.recipe" in env["RECIPE"] and "inputs.golden_dir" in env["GOLDEN_DIR"], env
    cpu_run = doc["jobs"]["tiny-verl-cpu"]["steps"][-2]["run"]
    assert '--recipe "$RECIPE"' in cpu_run and '--golden "$GOLDEN_DIR/tiny.json"' in cpu_run


def test_script_is_valid_bash():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.parametrize("hardware", ["a2", "a3"])
def test_tiers_in_order_strict_trend_and_publish(hardware, tmp_path):
    env = {**os.environ, "NIGHTLY_DRY_RUN": "1", "HARDWARE": hardware, "RAY_ADDRESS": "http://head:8265",
           "HARNESS_RUN_ROOT": str(tmp_path / "runs"),  # required with RAY_ADDRESS
           "TREND_STORE": str(tmp_path / "trend"), "PUBLISH_DIR": str(tmp_path / "public"),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary.md")}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    commands = [shlex.split(line) for line in done.stdout.splitlines()]
    runs = [c for c in commands if c[:2] == ["ascend-rl-harness", "run"]]
    scales = [c[c.index("--scale") + 1] for c in runs]
    tiers = [get_scale(s).tier for s in scales]
    assert tiers == sorted(tiers, key=TIERS.index) and tiers[0] == "tiny" and tiers[-1] == "full", tiers
    if hardware == "a2":
        assert tiers == list(TIERS)
    for c in runs:
        assert "--strict-hardware" in c and c[c.index("--hardware") + 1] == hardware
        assert c[c.index("--ray-address") + 1] == "http://head:8265"
        scale = get_scale(c[c.index("--scale") + 1])
        assert scale.tier in ("tiny", "layer") or scale.hardware.name == hardware, f"{scale.name} on {hardware}"
    copied = [c for c in commands if c[0] == "cp" and str(tmp_path / "trend") in c[-1]]
    assert len(copied) == len(scales) and all(c[1].endswith("report.json") for c in copied)
    stored = [c for c in commands if c[0] == "mv" and str(tmp_path / "trend") in c[-1]]  # atomic: copy, then rename
    assert [c[1] for c in stored] == [c[2] for c in copied] and all(c[2].endswith(".json") for c in stored)
    reports = [c for c in commands if c[:2] == ["ascend-rl-harness", "report"]]
    assert len(reports) == len(scales) and all(c[3].startswith(str(tmp_path / "public")) for c in reports)
    # JUnit: every tier's junit.xml (a link into its generation: -L) collected as <scale>.xml for the CI test view
    junit = [c for c in commands if c[:2] == ["cp", "-L"] and c[2].endswith("/junit.xml")]
    assert [c[3].rsplit("/", 1)[-1] for c in junit] == [f"{s}.xml" for s in scales]
    assert all(re.fullmatch(r"reports/nightly-[0-9TZ]+/junit/[\w-]+\.xml", c[3]) for c in junit), junit
    # the step summary: each tier's report, then each trend, appended through harness.report.nightly (redacted)
    summary = [c for c in commands if c[:4] == ["python3", "-m", "harness.report.nightly", "--summary"]]
    assert all(c[4] == str(tmp_path / "step-summary.md") for c in summary) and len(summary) == 2 * len(scales)
    assert [c[5].rsplit("/", 2)[-2:] for c in summary] == [[s, "report.json"] for s in scales] + [
        [s, "trend.md"] for s in scales]


def test_unknown_hardware_is_bad_input(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "NIGHTLY_DRY_RUN": "1", "HARDWARE": "h100"})
    assert done.returncode == 2 and "HARDWARE=h100" in done.stderr


def _report(tmp_path, tests, exit_status=1, job=None):
    from harness.report.schema import SCHEMA, SCHEMA_VERSION, RunReport, TestVerdict, machine_info, write_report

    report = RunReport(schema=SCHEMA, schema_version=SCHEMA_VERSION, created="2026-11-29T00:00:00Z", name="nightly",
                       commit=None, dirty=None, scale="reduced-a2", plan=None, command=(), machine=machine_info(),
                       tests=tuple(TestVerdict(*t) for t in tests), duration_s=1.0, exit_status=exit_status, job=job)
    return write_report(report, tmp_path / "report.json")


def test_failure_lines_name_suite_metric_and_step(tmp_path, capsys):
    # the metric and place come from the findings the `expect` fixture recorded, never from the message text
    band = {"check": "curves.band", "metric": "critic/rewards/mean", "where": "step 12",
            "message": "3 of 10 steps outside the band; worst step 12: -0.8 vs -0.6"}
    stale = {"check": "mla.freshness", "metric": "W_UV", "where": "layer 1",
             "message": "layer 1 W_UV: 4/4 elements off"}
    path = _report(tmp_path, [
        ("suites/precision/test_curves.py::test_reward_curve", "failed", 1.0,
         "AssertionError: the message text may name anything, e.g. perf/throughput at step 99", (),
         {"findings": [band]}),
        ("suites/perf/test_throughput.py::test_tps", "passed", 1.0, ""),
        ("suites/functional/test_sync.py::test_sync", "failed", 1.0, "W_UV stale", (), {"findings": [stale]}),
        ("suites/memory/test_phases.py::test_fit", "error", 1.0, "BadInput: baselines/a2: no such file"),
    ])
    assert main([str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("FAIL reduced-a2 suites/precision/test_curves.py::test_reward_curve metric critic/rewards/mean "
                        "step 12: 3 of 10 steps outside the band; worst step 12: -0.8 vs -0.6")
    assert lines[1].startswith("FAIL reduced-a2 suites/functional/test_sync.py::test_sync metric W_UV layer 1:")
    assert lines[2] == ("FAIL reduced-a2 suites/memory/test_phases.py::test_fit metric - -: "
                        "BadInput: baselines/a2: no such file")
    assert len(lines) == 3


def test_passing_report_is_one_pass_line(tmp_path, capsys):
    path = _report(tmp_path, [("suites/functional/test_x.py::test_y", "passed", 1.0, "")], exit_status=0)
    assert main([str(path)]) == 0
    assert re.match(r"PASS reduced-a2: 1 passed, 0 skipped", capsys.readouterr().out)


def test_step_summary_appends_the_markdown_redacted(tmp_path, capsys):
    token = "s3cr3t-T0KEN-4711"
    path = _report(tmp_path, [("suites/functional/test_x.py::test_y", "failed", 1.0,
                               f"could not reach http://admin:{token}@head:8265")])
    (tmp_path / "trend.md").write_text(f"## trend\n- newest night lost 43 tests; RAY_AUTH_TOKEN={token}\n")
    summary = tmp_path / "summary.md"
    assert main(["--summary", str(summary), str(path)]) == 1
    assert main(["--summary", str(summary), str(tmp_path / "trend.md")]) == 0
    text = summary.read_text()
    assert text.startswith("## ascend-rl-harness nightly: ") and "test_y" in text and "newest night lost 43" in text
    assert token not in text and "RAY_AUTH_TOKEN=***" in text
    assert "FAIL reduced-a2 suites/functional/test_x.py::test_y" in capsys.readouterr().out


def _dry_night(tmp_path, **env):
    base = {**os.environ, "NIGHTLY_DRY_RUN": "1", "HARDWARE": "a2", "TREND_STORE": str(tmp_path / "trend"),
            "PUBLISH_DIR": str(tmp_path / "public"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=tmp_path, env={**base, **env})
    return done, [shlex.split(line) for line in done.stdout.splitlines()]


def test_the_night_runs_your_recipe_against_your_goldens_and_keys_the_trend_by_it(tmp_path):
    """RECIPE + GOLDEN_DIR: every tier runs the team's recipe (`--recipe`), judged against the golden recorded from
    that recipe for the tier, never the harness's own baselines; the trend store keys the nights by the recipe."""
    recipe = tmp_path / "our dapo.sh"
    recipe.write_text("python3 -m verl.trainer.main_ppo trainer.total_training_steps=5\n")
    goldens = tmp_path / "goldens"
    goldens.mkdir()
    (goldens / "tiny.json").write_text("{}")
    done, commands = _dry_night(tmp_path, RECIPE=str(recipe), GOLDEN_DIR=str(goldens), MODEL_PATH="/shared/dsv3",
                                RECIPE_ENV="MODEL=/m NODES=8")
    assert done.returncode == 0, done.stderr
    runs = [c for c in commands if c[:2] == ["ascend-rl-harness", "run"]]
    # `run`'s own flags, before the `--` (run checks them before the tier starts), never pytest's after it
    job = [c[:c.index("--")] for c in runs]
    assert runs and all(c[c.index("--recipe") + 1] == str(recipe) for c in job)
    assert all(c[c.index("--model-path") + 1] == "/shared/dsv3" for c in job)
    assert all([c[i + 1] for i, w in enumerate(c) if w == "--recipe-env"] == ["MODEL=/m", "NODES=8"] for c in job)
    by_scale = {c[c.index("--scale") + 1]: c for c in job}
    assert by_scale["tiny"][by_scale["tiny"].index("--golden") + 1] == str(goldens / "tiny.json")
    # a tier with no golden of this recipe gets none (its curve test then skips, a failure under strict): never
    # the harness's baselines/, recorded from another job
    assert all("--golden" not in c for s, c in by_scale.items() if s != "tiny")
    assert not any("--baseline" in c or "--recipe" in c[c.index("--"):] for c in runs)
    stored = [c[-1] for c in commands if c[0] == "mv"]
    assert stored and all("/tiny-our_dapo.sh/" in p or "-our_dapo.sh/" in p for p in stored), stored


def test_a_recipe_that_is_not_a_file_stops_the_night_up_front(tmp_path):
    done, _ = _dry_night(tmp_path, RECIPE=str(tmp_path / "missing.sh"))
    assert done.returncode == 2 and "RECIPE=" in done.stderr and done.stderr.count("\n") == 1


def test_the_night_takes_your_recipe_and_golden_as_flags(tmp_path):
    """Issue 45: `ci/nightly.sh --recipe R --golden G` (the variables' flags, a flag winning): a golden file judges a
    night of one scale, a directory holds one per tier, a --recipe-env value may hold spaces, and the words after
    `--` reach every tier's pytest. Relative paths are read from where the night was started."""
    recipe = tmp_path / "ours.sh"
    recipe.write_text("python3 -m verl.trainer.main_ppo trainer.total_training_steps=5\n")
    golden = tmp_path / "tiny-golden.json"
    golden.write_text("{}")

    def night(*argv, **env):
        base = {**os.environ, "NIGHTLY_DRY_RUN": "1", "HARDWARE": "a2", "TREND_STORE": str(tmp_path / "trend"),
                "PUBLISH_DIR": str(tmp_path / "public"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), **env}
        done = subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True, cwd=tmp_path, env=base)
        runs = [shlex.split(line) for line in done.stdout.splitlines()]
        return done, [c for c in runs if c[:2] == ["ascend-rl-harness", "run"]]

    done, (run,) = night("--recipe", "ours.sh", "--golden", "tiny-golden.json", "--recipe-env", "MODEL=/a b",
                         "--", "-k", "reward_alignment", SCALES="tiny", RECIPE="elsewhere.sh")
    assert done.returncode == 0, done.stderr
    own, pytest_args = run[:run.index("--")], run[run.index("--") + 1:]
    assert own[own.index("--recipe") + 1] == str(recipe) and own[own.index("--golden") + 1] == str(golden)
    assert own[own.index("--recipe-env") + 1] == "MODEL=/a b"
    assert pytest_args[-2:] == ["-k", "reward_alignment"] and "--strict-hardware" in pytest_args
    goldens = tmp_path / "goldens"
    goldens.mkdir()
    (goldens / "layer.json").write_text("{}")
    done, runs = night("--recipe", str(recipe), "--golden", str(goldens))
    by_scale = {c[c.index("--scale") + 1]: c[:c.index("--")] for c in runs}
    assert done.returncode == 0 and by_scale["layer"][by_scale["layer"].index("--golden") + 1] == str(
        goldens / "layer.json")
    assert all("--golden" not in c for s, c in by_scale.items() if s != "layer")
    # refused up front, one line each, no tier run: a file golden for several scales, a missing golden, a flag
    # without its value, an unknown flag
    for argv, says in ((["--golden", str(golden)], "one file for the scales"),
                       (["--golden", str(tmp_path / "none.json")], "neither a file nor a directory"),
                       (["--recipe"], "--recipe needs a value"), (["--goldn", "x"], "unknown argument --goldn")):
        done, runs = night(*argv)
        assert done.returncode == 2 and says in done.stderr and done.stderr.count("\n") == 1 and not runs, argv


def test_a_cpu_night_on_your_recipe_runs_it_through_the_multi_node_rehearsal(tmp_path):
    """Issue 45: on a CPU night with a recipe, after the tiers, the recipe's tiny rehearsal goes through the
    multi-node rehearsal (harness.launch.cluster), judged against the tiny golden, with --recipe-env's values;
    FABRIC=0 leaves it out, and a night whose tiers failed books no fabric. (The fabric itself: the opt-in
    tests/test_rehearsal.py::test_your_recipe_on_the_multi_node_rehearsal.)"""
    recipe = tmp_path / "ours.sh"
    recipe.write_text("python3 -m verl.trainer.main_ppo trainer.total_training_steps=5\n")
    golden = tmp_path / "tiny.json"
    golden.write_text("{}")
    argv = ["--recipe", str(recipe), "--golden", str(golden), "--recipe-env", "MODEL=/a b"]

    def fabric(**env):
        done = subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True, cwd=tmp_path, env={
            **os.environ, "NIGHTLY_DRY_RUN": "1", "HARDWARE": "cpu", "SCALES": "tiny",
            "TREND_STORE": str(tmp_path / "trend"), "PUBLISH_DIR": str(tmp_path / "public"), **env})
        assert done.returncode == 0, done.stderr
        return [c for c in map(shlex.split, done.stdout.splitlines()) if c[1:3] == ["-m", "harness.launch.cluster"]]

    (command,) = fabric()
    assert command[command.index("--recipe") + 1] == str(recipe) and command[command.index("--golden") + 1] == str(
        golden) and command[command.index("--recipe-env") + 1] == "MODEL=/a b"
    assert command[command.index("--out") + 1].endswith("/fabric")
    assert fabric(FABRIC="0") == [] and fabric(HARDWARE="a2") == []


def test_a_night_on_your_recipe_names_it_and_its_golden(tmp_path, capsys):
    """Issue 45: the verdict lines, the step summary and the page of a night on a team's recipe name the recipe and
    the golden it was judged against (with their hashes, and --recipe-env's names without their values)."""
    from harness.report.render import render_html
    from harness.report.schema import load_report

    job = {"recipe": "/ci/ours.sh", "recipe_sha256": "ab" * 32, "recipe_env": ["MODEL"], "model_path": None,
           "golden": "/ci/goldens/reduced-a2.json", "golden_sha256": "cd" * 32}
    path = _report(tmp_path, [("suites/precision/test_reward_alignment.py::test_reward_curve_aligns_with_baseline",
                               "failed", 1.0, "reward curve outside the band")], job=job)
    summary = tmp_path / "summary.md"
    assert main(["--summary", str(summary), str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("JOB reduced-a2 recipe /ci/ours.sh (sha256 abababababab) \u00b7 with MODEL set \u00b7 "
                        "golden /ci/goldens/reduced-a2.json (sha256 cdcdcdcdcdcd)"), lines
    assert lines[1].startswith("FAIL reduced-a2 suites/precision/test_reward_alignment.py::")
    assert "recipe /ci/ours.sh" in summary.read_text() and "golden /ci/goldens/reduced-a2.json" in summary.read_text()
    report = load_report(path)
    assert report.job == job
    page = render_html(report)
    assert 'id="job"' in page and "/ci/ours.sh" in page and "/ci/goldens/reduced-a2.json" in page
    assert page.index('id="job"') < page.index('id="failures"')  # on the first screen, above the failures


def test_a_real_night_on_your_recipe_fails_when_its_curves_leave_your_golden(tmp_path, tiny_lab_run):
    """Issue 45, end to end on this CPU (HARDWARE=cpu, not a dry run): `ci/nightly.sh --recipe R --golden G` runs the
    tiny tier's reward-alignment verdict for a recipe the harness did not write (seed 002's cann-recipes-train
    script) on a finished run of the job (`-- --run-dir`), against the golden recorded from that job's runs (the
    lab's, baselines/tiny/dapo_lab.json). The session's clean lab run passes the night; a run whose advantage is
    zeroed from step 3 (it stops learning) fails it, and the verdict lines, the summary and the report name the
    recipe and the golden; the trend is keyed by the recipe."""
    from harness.lab import LabConfig, run_lab

    recipe = ROOT / "tests/recipes/seed002_a3_grpo.sh"
    golden = ROOT / "baselines/tiny/dapo_lab.json"
    harness = Path(sys.executable).with_name("ascend-rl-harness")

    def night(run_dir: Path, name: str):
        # FABRIC=0: the recipe's tiny verl run on the multi-node rehearsal is ~10 min (the opt-in test runs it)
        env = {**os.environ, "HARDWARE": "cpu", "SCALES": "tiny", "FABRIC": "0",
               "REPORTS_DIR": str(tmp_path / name / "reports"),
               "TREND_STORE": str(tmp_path / name / "trend"), "PUBLISH_DIR": str(tmp_path / name / "public"),
               "GITHUB_STEP_SUMMARY": str(tmp_path / name / "summary.md"), "HARNESS": str(harness),
               "PYTHON": sys.executable}
        done = subprocess.run(["bash", str(SCRIPT), "--recipe", str(recipe), "--golden", str(golden), "--",
                               str(ROOT / "suites/precision/test_reward_alignment.py"), "-k",
                               "test_reward_curve_aligns_with_baseline", "--run-dir", str(run_dir)],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
        (report,) = (tmp_path / name / "reports").glob("nightly-*/tiny/report.json")
        return done, json.loads(report.read_text())

    done, report = night(Path(tiny_lab_run.meta.sources[0]).parent, "clean")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert report["job"]["recipe"] == str(recipe) and report["job"]["golden"] == str(golden)
    assert report["plan"]["scale"] == "tiny" and any("kl" in o for o in report["plan"]["overrides"])  # R's job
    power = report["tests"][0]["properties"]["curves.power"]  # the golden's MDE table, in the report (issue 43)
    assert power["weak"] in (True, False) and power["critic/rewards/mean window-mean"]["mde"] > 0, power
    stopped = run_lab(LabConfig(steps=30, seed=1234, fault="zero-advantage"), tmp_path / "stopped")
    done, report = night(stopped, "stopped")
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    (test,) = report["tests"]
    assert test["outcome"] == "failed" and test["nodeid"].endswith("test_reward_curve_aligns_with_baseline[tiny]")
    lines = done.stdout.splitlines()
    assert any(line.startswith(f"JOB tiny recipe {recipe} (sha256 ") and f"golden {golden} (sha256 " in line
               for line in lines), done.stdout[-2000:]
    assert sum(line.startswith("FAIL tiny suites/precision/test_reward_alignment.py::") for line in lines) >= 2
    summary = (tmp_path / "stopped" / "summary.md").read_text()
    assert str(recipe) in summary and str(golden) in summary
    assert (tmp_path / "stopped" / "trend" / f"tiny-{recipe.name}").is_dir()
