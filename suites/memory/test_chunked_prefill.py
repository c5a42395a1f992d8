"""MLA prefill memory (seed 001): at GBS 128 the vanilla MLA prefill broadcast a [b, 1, 1, s] mask into
[b, h, s, s] scores (plus fp32 softmax copies) and ran out of memory on the 64 GB A2; chunked prefill
for MLA (vllm-ascend's fused path) avoided it.

* tiny: both prefill paths on real tensors of the tiny DeepSeek-V3 on CPU: same outputs, and the
  chunked path's measured peak stays below the vanilla one by the [b, h, s, s] score chain.
* layer: the A2 rollout plan at GBS 128 with 2k prompts, traced on fake tensors at real shapes
  (heads / rollout TP8): vanilla exceeds the 64 GB device, chunked fits with the scale's headroom.
* npu: the same through the real vllm-ascend prefill with chunking on/off, measured on the device.
"""
from __future__ import annotations

import pytest
import torch

from harness.config.models import TINY
from harness.markers import requires
from harness.memory.prefill import padding_mask, prefill_verdict, run_prefill
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
    vanilla = prefill_verdict(scale, variant="vanilla")
    chunked = prefill_verdict(scale, variant="chunked")
    record_property("memory.prefill", [
        {"scale": scale.name, "variant": v.variant, "peak_gib": round(v.peak_gib, 3), "budget_gib": v.budget_gib,
         "fits": v.ok} for v in (vanilla, chunked)])
    assert not vanilla.fits and vanilla.quadratic, "vanilla prefill should exceed the device: " + vanilla.message()
    expect(chunked)


def _vllm_prefill_transient(model_dir: str, chunked: bool, prompts: int, prompt_len: int, out: str) -> None:
    """Child process: one vllm-ascend engine, one batch of long prompts; writes the prefill's transient peak
    (max_memory_allocated during generate minus what was allocated before: weights and KV pool) to `out`."""
    import json
    import os

    # The model must run in THIS process for torch.npu's counters to see it (V1 otherwise runs it in an
    # engine-core child and the peak here reads 0); the platform env (VLLM_ASCEND_ENABLE_NZ=0) before vLLM.
    from harness.config.platforms import platform_facts

    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **platform_facts("npu").env})
    import torch_npu  # noqa: F401  (registers torch.npu)
    from vllm import LLM, SamplingParams

    # chunked_prefill_for_mla selects the fused MLA prefill in vllm-ascend before PR #2781; later
    # versions dropped the vanilla branch (the key is then ignored) and always chunk.
    # skip_tokenizer_init: the model directory holds config + weights only, no tokenizer.
    llm = LLM(model=model_dir, tensor_parallel_size=1, enforce_eager=True, load_format="dummy",
              skip_tokenizer_init=True, dtype=torch.bfloat16,
              max_model_len=prompt_len + 8, max_num_seqs=prompts, enable_chunked_prefill=chunked,
              max_num_batched_tokens=2048 if chunked else prompts * prompt_len,
              additional_config={"chunked_prefill_for_mla": chunked}, gpu_memory_utilization=0.5)
    torch.npu.synchronize()
    before = torch.npu.memory_allocated()
    torch.npu.reset_peak_memory_stats()
    llm.generate([{"prompt_token_ids": [1 + i % 100] * prompt_len} for i in range(prompts)],
                 SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
    torch.npu.synchronize()
    with open(out, "w") as f:
        json.dump(torch.npu.max_memory_allocated() - before, f)


def _in_own_process(target, *args, timeout: float = 900) -> int:
    """Run `target(*args, out)` in a fresh spawned process and return the int it wrote. One plain (non-daemonic)
    mp.Process per engine (issue 11): a daemonic Pool worker cannot start vLLM's own children, and two engines
    in one worker would share (and leak) the device."""
    import json
    import multiprocessing as mp
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result.json"
        proc = mp.get_context("spawn").Process(target=target, args=(*args, out))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise TimeoutError(f"{target.__name__}{args}: no result after {timeout:.0f} s")
        if proc.exitcode != 0:
            raise RuntimeError(f"{target.__name__}{args}: child exited {proc.exitcode} (its log is above)")
        with open(out) as f:
            return int(json.load(f))


@pytest.mark.layer
@pytest.mark.npu
@requires(hardware="npu", packages=["vllm", "vllm_ascend", "torch_npu"])
def test_vllm_ascend_chunked_prefill_has_no_score_matrix(tmp_path, record_property):
    from harness.config.models import DEEPSEEK_V3
    from harness.engines.weights import write_model_dir
    from harness.memory import phases as mm

    # One full-size DSV3 layer (128 heads on one card) so the [b, h, s, s] chain is GiBs, not KiBs.
    spec = DEEPSEEK_V3.with_layers(1, first_k_dense_replace=1, name="dsv3-1l")
    # config only: load_format="dummy" lets vLLM initialize the weights on the device
    write_model_dir(spec, {}, tmp_path / "model", dtype=torch.bfloat16)
    prompts, prompt_len = 4, 2048
    transient = {c: _in_own_process(_vllm_prefill_transient, str(tmp_path / "model"), c, prompts, prompt_len)
                 for c in (True, False)}
    vanilla = mm.prefill_activation_bytes(spec, batch=prompts, seq=prompt_len, tp=1, chunk=None)
    # Sensitivity guard: any prefill allocates at least its bf16 query [b*s, h, qk_head_dim]; a measurement below
    # that cannot see the prefill (e.g. it ran in another process and reads 0), and the check below could not fail.
    query = prompts * prompt_len * spec.num_attention_heads * spec.qk_head_dim * 2
    record_property("memory.prefill", {"scale": "layer-npu", "transient_bytes": {
        "chunked": transient[True], "chunking_off": transient[False]}, "vanilla_model_bytes": vanilla,
        "query_bytes": query})
    assert min(transient.values()) >= query, (
        f"the prefill's measured transient peak ({transient}) is below its own query tensor ({query} bytes): "
        "the measurement does not see the prefill")
    # With chunking on, the prefill must not build the [b, h, s, s] chain the vanilla path builds.
    assert transient[True] < 0.5 * vanilla, (
        f"chunked prefill transient {transient[True] / 2**30:.2f} GiB; the vanilla chain is "
        f"{vanilla / 2**30:.2f} GiB: chunked prefill is not taking the fused MLA path")
