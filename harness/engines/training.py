"""Training-side MLA: the naive (non-absorbed) forward the actor computes log-probs with.

`HFTrainingModel` is transformers' DeepseekV3ForCausalLM (the reference: eager attention, k/v expanded through
kv_b_proj, scale from `yarn_apply_mscale`). Megatron-core / MindSpeed MLA (the NPU training stack whose
softmax scale was wrong, seed 001 精度问题2) are measured by `training_scale`, which runs
harness.engines.megatron_probe in a subprocess (behind `requires(packages=[...])` in the suites).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.config.models import ModelSpec
from harness.engines.base import torch_threads
from harness.engines.weights import write_model_dir


class HFTrainingModel:
    """transformers DeepseekV3ForCausalLM built from a model directory or a state dict (random weights only)."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor] | str | Path, *,
                 dtype: torch.dtype = torch.float32, tmp_dir: str | Path | None = None):
        from transformers import AutoModelForCausalLM

        self.spec, self.dtype = spec, dtype
        if not isinstance(weights, (str, Path)):
            if tmp_dir is None:
                raise ValueError("HFTrainingModel(state_dict) needs tmp_dir to write the model directory")
            weights = write_model_dir(spec, weights, tmp_dir, dtype=dtype)
        self.model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=dtype,
                                                          attn_implementation="eager").eval()

    def attention_layers(self) -> list:
        return [layer.self_attn for layer in self.model.model.layers]

    def softmax_scale(self) -> float:
        return float(self.attention_layers()[0].scaling)

    @contextlib.contextmanager
    def softmax_scale_set(self, scale: float):
        """Within the block every attention layer uses `scale` (to build the wrong-scale comparison)."""
        saved = [attn.scaling for attn in self.attention_layers()]
        for attn in self.attention_layers():
            attn.scaling = scale
        try:
            yield self
        finally:
            for attn, old in zip(self.attention_layers(), saved, strict=True):
                attn.scaling = old

    @torch.no_grad()
    def response_logprobs(self, prompt: list[int], response: list[int]) -> torch.Tensor:
        """log-softmax [len(response), vocab] at the positions that predict each response token — what the actor
        computes for the rollout's tokens (teacher forcing)."""
        ids = torch.tensor([prompt + response])
        with torch_threads(1):  # tiny shapes (see harness.engines.base.torch_threads)
            logits = self.model(ids).logits[0].float()
        return logits[len(prompt) - 1: len(prompt) - 1 + len(response)].log_softmax(-1)


    @torch.no_grad()
    def routed_forward(self, prompts: list[list[int]], responses: list[list[int]], *,
                       replay: RouteReplay | None = None) -> RoutedForward:
        """The actor's teacher-forced forward on a verl-layout batch (prompts left-padded, responses right-padded,
        position ids from the attention mask: verl's `compute_position_id_with_mask`), recording in every MoE
        layer the experts each token was routed to and the router's choice scores; with `replay`, the router
        takes the replayed expert ids where `replay.mask` is set and its own elsewhere, and weighs them with its
        own scores (verl 0.9.1 utils/megatron/router_replay_patch.py `get_replay_topk`: `scores.gather(1,
        indices)`, then the same normalisation and scaling as the native route)."""
        spec = self.spec
        width_p, width_r = max(map(len, prompts)), max(map(len, responses))
        ids = torch.zeros(len(prompts), width_p + width_r, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            ids[b, width_p - len(p): width_p + len(r)] = torch.tensor(p + r)
            mask[b, width_p - len(p): width_p + len(r)] = 1
        if replay is not None and tuple(replay.targets.shape[:2]) != tuple(ids.shape):
            raise ValueError(f"replay targets {tuple(replay.targets.shape)} do not match the batch {tuple(ids.shape)}")
        layers = range(spec.first_k_dense_replace, spec.num_hidden_layers)
        routes = torch.zeros(*ids.shape, spec.num_hidden_layers, spec.num_experts_per_tok, dtype=torch.long)
        choice = torch.zeros(*ids.shape, spec.num_hidden_layers, spec.n_routed_experts)
        saved = {}
        for i in layers:
            gate = self.model.model.layers[i].mlp.gate
            saved[i] = gate.forward
            gate.forward = functools.partial(self._route, gate, i, saved[i], replay, routes, choice)
        try:
            with torch_threads(1):
                logits = self.model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
                                    ).logits.float()
        finally:
            for i, forward in saved.items():
                self.model.model.layers[i].mlp.gate.forward = forward
        logprobs = logits.log_softmax(-1)
        out_lp, out_routes, out_choice = [], [], []
        for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            steps = torch.arange(width_p - 1, width_p - 1 + len(r))
            out_lp.append(logprobs[b, steps, torch.tensor(r)])
            rows = slice(width_p - len(p), width_p + len(r))
            out_routes.append(routes[b, rows])
            out_choice.append(choice[b, rows])
        return RoutedForward(logprobs=out_lp, routes=out_routes, choice=out_choice, attention_mask=mask)

    @staticmethod
    def _route(gate, layer: int, native, replay, routes: torch.Tensor, choice: torch.Tensor, hidden: torch.Tensor):
        """One MoE layer's router (transformers DeepseekV3TopkRouter.forward: logits, weights, ids), recorded and,
        with `replay`, replayed."""
        logits, weights, ids = native(hidden)
        scores = logits.sigmoid()
        if replay is not None:
            target = replay.targets[:, :, layer].reshape(-1, ids.shape[-1]).to(ids.device)
            ids = torch.where(replay.mask.reshape(-1, 1).to(ids.device), target, ids)
            weights = scores.gather(1, ids)
            if gate.norm_topk_prob:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            weights = weights * gate.routed_scaling_factor
        routes[:, :, layer] = ids.view(*routes.shape[:2], -1)
        choice[:, :, layer] = (scores + gate.e_score_correction_bias).view(*choice.shape[:2], -1)
        return logits, weights, ids


@dataclass(frozen=True, eq=False)
class RouteReplay:
    """Expert ids to replay into the training forward: targets [B, S, num_hidden_layers, top_k] in the padded batch
    layout (absolute layer index), mask [B, S] True where the replayed ids replace the router's own."""

    targets: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True, eq=False)
class RoutedForward:
    """Per sample (unpadded, prompt then response): log-probs of the response tokens [R], the experts every token
    was routed to [P+R, num_hidden_layers, top_k] (dense layers zero, as vLLM's layout) and the router's choice
    scores (sigmoid + e_score_correction_bias, before the group limit) [P+R, num_hidden_layers, n_routed_experts];
    plus the batch's attention mask [B, S]."""

    logprobs: list[torch.Tensor]
    routes: list[torch.Tensor]
    choice: list[torch.Tensor]
    attention_mask: torch.Tensor


@dataclass(frozen=True)
class TrainingScale:
    """What harness.engines.megatron_probe measured on one training stack: the scale the MLA module computes and
    every scale that reached the attention kernel (MindSpeed: torch_npu.npu_fusion_attention's `scale=`)."""

    stack: str
    model: str
    module_scale: float
    kernel_scales: tuple[float, ...]
    versions: dict

    @property
    def name(self) -> str:
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items() if v)
        return f"{self.stack} MLA ({versions})"


def training_scale(stack: str, model: str, *, models: tuple[str, ...] = (), timeout_s: float = 600.0) -> TrainingScale:
    """What the probe of `stack` (megatron | mindspeed) measured for `model`, run in a subprocess (MindSpeed's adaptor
    patches the whole process: never in the caller's) together with `models` (one import of the stack; cached per
    stack and model set). HarnessError in one line when it fails."""
    found = _training_scales(stack, tuple(sorted({model, *models})), timeout_s)
    return found[model]


@functools.lru_cache(maxsize=8)
def _training_scales(stack: str, models: tuple[str, ...], timeout_s: float) -> dict[str, TrainingScale]:
    import json
    import subprocess
    import sys

    from harness.errors import HarnessError

    model = ", ".join(models)
    argv = [sys.executable, "-m", "harness.engines.megatron_probe", "--stack", stack, "--model", *models]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{stack} scale probe for {model}: no answer in {timeout_s:.0f} s") from None
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]  # the stacks print their own lines too
    try:
        doc = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"{stack} scale probe for {model} exited {done.returncode}: {tail}") from None
    if "error" in doc:
        raise HarnessError(f"{stack} scale probe for {model}: {doc['error']}")
    return {r["model"]: TrainingScale(stack=stack, model=r["model"], module_scale=r["module_scale"],
                                      kernel_scales=tuple(r["kernel_scales"]), versions=r.get("versions", {}))
            for r in doc["results"]}
