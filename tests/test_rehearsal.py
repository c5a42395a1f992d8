"""The NPU nightly's orchestration rehearsed on this CPU: what the container, the workflow and ci/nightly.sh give a
night, checked without NPU kernels. Each case reproduces a blocker of the third NPU review and fails with its fix
reverted (the install set: tests/test_requirements.py; the batch-invariance claim: tests/test_mla_seeded.py). The
cluster cases run on a multi-node Ray cluster of this host (harness.launch.cluster): a head, a worker and a runner,
each with its own network namespace and disk, one shared directory, jobs placed on the worker."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.errors import BadInput
from harness.launch import local

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = yaml.safe_load((ROOT / ".github/workflows/nightly-npu.yml").read_text())
VERL_SUITE = ROOT / "suites/precision/test_reward_alignment.py"  # its tiny cases wait for a tiny verl run


def _nightly_commands(tmp_path: Path, **env: str) -> list[list[str]]:
    """ci/nightly.sh's commands (NIGHTLY_DRY_RUN) with the NPU job's environment from the workflow."""
    job = WORKFLOW["jobs"]["nightly"]["env"]
    base = {k: str(v).replace("${{ matrix.hardware }}", "a2") for k, v in job.items()}
    base = {k: v for k, v in base.items() if "${{" not in v}
    run_env = {**os.environ, **base, "NIGHTLY_DRY_RUN": "1", "HARDWARE": "a2", "RAY_ADDRESS": "http://head:8265",
               "TREND_STORE": str(tmp_path / "trend"), "PUBLISH_DIR": str(tmp_path / "public"),
               "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), **env}
    done = subprocess.run(["bash", str(ROOT / "ci/nightly.sh")], capture_output=True, text=True, env=run_env,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    return [shlex.split(line) for line in done.stdout.splitlines()]


def test_the_npu_container_cannot_start_the_local_ray_cluster(monkeypatch, tmp_path):
    """The vllm-ascend / CANN images have no iproute2: the loopback-only Ray cluster the tiny verl runs need cannot
    start there (one clear line, not a hang)."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv(local.ISOLATED_ENV, raising=False)
    with pytest.raises(BadInput, match="unshare and ip not found"):
        local.run_isolated(["true"])


def test_the_night_sends_the_tiny_verl_runs_to_a_cpu_runner(tmp_path):
    """Blocker 5: the NPU job passes --tiny-verl elsewhere to every tier, and a CPU job with root runs them
    (--tiny-verl only, --strict-hardware). Seeded: without TINY_VERL the tiny tier keeps them (and fails them)."""
    runs = [c for c in _nightly_commands(tmp_path) if c[:2] == ["ascend-rl-harness", "run"]]
    assert runs and all(c[c.index("--tiny-verl") + 1] == "elsewhere" for c in runs)
    seeded = [c for c in _nightly_commands(tmp_path, TINY_VERL="") if c[:2] == ["ascend-rl-harness", "run"]]
    assert not any("--tiny-verl" in c for c in seeded)
    cpu = WORKFLOW["jobs"]["tiny-verl-cpu"]
    step = next(s["run"] for s in cpu["steps"] if "--tiny-verl only" in s.get("run", ""))
    assert "sudo -E" in step and "--strict-hardware" in step and "iproute2" in step
    assert not cpu["runs-on"].startswith("linux-aarch64"), "a CPU runner, not an NPU one"
    assert "tiny-verl-cpu" in WORKFLOW["jobs"]["publish"]["needs"]


@pytest.mark.parametrize("where, kept", [("elsewhere", False), ("only", True)])
def test_tiny_verl_selection(pytester, where, kept):
    """--tiny-verl elsewhere deselects exactly the tests of a tiny verl run (named on the terminal, not skipped:
    --strict-hardware turns a skip into a failure); only keeps nothing else. Collected, not run."""
    result = pytester.runpytest_inprocess(str(VERL_SUITE), "--strict-hardware", "--tiny-verl", where,
                                          "--collect-only", "-q", "-p", "no:cacheprovider", f"--rootdir={ROOT}")
    out = result.stdout.str()
    ids = [line for line in out.splitlines() if "::" in line]
    assert f"--tiny-verl {where}:" in out and "deselected" in out, out[-2000:]
    assert ids and all(line.endswith("[tiny]") == kept for line in ids), out[-2000:]


def test_a_cluster_night_sets_a_shared_run_root(tmp_path):
    """Blocker 6: the workflow gives the night an absolute run root on the storage the cluster mounts (beside the
    models); ci/nightly.sh refuses a cluster night without one (seeded: HARNESS_RUN_ROOT unset)."""
    env = WORKFLOW["jobs"]["nightly"]["env"]
    assert env["HARNESS_RUN_ROOT"].startswith("/data/ascend-rl-harness/"), env
    assert os.path.commonpath([env["HARNESS_RUN_ROOT"], env["HARNESS_MODEL_DIR"]]) == "/data/ascend-rl-harness"
    assert env["RAY_AUTH_TOKEN"] == "${{ secrets.RAY_AUTH_TOKEN }}"
    made = [c for c in _nightly_commands(tmp_path, HARNESS_RUN_ROOT=str(tmp_path / "runs")) if c[:2] == ["mkdir",
                                                                                                      "-p"]]
    assert [str(tmp_path / "runs")] in [c[2:] for c in made]
    run_env = {**os.environ, "NIGHTLY_DRY_RUN": "1", "HARDWARE": "a2", "RAY_ADDRESS": "http://head:8265"}
    run_env.pop("HARNESS_RUN_ROOT", None)
    done = subprocess.run(["bash", str(ROOT / "ci/nightly.sh")], capture_output=True, text=True, env=run_env,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "HARNESS_RUN_ROOT" in done.stderr


def test_tox_passes_the_cluster_runs_inputs():
    """`tox -e npu -- --ray-address ...` was always refused: passenv dropped HARNESS_RUN_ROOT (the shared run root a
    cluster run requires, harness.launch.jobs.shared_run_root) and HARNESS_MODEL_DIR / HARNESS_DATA_DIR."""
    import configparser
    import fnmatch

    from harness.launch.jobs import DATA_DIR_ENV, MODEL_DIR_ENV, RUN_ROOT_ENV

    tox = configparser.ConfigParser()
    tox.read(Path(__file__).parents[1] / "tox.ini")
    passed = [p.strip() for p in tox["testenv:npu"]["passenv"].split(",")]
    for name in (RUN_ROOT_ENV, MODEL_DIR_ENV, DATA_DIR_ENV, "RAY_ADDRESS", "NPU_STACK"):
        assert any(fnmatch.fnmatchcase(name, p) for p in passed), f"tox -e npu drops {name}"


def test_tox_keeps_the_tiny_verl_runs_off_the_npu_machine():
    """Issue 46 m1: `tox -e npu` ran the tiny verl runs on the NPU machine (they need root, iproute2 and the CPU
    stack; fixtures/dapo.py turns their exit 2 into a strict failure): it passes `--tiny-verl elsewhere`, as the
    nightly's NPU job does, and the option parses as the plugin defines it."""
    import configparser

    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    (command,) = [c for c in tox["testenv:npu"]["commands"].splitlines() if c.strip().startswith("pytest")]
    argv = shlex.split(command.replace("{posargs}", ""))
    assert argv[argv.index("--tiny-verl") + 1] == "elsewhere", command
    assert WORKFLOW["jobs"]["nightly"]["env"]["TINY_VERL"] == "elsewhere"  # the same split as the nightly


def _job(proof: dict, name: str) -> dict:
    return proof["runner"]["jobs"][name]


def test_the_runner_is_a_container_without_ip_or_privileges(cluster_rehearsal):
    """The NPU container's view: no iproute2 or unshare on PATH, no capabilities, its own host name, interface and
    disk; the loopback-only local cluster refuses to start there in one line (blocker 5's premise)."""
    seen, nodes = cluster_rehearsal["runner"], cluster_rehearsal["nodes"]
    assert seen["ip"] is None and seen["unshare"] is None and seen["cap_eff"] == 0, seen
    assert seen["hostname"] == "runner" and seen["interfaces"] == ["eth0", "lo"], seen
    assert "unshare and ip not found" in seen["local_cluster"], seen["local_cluster"]
    assert len(set(nodes.values())) == 3


def test_a_job_on_the_worker_writes_where_the_runner_reads(cluster_rehearsal):
    """Blocker 6, fixed: the job's driver runs on the worker (not the runner), verl's FileLogger writes under
    HARNESS_RUN_ROOT on the shared directory, and the runner's launcher reads every step there."""
    from harness.metrics.ingest import load_run

    result, nodes = _job(cluster_rehearsal, "shared-root"), cluster_rehearsal["nodes"]
    assert result["driver_ip"] == nodes["worker"], result
    assert result["verdict"] == "succeeded" and result["ok"], result["message"]
    run_dir = Path(result["run_dir"])
    assert run_dir.is_relative_to(cluster_rehearsal["shared"]), run_dir
    assert load_run(run_dir).steps == tuple(range(1, result["total_steps"] + 1))


def test_a_run_root_only_the_runner_sees_ends_failed(cluster_rehearsal):
    """Blocker 6, reverted: the run directory resolved as before the fix (the runner's own `runs/`). The job
    succeeds on the worker and its metrics land on the worker's own disk, so the runner reads 0 steps and the
    launch ends FAILED; the CLI, with the fix, refuses a cluster address without a shared run root up front."""
    result = _job(cluster_rehearsal, "runner-local-root")
    assert result["verdict"] == "failed" and result["steps_done"] == 0, result
    assert result["message"] == f"the job exited 0 but logged 0 of {result['total_steps']} steps", result["message"]
    relative = str(Path(result["run_dir"]).relative_to("/tmp") / "metrics.jsonl")
    disks = cluster_rehearsal["disks"]
    assert relative in disks["worker"] and relative not in disks["runner"], (relative, disks)
    refused = cluster_rehearsal["runner"]["cli_without_run_root"]
    assert refused["exit"] == 2 and "HARNESS_RUN_ROOT unset" in refused["stderr"], refused


def test_verl_ray_init_on_the_worker_with_a_recipe_that_exports_determinism_variables(cluster_rehearsal):
    """Point 8: verl 0.9.1's ray.init (trainer/constants_ppo.py get_ppo_ray_runtime_env re-adds PYTHONHASHSEED,
    VLLM_BATCH_INVARIANT, NCCL_ALGO, ...) in a job driver on the worker. With those in the job's runtime env Ray 2.60
    refuses the merge (the fix reverted); in the entrypoint's environment (harness.launch.jobs.split_verl_env) it
    runs."""
    from harness.metrics.keys import JOB_LOG_FILE

    fixed, merged = (_job(cluster_rehearsal, name) for name in ("verl_env", "verl_env_merged"))
    assert fixed["driver_ip"] == merged["driver_ip"] == cluster_rehearsal["nodes"]["worker"]
    # the drivers train nothing: the fixed one exits 0 (logging no step), the seeded one dies in ray.init
    assert fixed["message"].startswith("the job exited 0"), fixed["message"]
    assert "verl ray.init: merged" in (Path(fixed["run_dir"]) / JOB_LOG_FILE).read_text()
    assert merged["verdict"] == "failed" and not merged["message"].startswith("the job exited 0"), merged["message"]
    assert "Failed to merge the Job's runtime env" in (Path(merged["run_dir"]) / JOB_LOG_FILE).read_text()


def test_the_recipe_rehearsals_verdict_and_inputs(tmp_path, capsys):
    """The fabric's recipe verdict without the fabric: one line whose word and exit agree -- a misaligned run, one
    that never ran and one that could not be judged FAIL (exit 1), an aligned one PASSes. A golden on a node's own
    /tmp goes to the shared directory (the runner's compare once said "no such file"); the checkout's recipe stays."""
    from harness.launch.cluster import _on_shared, _verdict

    def proof(launch: int, compare: dict | None) -> dict:
        return {"runner": {"recipe": {"recipe": "/r/ours.sh", "golden": "/g/tiny.json", "launch": {"exit": launch},
                                      **({"compare": compare} if compare else {})}}}

    for case, code, says in ((proof(0, {"exit": 0}), 0, "PASS"),
                             (proof(0, {"exit": 1, "failed": ["critic/rewards/mean window-mean"]}), 1, "window-mean"),
                             (proof(1, None), 1, "did not run"), (proof(0, {"exit": 2, "stderr": "no such file"}), 1,
                                                                  "was not judged")):
        assert _verdict(case) == code
        line = capsys.readouterr().out
        assert line.count("\n") == 1 and line.startswith("PASS" if code == 0 else "FAIL") and says in line, line
    import tempfile

    private = Path(tempfile.mkdtemp(dir="/tmp"))  # /tmp: each node's own disk (PRIVATE_DIRS)
    try:
        golden = private / "tiny.json"
        golden.write_text("{}")
        shared = tmp_path / "shared"
        moved = _on_shared({"recipe": str(ROOT / "tests/recipes/seed002_a3_grpo.sh"), "golden": str(golden),
                            "recipe_env": []}, shared)
    finally:
        shutil.rmtree(private)
    assert moved["recipe"] == str(ROOT / "tests/recipes/seed002_a3_grpo.sh")
    assert Path(moved["golden"]).parent == shared / "inputs" and Path(moved["golden"]).read_text() == "{}"


@pytest.mark.fabric
def test_your_recipe_on_the_multi_node_rehearsal(tmp_path):
    """Issue 45: a team's recipe the harness did not write (seed 002's cann-recipes-train script) through the
    multi-node rehearsal, as `ci/nightly.sh --recipe R --golden G` runs it on a CPU night. Its golden is recorded
    from its own tiny rehearsal on a local cluster (`launch --local`, `baseline record`); then the fabric's
    unprivileged runner launches R with the CLI onto the cluster, its GPU-placed workers on the worker, the run
    directory on the shared storage, and judges the run against that golden: PASS, exit 0. Opt in (-m fabric): two tiny
    verl runs, ~15 min on 2 cores."""
    import json
    import sys

    from harness.metrics.ingest import load_run

    recipe = ROOT / "tests/recipes/seed002_a3_grpo.sh"
    missing = local.isolation_missing()
    if missing:
        pytest.skip(missing)
    cli = [sys.executable, "-m", "harness.cli"]
    reference = tmp_path / "reference"
    done = subprocess.run([*cli, "launch", "--scale", "tiny", "--local", "--recipe", str(recipe), "--run-dir",
                           str(reference)], capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    golden = tmp_path / "tiny.json"
    done = subprocess.run([*cli, "baseline", "record", str(reference), "--out", str(golden), "--keep-flagged"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    fabric = tmp_path / "fabric"
    done = subprocess.run([sys.executable, "-m", "harness.launch.cluster", "--out", str(fabric), "--recipe",
                           str(recipe), "--golden", str(golden)], capture_output=True, text=True, timeout=3000,
                          cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith("PASS multi-node rehearsal"), (done.stdout + done.stderr
                                                                                         )[-3000:]
    proof = json.loads((fabric / "cluster.json").read_text())
    seen = proof["runner"]["recipe"]
    assert seen["launch"]["exit"] == 0 and seen["compare"]["passed"] is True, seen
    run_dir = Path(seen["run_dir"])
    assert run_dir.is_relative_to(proof["shared"]) and load_run(run_dir).steps, run_dir
    assert proof["runner"]["cap_eff"] == 0 and proof["runner"]["ip"] is None  # the NPU container's view
