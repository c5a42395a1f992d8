"""Self-tests of the launcher pieces that need no cluster: verdicts, the job a scale submits, progress
read from a growing FileLogger jsonl, the K8s manifest (parsed with yaml), and the CLI's bad input."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.config.recipe import dapo_recipe
from harness.config.scales import SCALES, get_scale
from harness.errors import BadInput
from harness.launch.jobs import job_for_scale
from harness.launch.k8s import NPU_RESOURCE, manifest_yaml
from harness.launch.ray_job import MISSES_TO_DEAD, JobSpec, NodeWatch, read_progress, verdict


def _missed(watch, alive, times=MISSES_TO_DEAD):
    for _ in range(times):
        watch.observe(alive)


def test_a_node_dying_before_the_job_is_placed_is_only_suspect():
    # the CI proof's race: the victim node died while the lab job was still pending, and the lab job -- placed on
    # the head a moment later, and fine -- was called node-lost
    watch = NodeWatch(frozenset({"head", "victim"}))
    _missed(watch, {"head"})
    assert watch.lost(ended=False) == ()  # pending, placement unknown: wait
    assert watch.lost(ended=True) == ("victim",)  # ended unplaced (failed / timed out): the lost node is why
    watch.job_nodes |= {"head"}
    assert watch.lost(ended=True) == ()  # placed on the head: the victim's death is not this job's
    on_victim = NodeWatch(frozenset({"head", "victim"}), job_nodes={"victim"})
    on_victim.observe(None)  # the cluster did not answer: nothing learned
    assert on_victim.lost(ended=False) == ()
    _missed(on_victim, {"head"})
    assert on_victim.lost(ended=False) == ("victim",)


def test_one_missed_answer_on_a_loaded_machine_is_not_a_dead_node():
    """Seen on a 2-core host at load 10-13: a job that crashed before it was placed got `node-lost` because one
    state-API answer missed a node. A node is dead after MISSES_TO_DEAD consecutive misses; one that answers again
    in between is alive; and a crashed job whose own (driver) node is alive failed on its own."""
    watch = NodeWatch(frozenset({"head", "victim"}))
    watch.observe({"head"})
    assert watch.suspects == {"victim"} and watch.lost(ended=True) == ()
    watch.observe({"head", "victim"})
    watch.observe({"head"})
    assert watch.lost(ended=True) == ()  # never missed twice in a row
    crashed = NodeWatch(frozenset({"head", "victim"}))
    _missed(crashed, {"head"})  # the victim really died meanwhile (the proof kills it)
    assert crashed.lost(ended=True) == ("victim",)  # nodes unknown, no word from Ray: the death may be why
    assert crashed.lost(ended=True, exited=True) == ()  # Ray says the entrypoint exited with a code: its own end
    crashed.job_nodes |= {"head"}  # asked once the job failed: its driver ran on the head
    assert crashed.lost(ended=True) == ()
    assert verdict("FAILED", steps_done=0, total=1, lost_nodes=crashed.lost(ended=True),
                   job_message="Job entrypoint command failed with exit code 1")[0] == "failed"


@pytest.mark.parametrize("status, kw, expected", [
    ("RUNNING", {}, None),
    ("PENDING", {}, None),
    ("SUCCEEDED", {}, "succeeded"),
    ("SUCCEEDED", {"steps_done": 3}, "failed"),  # exit 0 but the trainer stopped early
    ("FAILED", {"job_message": "Job entrypoint command failed with exit code 137, last logs:\nKilled"}, "failed"),
    ("STOPPED", {}, "stopped"),
    ("RUNNING", {"timed_out": True}, "timeout"),
    ("RUNNING", {"timed_out": True, "stalled_s": 600.0}, "timeout"),  # no new step for the stall bound
    ("RUNNING", {"lost_nodes": ("abc",)}, "node-lost"),
    ("FAILED", {"lost_nodes": ("abc",)}, "node-lost"),  # the node loss is the cause, say so
])
def test_verdicts(status, kw, expected):
    args = {"steps_done": 4, "total": 4, **kw}
    decided = verdict(status, **args)
    assert (decided[0] if decided else None) == expected
    if expected == "failed" and "job_message" in kw:
        assert decided[1] == "exit code 137: Killed"


def test_tiny_job_is_verls_main_ppo_on_cpu(tmp_path):
    """The tiny job prepares its inputs, then runs exactly the plan's verl command (`plan --scale tiny`)."""
    scale = get_scale("tiny")
    spec = job_for_scale(scale, tmp_path / "run", steps=3, seed=7)
    prepare, verl = spec.entrypoint.split(" && ")
    assert shlex.split(prepare)[:3] == ["python", "-m", "harness.launch.tiny_verl"] and "--seed 7" in prepare
    words = shlex.split(verl)
    recipe = dapo_recipe(scale, model_path=str((tmp_path / "run" / "inputs" / "model").resolve()),
                         data_dir=str((tmp_path / "run" / "inputs" / "data").resolve()))
    assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert words[3:3 + len(recipe.overrides)] == list(recipe.overrides), "the plan's overrides, in the plan's order"
    assert "trainer.total_training_steps=3" in words and "data.seed=7" in words
    env = spec.runtime_env()
    assert env["env_vars"]["VERL_FILE_LOGGER_PATH"] == str((tmp_path / "run" / "metrics.jsonl").resolve())
    assert env["env_vars"].items() >= recipe.env.items() and recipe.env["VERL_PLATFORM"] == "cpu"
    assert ".venv" in env["excludes"] and env["working_dir"]
    faulty = job_for_scale(scale, tmp_path / "bad", steps=3, fault="stale-absorbed")
    assert faulty.env["HARNESS_ROLLOUT_FAULT"] == "stale-absorbed" and "--fault stale-absorbed" in faulty.entrypoint
    # a fault patched into verl's code reaches every verl process by the environment; verl's command line and
    # resolved config stay the clean run's, so only the curves can tell (harness.launch.verl_faults.patch_trainer)
    patched = job_for_scale(scale, tmp_path / "run", steps=3, seed=7, fault="frozen-optimizer")
    assert patched.env["HARNESS_TRAINER_PATCH"] == "frozen-optimizer"
    assert patched.entrypoint.split(" && ")[1] == verl
    with pytest.raises(BadInput, match="--fault"):
        job_for_scale(scale, tmp_path / "bad2", fault="no-such-fault")
    with pytest.raises(BadInput, match="only into the tiny"):
        job_for_scale(get_scale("reduced-a2"), tmp_path / "bad3", fault="stale-absorbed")


def test_npu_job_is_verls_dapo_with_the_plans_env(tmp_path, monkeypatch):
    scale = get_scale("reduced-a2")
    monkeypatch.setenv("HARNESS_MODEL_DIR", "/shared/models")
    monkeypatch.setenv("HARNESS_DATA_DIR", "/shared/data/dapo")
    spec = job_for_scale(scale, tmp_path / "run", steps=5)
    recipe = dapo_recipe(scale, model_path=f"/shared/models/{scale.model.name}", data_dir="/shared/data/dapo")
    words = shlex.split(spec.entrypoint)
    assert words[:3] == ["python3", "-m", recipe.entrypoint]
    assert set(recipe.overrides) <= set(words)
    assert "trainer.total_training_steps=5" in words and "trainer.resume_mode=disable" in words
    assert f"trainer.rollout_data_dir={(tmp_path / 'run' / 'rollouts').resolve()}" in words
    assert spec.runtime_env()["env_vars"].items() >= dict(recipe.env).items() and recipe.env
    resumed = job_for_scale(scale, tmp_path / "run", steps=5, resume=True)
    assert resumed.resume and "trainer.resume_mode=auto" in shlex.split(resumed.entrypoint)


def test_cluster_job_needs_absolute_shared_inputs(tmp_path, monkeypatch):
    """Ray uploads the working dir without models/ and data/: a relative or missing path is refused up front in one
    line naming the variables, before a cluster is booked."""
    scale = get_scale("full-a3")
    monkeypatch.delenv("HARNESS_MODEL_DIR", raising=False)
    monkeypatch.delenv("HARNESS_DATA_DIR", raising=False)
    with pytest.raises(BadInput, match=r"no model path \(set \$HARNESS_MODEL_DIR\); no data dir") as err:
        job_for_scale(scale, tmp_path / "run")
    assert "\n" not in str(err.value) and "deepseek-v3/" in str(err.value)
    monkeypatch.setenv("HARNESS_MODEL_DIR", "models")
    monkeypatch.setenv("HARNESS_DATA_DIR", "/shared/dapo")
    with pytest.raises(BadInput, match="model path 'models/deepseek-v3'"):
        job_for_scale(scale, tmp_path / "run")
    spec = job_for_scale(scale, tmp_path / "run", model_path="/shared/m", data_dir="/shared/d")
    assert "actor_rollout_ref.model.path=/shared/m" in shlex.split(spec.entrypoint)
    assert "data.train_files=/shared/d/train.parquet" in shlex.split(spec.entrypoint)


def test_progress_of_a_growing_log(tmp_path):
    log = tmp_path / "metrics.jsonl"
    assert read_progress(log).steps_done == 0
    lines = [json.dumps({"step": s, "data": {"critic/rewards/mean": s / 10, "perf/throughput": 100.0 + s}})
             for s in (1, 2)]
    log.write_text("\n".join(lines) + "\n" + '{"step": 3, "data": {"critic/rew')  # step 3 half written
    p = read_progress(log)
    assert (p.steps_done, p.reward, p.tps) == (2, 0.2, 102.0)


def _docs(scale_name: str):
    """(Service, Job) of a scale's manifest and its text; an NPU scale's rings-config ConfigMap comes first and is
    checked in tests/test_k8s_manifest.py."""
    text = manifest_yaml(get_scale(scale_name), image="img:1", namespace="rl", steps=7)
    assert "&id" not in text and "*id" not in text, "YAML aliases make hand edits of one pod change all"
    docs = [d for d in yaml.safe_load_all(text) if d["kind"] != "ConfigMap"]
    return docs, text


@pytest.mark.parametrize("name", ["full-a3", "full-a2-gbs128", "moonlight-a2", "reduced-a2"])
def test_k8s_manifest(name):
    scale = get_scale(name)
    docs, _ = _docs(name)
    service, job = docs
    assert (service["kind"], job["kind"], job["apiVersion"]) == ("Service", "Job", "batch.volcano.sh/v1alpha1")
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["namespace"] == "rl"
    tasks = {t["name"]: t for t in job["spec"]["tasks"]}
    assert sum(t["replicas"] for t in tasks.values()) == scale.nodes == job["spec"]["minAvailable"]
    assert tasks["head"]["replicas"] == 1 and set(tasks) == ({"head", "worker"} if scale.nodes > 1 else {"head"})
    recipe = dapo_recipe(scale, model_path=f"/mnt/shared/models/{scale.model.name}", data_dir="/mnt/shared/data/dapo")
    for task in tasks.values():
        pod = task["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == "img:1" and pod["hostNetwork"] is True
        want = str(scale.devices_per_node)
        resources = container["resources"]
        assert resources["requests"][NPU_RESOURCE] == want == resources["limits"][NPU_RESOURCE]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env.items() >= dict(recipe.env).items()
        assert env["VERL_FILE_LOGGER_PATH"].endswith("/metrics.jsonl")
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/mnt/shared", "/dev/shm"}
        labels = task["template"]["metadata"]["labels"]
        if task["name"] == "head":
            assert service["spec"]["selector"].items() <= labels.items()
    # what bash runs: kubelet reduces the manifest's `$$` to `$` (harness.launch.k8s.kubelet_literal)
    head = tasks["head"]["template"]["spec"]["containers"][0]["command"][2].replace("$$", "$")
    assert f"-ge {scale.nodes} ]" in head, "the head must wait for every node before starting verl"
    words = shlex.split(head.split("&& python3 -m", 1)[1].split("2>&1")[0])
    assert words[0] == recipe.entrypoint and set(recipe.overrides) <= set(words)
    assert "trainer.total_training_steps=7" in words and "trainer.resume_mode=auto" in words
    assert "metrics.seg" in head, "a resubmitted head must keep the metrics verl's FileLogger would truncate"
    if scale.nodes > 1:
        worker = tasks["worker"]["template"]["spec"]["containers"][0]["command"][2]
        assert f"{service['metadata']['name']}.rl.svc.cluster.local:6379" in worker


@pytest.mark.parametrize("name", ["full-a3", "full-a2-gbs128"])
def test_k8s_manifest_mindcluster_and_auth(name):
    """What MindCluster reads (ring-controller label, ASCEND_VISIBLE_DEVICES from the device annotation, the
    accelerator-type selector, sp-block on A3) and no unauthenticated Jobs API on the host network."""
    scale = get_scale(name)
    (service, job), text = _docs(name)
    assert job["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    assert (job["metadata"].get("annotations", {}).get("sp-block") == str(scale.devices)) is (name == "full-a3")
    assert [p["port"] for p in service["spec"]["ports"]] == [6379], "the dashboard must not be a Service port"
    for task in job["spec"]["tasks"]:
        pod = task["template"]
        assert pod["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
        assert pod["spec"]["nodeSelector"]["accelerator-type"] == \
            {"full-a3": "module-a3-16-super-pod", "full-a2-gbs128": "module-910b-8"}[name]
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["ASCEND_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['huawei.com/Ascend910']"
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
        assert all(p["containerPort"] != 8265 for p in container["ports"])
    head = next(t for t in job["spec"]["tasks"] if t["name"] == "head")["template"]["spec"]["containers"][0]
    assert "--dashboard-host 127.0.0.1" in head["command"][2] and "0.0.0.0" not in text


@pytest.mark.parametrize("namespace", ["rl; rm -rf /", "RL", "-rl", "a" * 64, "rl\nx", "$(id)"])
def test_k8s_refuses_bad_namespace(namespace):
    with pytest.raises(BadInput, match="--namespace"):
        manifest_yaml(get_scale("full-a3"), image="img:1", namespace=namespace)


@pytest.mark.parametrize("image", ["img $(id)", "img:1;true", "", "IMG:1", "img:" + "x" * 200, "a/b:c d"])
def test_k8s_refuses_bad_image(image):
    with pytest.raises(BadInput, match="--image"):
        manifest_yaml(get_scale("full-a3"), image=image, namespace="rl")


@pytest.mark.parametrize("image", ["verl-ascend:latest", "quay.io/ascend/verl:verl-8.5.1-a3-ubuntu22.04-py3.11-latest",
                                   "registry.local:5000/team/img@sha256:" + "0" * 64, "busybox"])
def test_k8s_accepts_image_references(image):
    assert image in manifest_yaml(get_scale("full-a3"), image=image, namespace="rl")


def test_every_scale_has_a_manifest():
    for name in SCALES:
        docs, text = _docs(name)
        assert len(docs) == 2
        assert ("kind: ConfigMap" in text) is (get_scale(name).hardware.kind == "npu")


def test_cpu_manifest_requests_no_npus():
    _, text = _docs("tiny")
    assert NPU_RESOURCE not in text


@pytest.mark.parametrize("argv, needle", [
    (["launch", "--scale", "tiny"], "--ray-address is required"),
    (["launch", "--scale", "nope"], "unknown scale"),
    (["launch", "--scale", "tiny", "--ray-address", "ray://h:10001"], "a Ray client address"),
    (["launch", "--scale", "tiny", "--ray-address", "h:6379"], "port 6379 is the GCS, not the dashboard"),
    (["launch", "--scale", "tiny", "--ray-address", "http://127.0.0.1:9", "--run-dir", "/tmp"],
     "no Ray dashboard answers within"),
    (["launch", "--scale", "tiny", "--steps", "-3", "--ray-address", "http://h:8265"], "--steps -3"),
    (["launch", "--scale", "tiny", "--steps", "0", "--k8s"], "--steps 0"),
    (["launch", "--scale", "full-a3", "--k8s", "--namespace", "rl; rm -rf /"], "--namespace"),
    (["launch", "--scale", "full-a3", "--k8s", "--image", "img $(id)"], "--image"),
    (["launch", "--scale", "tiny", "--local", "--ray-address", "http://h:8265"], "drop --ray-address"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err, err


def test_cli_prints_the_manifest(capsys):
    assert main(["launch", "--scale", "full-a3", "--k8s"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]


def test_k8s_defaults_are_overridable(capsys):
    # image, namespace and the shared PVC each have a stated default and an option
    assert main(["launch", "--scale", "full-a3", "--k8s", "--image", "reg.example:5000/verl-ascend:v1",
                 "--namespace", "rl", "--pvc", "rl-shared"]) == 0
    rings, service, job = yaml.safe_load_all(capsys.readouterr().out)
    assert rings["metadata"]["namespace"] == service["metadata"]["namespace"] == job["metadata"]["namespace"] == "rl"
    for task in job["spec"]["tasks"]:
        pod = task["template"]["spec"]
        assert {c["image"] for c in pod["containers"]} == {"reg.example:5000/verl-ascend:v1"}
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims == ["rl-shared"]


def test_job_spec_without_working_dir():
    spec = JobSpec("x", "true", "/r", 1, working_dir=None)
    assert "working_dir" not in spec.runtime_env()


def test_existing_run_dir_is_refused_before_submitting(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n')
    assert main(["launch", "--scale", "tiny", "--ray-address", "http://127.0.0.1:9", "--run-dir", str(tmp_path)]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_cluster_address_is_ray_address_by_convention(capsys, monkeypatch):
    """With no --ray-address, RAY_ADDRESS (Ray's own convention) names the cluster, and a wrong one is one line
    naming RAY_ADDRESS."""
    from harness.cli import main

    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert main(["launch", "--scale", "full-a3"]) == 2
    err = capsys.readouterr().err
    assert "RAY_ADDRESS ray://head:10001: a Ray client address" in err and len(err.splitlines()) == 1
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:1")
    monkeypatch.setenv("HARNESS_RAY_CONNECT_TIMEOUT", "2")
    assert main(["launch", "--status", "raysubmit_123"]) == 2
    assert "no Ray dashboard answers" in capsys.readouterr().err
    monkeypatch.delenv("RAY_ADDRESS")
    assert main(["launch", "--logs", "raysubmit_123"]) == 2
    assert "need the cluster" in capsys.readouterr().err
    assert main(["launch"]) == 2
    assert "--scale is required" in capsys.readouterr().err


def test_local_launch_passes_the_whole_job_into_the_namespace(tmp_path):
    """`launch --local` re-executes itself in a loopback-only namespace: the recipe (absolute), the overrides after
    `--`, --abort-on-fail and the paths reach the inner command."""
    from harness.cli import build_parser
    from harness.cli.launch_cmd import _isolated_argv

    recipe = tmp_path / "job.sh"
    args = build_parser().parse_args(["launch", "--scale", "tiny", "--local", "--recipe", str(recipe), "--steps", "3",
                                      "--abort-on-fail", "--", "actor_rollout_ref.rollout.n=8"])
    args.timeout = 600.0
    argv = _isolated_argv(args, "tiny", tmp_path / "run")
    assert argv[argv.index("--recipe") + 1] == str(recipe.resolve())
    assert "--abort-on-fail" in argv and argv[-2:] == ["--", "actor_rollout_ref.rollout.n=8"]
    again = build_parser().parse_args(argv[3:])
    assert again.overrides == ["actor_rollout_ref.rollout.n=8"] and again.abort_on_fail and again.steps == 3


def test_stop_rules_follow_the_jobs_precision_and_target():
    from harness.config.job import build_job
    from harness.launch.ray_job import stop_rules_for

    tiny = {r.name: r for r in stop_rules_for(build_job(get_scale("tiny")))}
    assert tiny["rollout-mismatch"].threshold == 2e-4 and "rollout-kl" in tiny and "throughput" not in tiny
    a3 = {r.name: r for r in stop_rules_for(build_job(get_scale("full-a3")))}
    assert a3["rollout-mismatch"].threshold == 0.05 and "rollout-kl" not in a3
    assert a3["throughput"].threshold == 30.0  # half of 120 TPS/card, per die (2 dies per A3 card)
    from harness.config.user_recipe import read_recipe

    seed002 = Path(__file__).parent / "recipes" / "seed002_a3_grpo.sh"
    rehearsal = {r.name for r in stop_rules_for(build_job(get_scale("tiny"), read_recipe(str(seed002))))}
    assert rehearsal == {"non-finite-loss", "non-finite-grad"}, "top_k 50 / top_p 0.9: mismatch by design"
    warm = {r.name for r in stop_rules_for(build_job(get_scale("tiny"), read_recipe(
        None, ["actor_rollout_ref.rollout.temperature=0.9"])))}
    assert "rollout-mismatch" in warm


def test_an_interrupted_launch_records_the_signal():
    # launch.json said `running` after the launcher got SIGTERM (issue 33): the `stopped` record names the signal
    import signal

    from harness.errors import Terminated
    from harness.launch.ray_job import signal_name

    assert signal_name(Terminated(signal.SIGTERM)) == "SIGTERM" and signal_name(Terminated(signal.SIGHUP)) == "SIGHUP"
    assert signal_name(KeyboardInterrupt()) == "SIGINT"


def test_a_failed_tool_is_named_by_its_error_line_not_the_log_after_it():
    """`ray start --head` failed once in a full test session and the refusal quoted the dashboard's INFO line
    logged after the error: the reason is the last line that reads like an error, else the last line."""
    from harness.launch.local import _last_line

    ray = ("Local node IP: 127.0.0.1\n!!! Failed to start the dashboard: TimeoutError\n"
           "2026-12-07 00:37:47,978\tINFO head.py:341 -- Loaded 9 subprocess modules: [...]\n")
    assert _last_line(ray) == "!!! Failed to start the dashboard: TimeoutError"
    assert _last_line("RTNETLINK answers: Operation not permitted\n") == "RTNETLINK answers: Operation not permitted"
    assert _last_line("") == "no output"
