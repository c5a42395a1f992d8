"""The rollout's absorbed MLA decode and the trainer's naive MLA forward give the same log-probs.

verl's training/rollout_probs_diff_mean is the gap between these two paths; any MLA mismatch (stale
W_UV, wrong scale, rope layout) shows there first. Step 0 comes from prefill; steps >= 1 from the absorbed
decode path (W_UK_T / W_UV), which is where the vllm-ascend bug lived.
"""
import dataclasses

import pytest
import torch

from fixtures.engines import PROMPTS
from harness.config.models import DEEPSEEK_V3
from harness.mla.checks import compare_logprobs


@pytest.mark.tiny
def test_rollout_logprobs_match_training_forward(engine_kind, mla_dtype, fresh_rollout, hf_training, record_property,
                                                 expect):
    training = [hf_training.response_logprobs(p, t) for p, t in zip(PROMPTS, fresh_rollout.token_ids, strict=True)]
    decode = compare_logprobs(f"{engine_kind.name} decode steps vs transformers",
                                  [d[1:] for d in fresh_rollout.dist_logprobs], [t[1:] for t in training],
                                  mla_dtype, first_step=1)
    prefill = compare_logprobs(f"{engine_kind.name} prefill step vs transformers",
                                   [d[:1] for d in fresh_rollout.dist_logprobs], [t[:1] for t in training],
                                   mla_dtype)
    # The sampled tokens' log-probs are what verl compares (training/rollout_probs_diff_mean).
    chosen_train = [t.gather(1, torch.tensor(toks)[:, None])
                    for t, toks in zip(training, fresh_rollout.token_ids, strict=True)]
    chosen_rollout = [torch.tensor(lp)[:, None] for lp in fresh_rollout.logprobs]
    chosen = compare_logprobs(f"{engine_kind.name} sampled-token log-probs vs transformers", chosen_rollout,
                                  chosen_train, mla_dtype)
    gaps = [(r.exp() - t.exp()).abs() for r, t in zip(chosen_rollout, chosen_train, strict=True)]
    probs_diff_mean = float(torch.cat(gaps).mean())
    record_property("mla.forward_alignment", {"engine": engine_kind.name, "worst_decode": decode.worst,
                                              "worst_prefill": prefill.worst,
                                              "rollout_probs_diff_mean": probs_diff_mean,
                                              "tol": dataclasses.asdict(decode.tol)})
    expect(prefill, decode, chosen)


# One real-size DeepSeek-V3 attention (hidden 7168, 128 heads, q_lora 1536, kv_lora 512, yarn 40) with random
# weights; vocab and MLP shrunk (they do not touch MLA). ~0.9 GB of fp32 weights per copy.
DSV3_ATTENTION_LAYER = dataclasses.replace(DEEPSEEK_V3, name="deepseek-v3-1-attention-layer", num_hidden_layers=1,
                                           first_k_dense_replace=1, intermediate_size=256, vocab_size=256)


@pytest.mark.layer
def test_real_size_attention_layer_absorbed_matches_naive(tmp_path, record_property):
    """Reference engine's absorbed decode at DSV3 attention size vs transformers' naive forward."""
    from transformers import DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    from harness.engines.reference import ReferenceEngine
    from harness.engines.weights import random_state_dict

    spec = DSV3_ATTENTION_LAYER
    weights = random_state_dict(spec, seed=0)
    engine = ReferenceEngine(spec, weights)
    rollout = engine.sample([PROMPTS[0]], 4, full_logprobs=True)
    config = spec.to_hf_config(attn_implementation="eager")
    with torch.device("meta"):  # no second random init of 0.2 B parameters: the engine's tensors are assigned
        hf = DeepseekV3ForCausalLM(config)
    hf.load_state_dict(engine.state_dict(), strict=True, assign=True)
    hf.model.rotary_emb = DeepseekV3RotaryEmbedding(config)  # non-persistent buffers are not in the state dict
    hf.eval()
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[0] + rollout.token_ids[0]])
        n = len(PROMPTS[0])
        training = hf(ids).logits[0, n - 1: n - 1 + 4].float().log_softmax(-1)
    alignment = compare_logprobs("reference absorbed decode vs transformers, DSV3-size attention",
                                     rollout.dist_logprobs, [training], torch.float32)
    record_property("mla.forward_alignment_dsv3_layer", {"worst": alignment.worst, "numel": alignment.numel})
    assert alignment.ok, alignment.message()
