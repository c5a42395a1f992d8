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
