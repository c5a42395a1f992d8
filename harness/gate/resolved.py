"""`python -m harness.gate.resolved`: the algorithm config verl resolves for the tiny DAPO recipe, as flat JSON.

Run inside each gate stack: a verl upgrade can change a default the recipe never sets (the advantage's std
normalisation, a clip ratio, the loss aggregation), and the curves then move for a reason no override shows.
The recipe is the tiny scale's (harness.config.recipe.dapo_recipe), composed in the installed verl's own
ppo_trainer config; every key of `algorithm`, the actor's loss and optimiser, the rollout's sampling and the
reward is printed with its resolved value.
"""
from __future__ import annotations

import json
import sys

SECTIONS = ("algorithm", "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "reward")
# Below these the keys are hardware, paths or bookkeeping, not the algorithm
SKIPPED = ("fsdp_config", "megatron", "checkpoint", "profiler", "engine", "router_replay", "agent", "multi_turn",
           "trace", "server", "prometheus", "custom", "mtp", "qat", "quantization", "sglang_rollout_mode")


def resolved() -> dict[str, object]:
    from omegaconf import OmegaConf

    from harness.config.recipe import compose, dapo_recipe
    from harness.config.scales import get_scale

    config = compose(dapo_recipe(get_scale("tiny")))
    out: dict[str, object] = {}
    for section in SECTIONS:
        node = OmegaConf.select(config, section)
        if node is None:
            continue
        try:
            tree = OmegaConf.to_container(node, resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation to another section: the unresolved text is the value
            tree = OmegaConf.to_container(node, resolve=False)
        _flatten(section, tree, out)
    return out


def _flatten(prefix: str, node, out: dict) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if str(key) not in SKIPPED:
                _flatten(f"{prefix}.{key}", value, out)
    elif not isinstance(node, str) or not node.startswith(("/", "~")):
        out[prefix] = node


def main() -> int:
    json.dump(resolved(), sys.stdout, sort_keys=True, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
