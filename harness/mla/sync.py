"""Weight syncs as verl does them: repeatedly, from one-shot generators, in buckets that split
layers, and with RL-sized updates.

verl 0.9.1's rollout worker receives the actor's weights as a generator of (name, tensor) in size-bounded buckets
(`verl/workers/rollout/vllm_rollout/utils.py` `_update_weights`, one `model.load_weights` per bucket), every step.
An engine that iterates its input twice, or re-derives only on the first sync, passes a single sync from a list.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch


def _layer(name: str) -> str:
    """'model.layers.3.self_attn.kv_b_proj.weight' -> 'model.layers.3'; other names are their own group."""
    parts = name.split(".")
    return ".".join(parts[:3]) if name.startswith("model.layers.") else name


def buckets(weights: dict[str, torch.Tensor], n: int = 3,
            split: tuple[str, ...] = ()) -> list[list[tuple[str, torch.Tensor]]]:
    """`weights` in checkpoint order, cut into `n` buckets, each cut moved to the middle of a layer (between its
    attention and its MLP weights) so a layer's weights arrive in two buckets, as verl's size-bounded buckets do.
    `split`: layers ("model.layers.3") cut once more, half-way through their MLP weights (between two routed
    experts in an MoE layer), so each of them arrives in two buckets too: an engine that re-packs or re-maps
    experts per bucket, or only for the layers a bucket completes, shows on every MoE layer."""
    items = list(weights.items())
    if n < 2 or len(items) < 2 * n:
        raise ValueError(f"buckets: need n >= 2 and at least {2 * n} weights, got n={n}, {len(items)} weights")
    cuts = []
    for k in range(1, n):
        at = k * len(items) // n
        # slide to a position where the weight before and after belong to the same layer
        while at < len(items) - 1 and _layer(items[at - 1][0]) != _layer(items[at][0]):
            at += 1
        cuts.append(at)
    for layer in split:
        mlp = [i for i, (name, _) in enumerate(items) if name.startswith(f"{layer}.mlp.")]
        if len(mlp) < 2:
            raise ValueError(f"buckets: {layer} has {len(mlp)} MLP weights, cannot split it")
        cuts.append(mlp[len(mlp) // 2])
    edges = [0, *sorted(set(cuts)), len(items)]
    return [items[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


def split_layers(parts: list[list[tuple[str, torch.Tensor]]]) -> set[str]:
    """The layers whose weights arrive in more than one bucket."""
    seen: dict[str, set[int]] = {}
    for i, part in enumerate(parts):
        for name, _ in part:
            seen.setdefault(_layer(name), set()).add(i)
    return {layer for layer, where in seen.items() if len(where) > 1 and layer.startswith("model.layers.")}


def split_mlps(parts: list[list[tuple[str, torch.Tensor]]]) -> set[str]:
    """The layers whose MLP weights (routed experts, router, shared experts) arrive in more than one bucket."""
    seen: dict[str, set[int]] = {}
    for i, part in enumerate(parts):
        for name, _ in part:
            if ".mlp." in name:
                seen.setdefault(_layer(name), set()).add(i)
    return {layer for layer, where in seen.items() if len(where) > 1}


def one_shot(part: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A generator over one bucket: iterable once, like verl's."""
    yield from part


def sync(engine, weights: dict[str, torch.Tensor], n_buckets: int = 3, split: tuple[str, ...] = ()) -> set[str]:
    """Sync `weights` into `engine` the way verl does: one `load_weights(generator)` per bucket (`split`: layers
    cut inside their MLP as well, see `buckets`). Returns the layers split across buckets (the caller asserts
    there is one, or the check could not catch a per-call bug)."""
    parts = buckets(weights, n_buckets, split)
    for part in parts:
        engine.load_weights(one_shot(part))
    return split_layers(parts)


def rl_update(weights: dict[str, torch.Tensor], rel: float, seed: int) -> dict[str, torch.Tensor]:
    """new = old + `rel` of each tensor's mean magnitude in Gaussian noise: an RL step's size (1 % .. 0.01 %)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, w in weights.items():
        scale = w.float().abs().mean()
        out[name] = (w.float() + rel * scale * torch.randn(w.shape, generator=gen)).to(w.dtype)
    return out
