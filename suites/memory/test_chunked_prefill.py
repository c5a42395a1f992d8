"""MLA prefill memory (seed 001): at GBS 128 the vanilla MLA prefill broadcast a [b, 1, 1, s] mask into
[b, h, s, s] scores (plus fp32 softmax copies) and ran out of memory on the 64 GB A2; chunked prefill
for MLA (vllm-ascend's fused path) avoided it.

* tiny: both prefill paths on real tensors of the tiny DeepSeek-V3 on CPU: same outputs, and the
  chunked path's measured peak stays below the vanilla one by the [b, h, s, s] score chain.
* layer: the A2 rollout plan at GBS 128 with 2k prompts, traced on fake tensors at real shapes
  (heads / rollout TP8): vanilla exceeds the 64 GB device, chunked fits with the scale's headroom.
* npu: the real vllm-ascend prefill with chunking on and off, measured on the device: neither builds the chain.
"""
from __future__ import annotations

import pytest
import torch

from harness.config.models import TINY
from harness.markers import requires
from harness.memory.job_options import scale_options
from harness.memory.prefill import (
    padding_mask,
    prefill_query_bytes,
    prefill_step_tokens,
    prefill_verdict,
    run_prefill,
)
from harness.memory.tracer import rope_inputs, shard_config, trace


@pytest.mark.tiny
def test_tiny_chunked_prefill_same_output_lower_peak(device, record_property):
    """Device-generic (the `device` fixture: npu, cuda where present, and cpu): real tensors on the device,
    the peak measured by torch's MemTracker over the device's storages."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    torch.manual_seed(0)
    cfg = shard_config(TINY)
    attn = DeepseekV3Attention(cfg, 0).eval().to(device)
    b, s, chunk = 4, 256, 32
    hidden = torch.randn(b, s, TINY.hidden_size, device=device)
    cos_sin = tuple(t.to(device) for t in rope_inputs(cfg, b, s))
    pad = padding_mask(torch.full((b,), s, device=device), s, torch.float32)
    outs, peaks = {}, {}
    with torch.no_grad():
        for variant in ("vanilla", "chunked"):
            def run(v=variant):
                outs[v] = run_prefill(attn, hidden, cos_sin, pad, variant=v, chunk=chunk)
                return outs[v]
            tr = trace(run, resident=(attn, hidden, pad, *cos_sin), name=variant)
            peaks[variant] = tr.activation_peak_bytes
    record_property("memory.prefill", {"scale": "tiny", "device": device, "peak_bytes": peaks})
    torch.testing.assert_close(outs["chunked"], outs["vanilla"], rtol=1e-5, atol=1e-6)
    scores_chain = b * TINY.num_attention_heads * s * s * 4  # one fp32 [b, h, s, s] copy at least
    assert peaks["vanilla"] - peaks["chunked"] >= scores_chain, (
        f"chunked peak {peaks['chunked']} B is not below vanilla {peaks['vanilla']} B by one fp32 "
        f"[b,h,s,s] ({scores_chain} B) on {device}")


@pytest.mark.layer
@pytest.mark.cpu
def test_a2_gbs128_vanilla_prefill_ooms_chunked_fits(scale, record_property, expect):
    vanilla = prefill_verdict(scale, scale_options(scale), variant="vanilla")
    chunked = prefill_verdict(scale, scale_options(scale), variant="chunked")
    record_property("memory.prefill", [
        {"scale": scale.name, "variant": v.variant, "peak_gib": round(v.peak_gib, 3), "budget_gib": v.budget_gib,
         "fits": v.ok} for v in (vanilla, chunked)])
    assert not vanilla.fits and vanilla.quadratic, "vanilla prefill should exceed the device: " + vanilla.message()
    expect(chunked)


# vLLM's per-step token budget of the chunked run (max_num_batched_tokens); the run with chunking off schedules the
# whole batch in one step.
CHUNKED_TOKEN_BUDGET = 2048


def _vllm_prefill_transient(model_dir: str, chunked: bool, prompts: int, prompt_len: int) -> int:
    """Child process: one vllm-ascend engine, one batch of long prompts; returns the prefill's transient peak
    (max_memory_allocated during generate minus what was allocated before: weights and KV pool)."""
    import os

    # The model must run in THIS process for torch.npu's counters to see it (V1 otherwise runs it in an
    # engine-core child and the peak here reads 0); the platform env (VLLM_ASCEND_ENABLE_NZ=0) before vLLM.
    from harness.config.platforms import platform_facts

    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **platform_facts("npu").env})
    import torch_npu  # noqa: F401  (registers torch.npu)
    from vllm import LLM, SamplingParams

    # No `additional_config={"chunked_prefill_for_mla": ...}`: vllm-ascend dropped the key in #5296 (v0.20.2rc1 and
    # v0.23.0 read it nowhere; their MLA prefill is always the fused npu_fused_infer_attention_score path,
    # attention/mla_v1.py _forward_prefill). Chunking here is vLLM's scheduler: `enable_chunked_prefill` with a
    # per-step token budget, off = the whole batch in one step.
    # skip_tokenizer_init: the model directory holds config + weights only, no tokenizer.
    llm = LLM(model=model_dir, tensor_parallel_size=1, enforce_eager=True, load_format="dummy",
              skip_tokenizer_init=True, dtype=torch.bfloat16,
              max_model_len=prompt_len + 8, max_num_seqs=prompts, enable_chunked_prefill=chunked,
              max_num_batched_tokens=CHUNKED_TOKEN_BUDGET if chunked else prompts * prompt_len,
              gpu_memory_utilization=0.5)
    torch.npu.synchronize()
    before = torch.npu.memory_allocated()
    torch.npu.reset_peak_memory_stats()
    llm.generate([{"prompt_token_ids": [1 + i % 100] * prompt_len} for i in range(prompts)],
                 SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
    torch.npu.synchronize()
    return int(torch.npu.max_memory_allocated() - before)


@pytest.mark.layer
@pytest.mark.npu
@requires(hardware="npu", packages=["vllm", "vllm_ascend", "torch_npu"])
def test_vllm_ascend_chunked_prefill_has_no_score_matrix(tmp_path, record_property):
    from harness.config.models import DEEPSEEK_V3
    from harness.engines.isolation import in_fresh_process
    from harness.engines.weights import write_model_dir
    from harness.memory import phases as mm

    # One full-size DSV3 layer (128 heads on one card) so the [b, h, s, s] chain is GiBs, not KiBs.
    spec = DEEPSEEK_V3.with_layers(1, first_k_dense_replace=1, name="dsv3-1l")
    # config only: load_format="dummy" lets vLLM initialize the weights on the device
    write_model_dir(spec, {}, tmp_path / "model", dtype=torch.bfloat16)
    prompts, prompt_len = 4, 2048
    # one engine per fresh process: two in one process would share (and leak) the device
    transient = {c: in_fresh_process(_vllm_prefill_transient, str(tmp_path / "model"), c, prompts, prompt_len)
                 for c in (True, False)}
    vanilla = mm.prefill_activation_bytes(spec, batch=prompts, seq=prompt_len, tp=1, chunk=None)
    # Sensitivity guard: every prefill step allocates at least its bf16 query [step tokens, h, qk_head_dim]; a
    # measurement below that cannot see the prefill (e.g. it ran in another process and reads 0), and the checks
    # below could not fail. The chunked run's steps hold at most its token budget, not the whole batch.
    query = {c: prefill_query_bytes(spec, prefill_step_tokens(prompts, prompt_len, CHUNKED_TOKEN_BUDGET if c else None))
             for c in (True, False)}
    record_property("memory.prefill", {"scale": "layer-npu", "transient_bytes": {
        "chunked": transient[True], "chunking_off": transient[False]}, "vanilla_model_bytes": vanilla,
        "step_query_bytes": {"chunked": query[True], "chunking_off": query[False]}})
    for c in (True, False):
        assert transient[c] >= query[c], (
            f"the {'chunked' if c else 'unchunked'} prefill's measured transient peak ({transient[c]} bytes) is below "
            f"its own per-step query tensor ({query[c]} bytes): the measurement does not see the prefill")
    # Neither run may build the [b, h, s, s] chain seed 001's vanilla MLA prefill built: vllm-ascend's MLA prefill is
    # fused with chunking on and off alike (the vanilla branch went with chunked_prefill_for_mla).
    for c in (True, False):
        assert transient[c] < 0.5 * vanilla, (
            f"{'chunked' if c else 'unchunked'} prefill transient {transient[c] / 2**30:.2f} GiB; the vanilla chain "
            f"is {vanilla / 2**30:.2f} GiB: the prefill is not taking the fused MLA path")
