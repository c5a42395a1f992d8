"""A DAPO loop on CPU that produces real reward curves and reproduces the real rollout faults.

Policy: transformers' DeepseekV3ForCausalLM (the training side, like verl's FSDP actor) built from a
tiny ModelSpec with random weights. Rollout: an Engine (`harness.engines.reference` by default) that
gets the actor's weights through `load_weights` before every step, as verl's weight sync does.
Algorithm: verl's own pieces, imported, not reimplemented: DAPORewardManager (math_dapo score +
overlong penalty), `compute_grpo_outcome_advantage`, the vanilla decoupled-clip policy loss
(clip 0.2 / 0.28, token-mean), `compute_data_metrics`, `calculate_debug_metrics`
(training/rollout_probs_diff_mean), `compute_timing_metrics` / `compute_throughout_metrics` (timing_s/*,
perf/total_num_tokens, perf/throughput over phases timed with verl's `marked_timer`, n_gpus = 1) and the
FileLogger. Dynamic sampling drops groups whose rewards have no variance and samples more groups until the
batch is full (DAPO).

Faults (seed 001) map onto the engine's fault options:
  stale-absorbed     W_UK_T / W_UV copied at init, never re-derived after sync (vllm-ascend; verl PR #4130)
  dummy-no-rederive  load_format=dummy and the same stale copies: decode runs on the dummy weights forever
  wrong-scale        MindSpeed's MLA softmax scale 1/sqrt(v_head_dim) instead of 1/sqrt(192) * mscale^2
  no-sync            the rollout never receives the actor's weights (a broken weight sync)
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from harness.config.models import ModelSpec
from harness.engines.base import torch_threads
from harness.io import versioned, write_json_atomic
from harness.lab.config import FAULTS, LabConfig, LabFault
from harness.metrics.keys import GRAD_NORM, META_FILE, METRICS_FILE, PG_LOSS
from harness.metrics.run import RUN_META_SCHEMA, RUN_META_VERSION

# verl's n_gpus for compute_throughout_metrics: the lab trains and rolls out in one CPU process (meta.json
# records the same count as "devices").
N_DEVICES = 1


# ---------------------------------------------------------------- weights: checkpoint names <-> HF modules
def hf_state_dict(checkpoint: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Checkpoint names -> transformers 5's DeepseekV3 state dict (routed experts fused per layer:
    experts.gate_up_proj [E, 2I, H] = cat(gate, up), experts.down_proj [E, H, I])."""
    out = {}
    for name, t in checkpoint.items():
        if ".mlp.experts." not in name:
            out[name] = t
    for i in range(spec.first_k_dense_replace, spec.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        e = range(spec.n_routed_experts)
        out[p + "gate_up_proj"] = torch.stack(
            [torch.cat([checkpoint[f"{p}{j}.gate_proj.weight"], checkpoint[f"{p}{j}.up_proj.weight"]]) for j in e])
        out[p + "down_proj"] = torch.stack([checkpoint[f"{p}{j}.down_proj.weight"] for j in e])
    return out


def checkpoint_weights(model: torch.nn.Module, spec: ModelSpec) -> Iterator[tuple[str, torch.Tensor]]:
    """The actor's weights by HF checkpoint name (what verl's weight sync hands the rollout); fused experts
    are split into per-expert views, no copies."""
    inter = spec.moe_intermediate_size
    for name, t in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            p = name.removesuffix("gate_up_proj")
            for j in range(t.shape[0]):
                yield f"{p}{j}.gate_proj.weight", t[j, :inter]
                yield f"{p}{j}.up_proj.weight", t[j, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            p = name.removesuffix("down_proj")
            for j in range(t.shape[0]):
                yield f"{p}{j}.down_proj.weight", t[j]
        else:
            yield name, t


def build_actor(spec: ModelSpec, seed: int, head_scale: float = 1.0):
    """transformers DeepseekV3ForCausalLM with `random_state_dict(spec, seed)` weights (fp32, eager attention),
    lm_head scaled by `head_scale`. Returns the model and its weights by checkpoint name."""
    from transformers import DeepseekV3ForCausalLM

    from harness.engines.weights import random_state_dict

    config = spec.to_hf_config(attn_implementation="eager")
    with torch.device("cpu"):
        model = DeepseekV3ForCausalLM(config)
    # the zero router bias baselines/tiny/dapo_lab.json was recorded with (scripts/make-tiny-golden)
    checkpoint = random_state_dict(spec, seed, zero_router_bias=True)
    # random_state_dict makes peaked next-token distributions (good for MLA forward checks); RL needs exploration.
    checkpoint["lm_head.weight"] = checkpoint["lm_head.weight"] * head_scale
    missing, unexpected = model.load_state_dict(hf_state_dict(checkpoint, spec), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"tiny actor weights do not match transformers' DeepseekV3: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    return model, checkpoint


def warm_start(model, spec: ModelSpec, seed: int, steps: int, correct: float) -> dict[str, torch.Tensor]:
    """`steps` supervised steps (AdamW, lr 3e-3, 64 prompts each) on the task's format: prompt "ab=", target one
    digit then EOS, the digit `a` with probability `correct` and uniform otherwise. Returns the trained weights by
    checkpoint name (what the rollout engine is built from). Measured on seeds 600-602: 150 steps leave every seed
    answering in format (EOS after the digit 0.97-1.0 on average) and right 28-37 % of the time; they cost 23.9 s of
    CPU on one thread of a 2-core AVX2 EPYC (issue 43's lever round), once per run."""
    from harness.config.task import DIGITS, EOS_ID, CharTokenizer

    tok = CharTokenizer()
    digit = torch.tensor([tok.encode(ch)[0] for ch in DIGITS])
    equals = tok.encode("=")[0]
    generator = torch.Generator().manual_seed(seed + 12345)  # its own stream: the RL run's draws are unchanged
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(steps):
        a, b, other = (torch.randint(0, len(DIGITS), (64,), generator=generator) for _ in range(3))
        answer = torch.where(torch.rand(64, generator=generator) < correct, a, other)
        ids = torch.stack([digit[a], digit[b], torch.full_like(a, equals), digit[answer],
                           torch.full_like(a, EOS_ID)], 1)
        logits = model(input_ids=ids).logits[:, 2:4]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 3:5].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {name: t.detach().clone() for name, t in checkpoint_weights(model, spec)}


@contextmanager
def _file_logger(path: Path):
    """verl's FileLogger writing to `path` (it reads VERL_FILE_LOGGER_PATH when constructed)."""
    from verl.utils.tracking import FileLogger

    previous = os.environ.get("VERL_FILE_LOGGER_PATH")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        logger = FileLogger("ascend-rl-harness-lab", path.parent.name)
    finally:
        if previous is None:
            os.environ.pop("VERL_FILE_LOGGER_PATH")
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = previous
    try:
        yield logger
    finally:
        logger.finish()


def _response_logprobs(model, input_ids: torch.Tensor, prompt_len: int, responses: torch.Tensor) -> torch.Tensor:
    """Actor log-probs of the response tokens [B, R] (causal: the padding after EOS cannot leak back)."""
    from verl.utils.torch_functional import logprobs_from_logits

    logits = model(input_ids=input_ids).logits[:, prompt_len - 1:-1]
    return logprobs_from_logits(logits, responses)


def run_lab(config: LabConfig, out_dir: str | Path, *, make_engine: Callable | None = None,
            progress: Callable[[int, dict], None] | None = None) -> Path:
    """Run the DAPO loop; writes `metrics.jsonl` (verl FileLogger) and `meta.json` into `out_dir`.

    make_engine(spec, *, weights, load_format, dtype, seed[, fault]) -> Engine (the `--engine` factory signature);
    default the reference engine, which also takes the injected `fault`.
    progress(step, metrics) is called after every step. Returns `out_dir`.
    """
    if make_engine is None:
        from harness.engines.reference import make_reference_engine as make_engine
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fault = FAULTS[config.fault]
    spec = config.spec()
    # The lab's tensors are tiny: intra-op threads only add spin/sync overhead, which on a shared 2-core CI
    # machine made steps 30x slower (measured 40-70 s/step with 2 threads under load vs ~1 s with one).
    updates = -(-config.gbs // config.ppo_mini_batch_size)  # optimizer steps per lab step (_update's mini-batches)
    with torch_threads(1):
        torch.manual_seed(config.seed)
        init = config.seed if config.init_seed is None else config.init_seed
        actor, checkpoint = build_actor(spec, init, config.head_scale)
        # The warm start is pre-training, not the run: it steps its own AdamW, so under the trainer fault's patch
        # its steps were counted as the run's and a --warm-start 150 run was frozen from its 7th SFT step, RL
        # starting from a half-trained policy (a fault caught for the wrong reason, not "learns, then stops").
        if config.warm_start:
            checkpoint = warm_start(actor, spec, init, config.warm_start, config.warm_start_correct)
        with _patched(fault.trainer_fault, updates):
            return _run(config, out, fault, spec, actor, checkpoint, make_engine, progress)


@contextmanager
def _patched(trainer_fault: str | None, updates_per_step: int = 2):
    """The trainer fault patched into the code the lab trains with -- verl's GRPO advantage and policy loss
    (verl.trainer.ppo.core_algos) and the optimizer's step -- from step FAULT_FROM_STEP on, the way a held-out fault
    is patched into verl's own code: the run's settings stay the same, so only its curves can tell."""
    if trainer_fault is None:
        yield
        return
    from verl.trainer.ppo import core_algos

    from harness.config.cpu_tier import FAULT_FROM_STEP, UPDATE_SCALE, UPDATES_KEPT, damped_step

    steps = {"n": 0}  # optimizer steps taken, `updates_per_step` per lab step
    onset = updates_per_step * FAULT_FROM_STEP
    live = lambda: steps["n"] >= onset  # noqa: E731
    saved = core_algos.compute_grpo_outcome_advantage, core_algos.get_policy_loss_fn, torch.optim.AdamW.step

    def advantage(*args, **kwargs):
        adv, ret = saved[0](*args, **kwargs)
        return (adv * 0, ret * 0) if trainer_fault == "zero-advantage" and live() else (adv, ret)

    def policy_loss_fn(name):
        loss_fn = saved[1](name)

        def dead(*args, **kwargs):
            loss, metrics = loss_fn(*args, **kwargs)
            return (loss * 0 if live() else loss), metrics
        return dead if trainer_fault == "dead-loss" else loss_fn

    # the optimizer faults take the first update of each `keep` from the onset, or each at `scale` of its move, as
    # verl's patch does
    keep, scale = UPDATES_KEPT.get(trainer_fault, 1), UPDATE_SCALE.get(trainer_fault)

    def step(self, *args, **kwargs):
        skip = live() and (keep is None or (steps["n"] - onset) % keep != 0)
        damp = live() and scale is not None
        steps["n"] += 1
        if skip:
            return None
        if damp:
            return damped_step(self, lambda: saved[2](self, *args, **kwargs), scale)
        return saved[2](self, *args, **kwargs)

    core_algos.compute_grpo_outcome_advantage, core_algos.get_policy_loss_fn = advantage, policy_loss_fn
    torch.optim.AdamW.step = step
    try:
        yield
    finally:
        core_algos.compute_grpo_outcome_advantage, core_algos.get_policy_loss_fn, torch.optim.AdamW.step = saved


def _run(config: LabConfig, out: Path, fault: LabFault, spec: ModelSpec, actor, checkpoint: dict, make_engine: Callable,
         progress: Callable[[int, dict], None] | None) -> Path:
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_policy_loss_fn
    from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
    from verl.utils.debug import marked_timer
    from verl.utils.debug.metrics import calculate_debug_metrics
    from verl.workers.config import ActorConfig
    from verl.workers.reward_manager.dapo import DAPORewardManager

    from harness.config.hardware import package_versions
    from harness.config.host import fingerprint
    from harness.config.task import EOS_ID, CharTokenizer, graded_score, make_prompts

    rng = np.random.default_rng(config.seed)
    # `fault` only for an injected fault: other engines (--engine) take the plain factory signature.
    injected = {"fault": fault.engine_fault} if fault.engine_fault else {}
    engine = make_engine(spec, weights=checkpoint, load_format=fault.load_format, dtype=torch.float32,
                         seed=config.seed, **injected)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=config.lr, weight_decay=0.0)
    actor_cfg = ActorConfig(strategy="fsdp", clip_ratio_low=config.clip_ratio_low,
                            clip_ratio_high=config.clip_ratio_high, loss_agg_mode="token-mean",
                            ppo_mini_batch_size=config.ppo_mini_batch_size, ppo_micro_batch_size_per_gpu=1,
                            use_dynamic_bsz=False, rollout_n=config.n)
    policy_loss = get_policy_loss_fn("vanilla")
    overlong = dataclasses.make_dataclass("Overlong", ["enable", "len", "penalty_factor", "log"])(
        True, config.overlong_buffer_len, config.overlong_penalty_factor, False)
    score = functools.partial(graded_score, format_credit=config.format_credit)  # 0: math_dapo's score
    reward_fn = DAPORewardManager(CharTokenizer(), num_examine=0, compute_score=score,
                                  max_resp_len=config.max_response_length, overlong_buffer_cfg=overlong)
    R = config.max_response_length
    meta = {"name": out.name, "scale": "tiny", "hardware": "cpu", "devices": N_DEVICES, "versions": package_versions(),
            "lab": dataclasses.asdict(config), "model": spec.name, "engine": getattr(engine, "name", "engine"),
            "host": fingerprint()}
    write_json_atomic(out / META_FILE, versioned(RUN_META_SCHEMA, RUN_META_VERSION, meta))

    with _file_logger(out / METRICS_FILE) as logger:
        for step in range(1, config.steps + 1):
            # Phases timed with verl's marked_timer under ray_trainer's names (accumulated over DAPO's
            # generation rounds, as its `gen` is), so `throughput` reads a lab run like a cluster run.
            timing_raw: dict[str, float] = {}
            with marked_timer("step", timing_raw):
                if fault.sync:  # verl syncs actor -> rollout weights in place before every generation
                    with marked_timer("update_weights", timing_raw):
                        engine.load_weights(checkpoint_weights(actor, spec))
                rounds, kept = [], []
                for round_index in range(config.max_num_gen_batches):
                    prompts = make_prompts(rng, config.gbs)
                    with marked_timer("gen", timing_raw):
                        rollout = engine.sample([list(p.token_ids) for p in prompts for _ in range(config.n)], R,
                                                temperature=config.temperature, eos_token_id=EOS_ID,
                                                seed=config.seed * 1_000_003 + step * 101 + round_index)
                    batch = _batch(prompts, rollout, config, DataProto)
                    with marked_timer("reward", timing_raw):
                        reward = reward_fn(batch, return_dict=True)["reward_tensor"]
                    batch.batch["token_level_scores"] = reward
                    batch.batch["token_level_rewards"] = reward
                    with marked_timer("adv", timing_raw):
                        adv, ret = compute_grpo_outcome_advantage(reward, batch.batch["response_mask"],
                                                                  batch.non_tensor_batch["uid"])
                    batch.batch["advantages"], batch.batch["returns"] = adv, ret
                    rounds.append(batch)
                    scores = reward.sum(-1).view(config.gbs, config.n)
                    kept.extend((len(rounds) - 1, g) for g in range(config.gbs) if scores[g].std() > 0)
                    if len(kept) >= config.gbs:
                        break
                # The reward curve is the policy's: all groups of the first round, before the DAPO filter
                # (the filtered batch holds mixed groups only, so its mean says little about the policy).
                metrics = compute_data_metrics(rounds[0], use_critic=False)
                everything = DataProto.concat(rounds)
                with marked_timer("old_log_prob", timing_raw), torch.no_grad():
                    everything.batch["old_log_probs"] = _response_logprobs(
                        actor, everything.batch["input_ids"], everything.batch["prompts"].shape[1],
                        everything.batch["responses"])
                metrics.update(calculate_debug_metrics(everything))
                rows = _kept_rows(kept, config)
                with marked_timer("update_actor", timing_raw):
                    metrics.update(_update(actor, optimizer, everything, rows, config, actor_cfg, policy_loss))
            metrics["train/num_gen_batches"] = len(rounds)
            metrics["train/kept_groups"] = min(len(kept), config.gbs)
            # verl's perf metrics on the batch it trains on (DAPO: the kept groups, GBS x n sequences), with
            # its own token count (ray_trainer sets global_token_num = attention_mask sums): perf/throughput
            # = prompt + response tokens / (step s x devices), not generated tokens / step s.
            trained = everything[rows]
            trained.meta_info["global_token_num"] = torch.sum(trained.batch["attention_mask"], dim=-1).tolist()
            metrics.update(compute_timing_metrics(trained, timing_raw))
            metrics.update(compute_throughout_metrics(trained, timing_raw, n_gpus=N_DEVICES))
            logger.log(metrics, step)
            if progress is not None:
                progress(step, metrics)
    if hasattr(engine, "close"):
        engine.close()
    return out


def _batch(prompts, rollout, config: LabConfig, DataProto):
    """A verl DataProto of one generation round: prompts, responses padded with EOS, masks, rollout log-probs."""
    from harness.config.task import EOS_ID

    R, n = config.max_response_length, config.n
    prompt_ids = torch.tensor([p.token_ids for p in prompts for _ in range(n)])
    responses = torch.full((len(prompt_ids), R), EOS_ID, dtype=torch.long)
    mask = torch.zeros(len(prompt_ids), R, dtype=torch.long)
    rollout_logp = torch.zeros(len(prompt_ids), R, dtype=torch.float32)
    for i, (ids, logps) in enumerate(zip(rollout.token_ids, rollout.logprobs, strict=True)):
        responses[i, :len(ids)] = torch.tensor(ids)
        mask[i, :len(ids)] = 1
        rollout_logp[i, :len(ids)] = torch.tensor(logps)
    attention = torch.cat([torch.ones_like(prompt_ids), mask], dim=1)
    uid = np.array([f"{i // n}-{prompts[i // n].token_ids}" for i in range(len(prompt_ids))], dtype=object)
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": responses, "input_ids": torch.cat([prompt_ids, responses], 1),
                 "attention_mask": attention, "response_mask": mask, "rollout_log_probs": rollout_logp},
        non_tensors={"uid": uid, "data_source": np.array(["lab"] * len(prompt_ids), dtype=object),
                     "reward_model": np.array([{"ground_truth": p.ground_truth} for p in prompts for _ in range(n)],
                                              dtype=object)})


def _kept_rows(kept: list[tuple[int, int]], config: LabConfig) -> torch.Tensor:
    """Row indices (into the concatenated rounds) of the first GBS kept groups: the batch DAPO trains on."""
    round_size = config.gbs * config.n
    return torch.tensor([r * round_size + g * config.n + k for r, g in kept[:config.gbs] for k in range(config.n)],
                        dtype=torch.long)


def _update(actor, optimizer, everything, rows: torch.Tensor, config: LabConfig, actor_cfg, policy_loss) -> dict:
    """PPO update on the kept rows, in mini-batches of `ppo_mini_batch_size` prompts."""
    if not len(rows):
        return {}  # no group with reward variance: DAPO skips the update (nothing is logged for the actor)
    batch = everything.batch
    per_group = config.n
    sums: dict[str, float] = {}
    chunks = [rows[i:i + config.ppo_mini_batch_size * per_group]
              for i in range(0, len(rows), config.ppo_mini_batch_size * per_group)]
    for chunk in chunks:
        mask = batch["response_mask"][chunk]
        logp = _response_logprobs(actor, batch["input_ids"][chunk], batch["prompts"].shape[1],
                                  batch["responses"][chunk])
        loss, pg_metrics = policy_loss(batch["old_log_probs"][chunk], logp, batch["advantages"][chunk], mask,
                                       loss_agg_mode="token-mean", config=actor_cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(actor.parameters(), config.grad_clip)
        optimizer.step()
        for key, value in {PG_LOSS: float(loss.detach()), GRAD_NORM: float(grad_norm),
                           **pg_metrics}.items():
            sums[key] = sums.get(key, 0.0) + value
    out = {k: v / len(chunks) for k, v in sums.items()}
    out["actor/lr"] = config.lr
    return out
