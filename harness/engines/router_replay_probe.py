"""verl's router replay on the installed megatron-core, exercised for real: `python -m
harness.engines.router_replay_probe` prints one JSON line; `router_replay_outcomes()` runs it in a subprocess
(Megatron's parallel state is process-global, and verl's patch rewrites TopKRouter for the whole process).

verl 0.9.1 `verl/utils/megatron/router_replay_patch.py` imports `apply_router_token_dropping`,
`compute_routing_scores_for_aux_loss` and `group_limited_topk` from `megatron.core.transformer.moe.moe_utils` in
ONE try block; megatron-core core_r0.12.1 has `group_limited_topk` but not the other two, so the import fails as a
whole, the patch warns "NPU not support router replay for now." and leaves all three names unbound. Its patched
`TopKRouter.routing` then computes top-k through `_compute_topk`, which calls `group_limited_topk` whenever the
router is group-limited (DeepSeek-V3: n_group 8, topk_group 4). The probe builds megatron-core's own TopKRouter
(world size 1, gloo, CPU) with DeepSeek-V3's routing (sigmoid scores, expert bias, grouped top-k, scaling factor)
and without the group limit, applies verl's patch, and runs each replay action verl uses:
  record         RouterReplayAction.RECORD (R2, and the rollout-free forward of R3's old-log-prob pass)
  replay         REPLAY_FORWARD with targets only
  replay_masked  REPLAY_FORWARD with a replay mask, as verl's R3 always passes one (megatron engine
                 transformer_impl.py: `build_r3_replay_mask`; the final row keeps its native route)
  native         no action set (a forward of a replay-enabled model outside replay)
Each outcome is "ok" (replayed ids checked against the targets) or the exception's type and first line.

`gradients` (R3's backward; ISEEKYAN/Megatron-LM#79: a replay that takes its scores from a path without gradient
silently stops training the router): the router weight's gradient through a fixed weighting of the routing probs,
from a native forward and from REPLAY_FORWARD of that forward's own routes (equal to float noise when the replay
keeps the scores' graph), and from the same replay with its probs detached (the seeded Megatron-LM#79 class, whose
gradient is 0): each one's norm and its largest element-wise difference from the native gradient, or the error
the forward raised.
"""
from __future__ import annotations

import json
import sys
import warnings

ACTIONS = ("record", "replay", "replay_masked", "native")


def _router(grouped: bool, experts: int = 16, topk: int = 4):
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=32, num_attention_heads=2, num_moe_experts=experts, moe_router_topk=topk,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
        moe_router_num_groups=4 if grouped else None, moe_router_group_topk=2 if grouped else None,
        moe_router_topk_scaling_factor=2.5, moe_router_pre_softmax=False, moe_router_load_balancing_type="none",
        use_cpu_initialization=True, add_bias_linear=False, enable_routing_replay=True)
    return TopKRouter(config=config)


def _run(router, action: str, rrp) -> str:
    import torch

    tokens, topk = 5, router.topk
    hidden = torch.randn(tokens, 1, router.config.hidden_size, generator=torch.Generator().manual_seed(0))
    targets = torch.stack([torch.randperm(router.config.num_moe_experts)[:topk] for _ in range(tokens)])
    mask = torch.tensor([1, 1, 1, 1, 0]) if action == "replay_masked" else None
    rrp.RouterReplay.clear_global_indices()
    rrp.RouterReplay.clear_global_router_replay_action()
    if action == "record":
        rrp.RouterReplay.set_global_router_replay_action(rrp.RouterReplayAction.RECORD)
    elif action.startswith("replay"):
        router.router_replay.set_target_indices(targets, replay_mask=mask)
        rrp.RouterReplay.set_global_router_replay_action(rrp.RouterReplayAction.REPLAY_FORWARD)
    try:
        with torch.no_grad():
            _, routing_map = router(hidden)
    except Exception as exc:  # the outcome is the finding
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:300]
    if action.startswith("replay"):
        rows = range(tokens - 1) if mask is not None else range(tokens)
        got = [set(routing_map[i].nonzero().flatten().tolist()) for i in rows]
        if got != [set(targets[i].tolist()) for i in rows]:
            return "wrong: the replayed routing map is not the targets"
    return "ok"


def _gradient(router, rrp, hidden, weights, targets=None):
    """d sum(probs * weights) / d router.weight (zeros where no graph reaches the router) from one forward, native
    (targets None) or replaying `targets`; and the forward's routing map."""
    rrp.RouterReplay.clear_global_indices()
    rrp.RouterReplay.clear_global_router_replay_action()
    if targets is not None:
        router.router_replay.set_target_indices(targets)
        rrp.RouterReplay.set_global_router_replay_action(rrp.RouterReplayAction.REPLAY_FORWARD)
    router.zero_grad(set_to_none=True)
    probs, routing_map = router(hidden)
    loss = (probs.float() * weights).sum()
    if loss.requires_grad:  # no graph back to the router at all: its gradient is nothing
        loss.backward()
    rrp.RouterReplay.clear_global_router_replay_action()
    grad = router.weight.grad
    return (grad.detach().clone() if grad is not None else router.weight.detach() * 0), routing_map


def _detached_replay(router_cls, rrp):
    """The seeded Megatron-LM#79 class: under REPLAY_FORWARD the routing probs leave the graph."""
    import contextlib

    real = router_cls.routing

    def routing(self, logits, *args, **kwargs):
        probs, routing_map = real(self, logits, *args, **kwargs)
        replaying = getattr(self.router_replay, "router_replay_action", None) is rrp.RouterReplayAction.REPLAY_FORWARD
        return (probs.detach() if replaying else probs), routing_map

    @contextlib.contextmanager
    def installed():
        router_cls.routing = routing
        try:
            yield
        finally:
            router_cls.routing = real

    return installed()


def _gradients(router, rrp) -> dict:
    import torch

    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(6, 1, router.config.hidden_size, generator=gen)
    weights = torch.randn(6, router.config.num_moe_experts, generator=gen)
    try:
        native, routing_map = _gradient(router, rrp, hidden, weights)
        targets = torch.stack([row.nonzero().flatten() for row in routing_map])
        replay, _ = _gradient(router, rrp, hidden, weights, targets)
        with _detached_replay(type(router), rrp):
            detached, _ = _gradient(router, rrp, hidden, weights, targets)
    except Exception as exc:  # the outcome is the finding (core_r0.12.1's grouped router: NameError)
        return {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:300]}
    return {"native": float(native.norm()), "replay": float(replay.norm()),
            "replay_max_abs_diff": float((replay - native).abs().max()),
            "replay_detached": float(detached.norm()),
            "replay_detached_max_abs_diff": float((detached - native).abs().max())}


def probe() -> dict:
    import torch

    from harness.engines.megatron_probe import _init_world, _versions

    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"  # this subprocess only (see harness.engines.megatron_probe)
    _init_world()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from verl.utils.megatron import router_replay_patch as rrp
    rrp.apply_router_replay_patch()
    out = {"warnings": sorted({str(w.message) for w in caught if "replay" in str(w.message).lower()}),
           "unbound": [n for n in ("group_limited_topk", "apply_router_token_dropping",
                                   "compute_routing_scores_for_aux_loss") if n not in vars(rrp)],
           "versions": _versions("verl", "megatron-core", "torch")}
    for grouped in (True, False):
        router = _router(grouped)
        out["grouped" if grouped else "ungrouped"] = {action: _run(router, action, rrp) for action in ACTIONS}
        out["gradients_grouped" if grouped else "gradients_ungrouped"] = _gradients(router, rrp)
    return out


def router_replay_outcomes(timeout_s: float = 300.0) -> dict:
    """The probe's answer (see module docstring), run in a subprocess; HarnessError in one line when it fails."""
    import subprocess

    from harness.errors import HarnessError

    try:
        done = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"router replay probe: no answer in {timeout_s:.0f} s") from None
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"router replay probe exited {done.returncode}: {tail}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    try:
        print(json.dumps(probe()))
    except Exception as exc:  # one line back to the caller
        print(json.dumps({"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:500]}))
        sys.exit(3)
