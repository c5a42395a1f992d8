"""Training-side MLA softmax scale, measured in a subprocess: `python -m harness.engines.megatron_probe --stack
{megatron,mindspeed} --model NAME` prints one JSON line. `harness.engines.training.training_scale` runs it.

Why a subprocess: `import mindspeed.megatron_adaptor` patches the whole process (torch_npu's `transfer_to_npu`
re-routes torch.cuda, and MindSpeed replaces Megatron classes), so it must never happen in the pytest process; and
Megatron-core's parallel state is process-global.

- `megatron` (the GPU baseline): builds megatron-core's `MLASelfAttention` for the model (world size
  1, gloo, `parallel_state.initialize_model_parallel()`), with the config fields the installed release has
  (`original_max_position_embeddings` exists only from core_r0.14.0; before, yarn reads `max_position_embeddings`),
  `use_cpu_initialization=True` (core_r0.12.1 ColumnParallelLinear otherwise allocates on
  torch.cuda.current_device()). Records the scale the MLA module computes and the `softmax_scale=` it hands its
  core attention (what TE's attention passes to the kernel). Without CUDA, `torch.cuda.current_device` points at
  the CPU inside this subprocess only: core_r0.12.1 `MultiLatentAttention.__init__` builds YarnRotaryEmbedding
  without use_cpu_initialization, so its tables go to torch.cuda.current_device() (the role torch_npu's
  transfer_to_npu plays on Ascend). core_r0.12.1's local DotProductAttention does not accept the `k_channels` /
  `v_channels` MLA passes it (only TE's does), so the core attention is a recorder that keeps that argument.
- `mindspeed` (the NPU training stack): seed 001's wrong scale is not in the MLA module -- MindSpeed
  v2.2.0_core_r0.12.1 sets `softmax_scale` right -- but in `mindspeed/core/transformer/flash_attention/
  flash_attention/adaptor.py` `dot_product_attention_forward_impl`, registered only with `--use-flash-attn`
  (features_manager/transformer/flash_attention/fusion_attention_v1_feature.py), which passes
  `1/sqrt(hidden_size_per_attention_head)` whenever `scale_mask_softmax.scale is None` (always, without
  query-key layer scaling); v2.3.0_core_r0.12.1 passes `self.softmax_scale`. So this stack is probed by behaviour:
  MindSpeed's arguments (flash attention + MLA) go on argv before `import mindspeed.megatron_adaptor` (it parses
  them: mindspeed/args_utils.py get_mindspeed_args; MindSpeed's TransformerConfig init wrapper copies them into the
  config), the MLA module runs one forward on the NPU in bf16, and every `scale=` that reaches
  `torch_npu.npu_fusion_attention` is recorded (a wrapper that calls the real kernel).

Several models run in one process (one import of the stack); the line is `{"results": [{"stack", "model",
"module_scale", "kernel_scales", "versions"}, ...]}`, a failure `{"error": "one line"}` with exit 3.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile

STACKS = ("megatron", "mindspeed")


@contextlib.contextmanager
def record_kwarg(owner, name: str, kwarg: str, into: list):
    """Within the block, `owner.name(...)` still runs, and the value of `kwarg` of every call is appended to `into`
    (the kernel is looked up on its module at call time, as MindSpeed's adaptor calls
    torch_npu.npu_fusion_attention)."""
    real = getattr(owner, name)

    def recording(*args, **kwargs):
        into.append(kwargs.get(kwarg))
        return real(*args, **kwargs)

    setattr(owner, name, recording)
    try:
        yield into
    finally:
        setattr(owner, name, real)


def mla_config_kwargs(spec, config_fields: set[str], kv_channels: int | None) -> dict:
    """MLATransformerConfig keyword arguments for `spec` as mbridge builds them (mbridge v0.15.1
    models/deepseek_v3.py `_build_config`: kv_channels from the HF config's head_dim), for the fields this
    megatron-core has."""
    rope = spec.rope_scaling
    kw = dict(num_layers=1, hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
              q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_head_dim=spec.qk_nope_head_dim,
              qk_pos_emb_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim, kv_channels=kv_channels,
              rope_type="yarn" if rope else "rope", rotary_base=spec.rope_theta,
              rotary_scaling_factor=rope.factor if rope else 1.0,
              mscale=rope.mscale if rope else 1.0, mscale_all_dim=rope.mscale_all_dim if rope else 1.0,
              use_cpu_initialization=True, perform_initialization=False)
    original = rope.original_max_position_embeddings if rope else 4096
    if "original_max_position_embeddings" in config_fields:  # core_r0.14.0+
        kw["original_max_position_embeddings"] = original
    else:  # core_r0.12/0.13: YarnRotaryEmbedding reads max_position_embeddings as the original length
        kw["max_position_embeddings"] = original
    # q_lora_rank=None (Moonlight: a plain q_proj) must be passed as None: Megatron-LM core_v0.12.1
    # MLATransformerConfig defaults q_lora_rank to 512, which would build DSV3's low-rank query instead. Other
    # Nones (kv_channels) mean "the release's default" and are left out.
    return {k: v for k, v in kw.items() if k in config_fields and (v is not None or k == "q_lora_rank")}


def _init_world() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    if dist.is_initialized():  # one world for every model of the run
        return
    store = tempfile.NamedTemporaryFile(prefix="harness-probe-", delete=False).name
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()


def _versions(*names: str) -> dict:
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def probe_megatron(spec, kv_channels: int | None) -> dict:
    import torch

    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"  # this subprocess only: see the module docstring
    _init_world()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    handed: list = []

    class RecordingCoreAttention(MegatronModule):
        """Keeps the softmax_scale MLA hands its core attention (TE's DotProductAttention passes it to the kernel)."""

        def __init__(self, config, *args, softmax_scale=None, **kwargs):
            super().__init__(config=config)
            handed.append(softmax_scale)

    fields = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    config = MLATransformerConfig(**mla_config_kwargs(spec, fields, kv_channels))
    attn_spec = get_gpt_layer_local_spec(multi_latent_attention=True).submodules.self_attention
    attn_spec.submodules.core_attention = ModuleSpec(module=RecordingCoreAttention)
    with torch.device("meta"):
        attn = build_module(attn_spec, config=config, layer_number=1)
    return {"module_scale": float(attn.softmax_scale), "kernel_scales": [float(s) for s in handed if s is not None],
            "versions": _versions("megatron-core", "torch")}


def probe_mindspeed(spec, kv_channels: int | None, seq: int = 16) -> dict:
    """NPU only; written from MindSpeed v2.2.0/v2.3.0_core_r0.12.1 and megatron-core core_r0.12.1 (module docstring)."""
    # MindSpeed parses sys.argv when its adaptor is imported: the features under test, nothing else.
    sys.argv = [sys.argv[0], "--use-flash-attn", "--multi-head-latent-attention",
                "--qk-rope-head-dim", str(spec.qk_rope_head_dim), "--qk-nope-head-dim", str(spec.qk_nope_head_dim),
                "--kv-lora-rank", str(spec.kv_lora_rank), "--v-head-dim", str(spec.v_head_dim)]
    import mindspeed.megatron_adaptor  # noqa: F401  (patches Megatron; transfer_to_npu)
    import torch
    import torch_npu

    _init_world()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    fields = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    kw = mla_config_kwargs(spec, fields, kv_channels)
    kw.update(use_cpu_initialization=False, perform_initialization=True, bf16=True, params_dtype=torch.bfloat16)
    config = MLATransformerConfig(**kw)
    attn_spec = get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=True).submodules.self_attention
    attn = build_module(attn_spec, config=config, layer_number=1).npu()
    hidden = torch.randn(seq, 1, spec.hidden_size, dtype=torch.bfloat16, device="npu")
    # True = masked (torch_npu.npu_fusion_attention atten_mask); causal, as the actor's forward
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device="npu"), diagonal=1)
    scales: list = []
    with torch.no_grad(), record_kwarg(torch_npu, "npu_fusion_attention", "scale", scales):
        out, _ = attn(hidden, mask)
    if not torch.isfinite(out.float()).all():
        raise RuntimeError("the MLA forward produced non-finite values")
    return {"module_scale": float(attn.softmax_scale), "kernel_scales": [float(s) for s in scales if s is not None],
            "versions": _versions("mindspeed", "megatron-core", "torch", "torch_npu")}


def main(argv: list[str] | None = None) -> int:
    from harness.config.models import get_model

    parser = argparse.ArgumentParser(prog="python -m harness.engines.megatron_probe",
                                     description="measure the training-side MLA softmax scale (one JSON line)")
    parser.add_argument("--stack", choices=STACKS, required=True)
    parser.add_argument("--model", required=True, nargs="+", help="harness.config.models names (one process)")
    parser.add_argument("--kv-channels", type=int, default=None,
                        help="TransformerConfig.kv_channels (default: the HF config's head_dim, as mbridge maps it)")
    args = parser.parse_args(argv)
    probe = probe_megatron if args.stack == "megatron" else probe_mindspeed
    results = []
    try:
        for spec in map(get_model, args.model):
            # transformers' DeepseekV3Config sets head_dim = qk_rope_head_dim; mbridge maps head_dim -> kv_channels
            kv_channels = args.kv_channels or spec.qk_rope_head_dim
            results.append({"stack": args.stack, "model": spec.name, "kv_channels": kv_channels,
                            **probe(spec, kv_channels)})
    except Exception as exc:  # one line back to the caller, whatever the stack raised
        first = (str(exc).strip().splitlines() or [""])[0]
        print(json.dumps({"error": f"{type(exc).__name__}: {first}"[:500]}))
        return 3
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
