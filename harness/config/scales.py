"""Scale registry: model x hardware x parallel plan x DAPO batch, from `tiny` (CPU) to `full` (671B).

The pytest tier markers (`tiny`, `layer`, `reduced`, `moonlight`, `full`) name the `tier` of a scale;
several scales can share a tier (full-a2-gbs32, full-a2-gbs128, full-a3). Targets that suites assert
(tokens/s per card) live here, next to the configuration they belong to.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.config.hardware import PROFILES, HardwareProfile
from harness.config.models import MODELS, ModelSpec
from harness.config.plans import ParallelPlan, Recompute, RolloutParallel, TrainParallel, validate_plan
from harness.errors import BadInput

TIERS = ("tiny", "layer", "reduced", "moonlight", "full")
# Tiers that run anywhere -- CPU, or one card: tiny is small, layer traces one full-size layer with fake tensors
# (its plan is the cluster's it is sharded as, not what it runs on).
LOCAL_TIERS = ("tiny", "layer")


@dataclass(frozen=True)
class DapoBatch:
    """DAPO batch settings (verl data/rollout keys): prompts per step, samples per prompt, lengths."""

    gbs: int  # data.train_batch_size: prompts per step
    n: int  # actor_rollout_ref.rollout.n
    max_prompt_length: int
    max_response_length: int
    ppo_mini_batch_size: int | None = None  # prompts per optimizer step; defaults to gbs
    micro_batch_size_per_device: int = 1
    overlong_buffer_len: int = 0  # DAPO overlong buffer; 0 derives max_response // 4

    @property
    def sequences(self) -> int:
        return self.gbs * self.n

    @property
    def mini_batch(self) -> int:
        """Prompts per optimizer step, the default resolved (what the overrides and the memory model use)."""
        return self.ppo_mini_batch_size or self.gbs

    @property
    def overlong_buffer(self) -> int:
        """The DAPO overlong buffer in tokens, the default resolved (max response // 4)."""
        return self.overlong_buffer_len or self.max_response_length // 4

    def resolved(self) -> dict:
        """The batch as JSON with every default resolved: `plan --json` printed `ppo_mini_batch_size: null` and
        `overlong_buffer_len: 0` beside overrides that say 512 and 768."""
        import dataclasses

        return {**dataclasses.asdict(self), "ppo_mini_batch_size": self.mini_batch,
                "overlong_buffer_len": self.overlong_buffer}

    @property
    def max_sequence_length(self) -> int:
        return self.max_prompt_length + self.max_response_length


def plural(n: int, noun: str) -> str:
    """`1 card`, `2 cards`: counts in messages read as written ("1 devices = 1 cpu cards" did not)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class Targets:
    """What a run of this scale must reach. None: no absolute target (regression vs baseline only)."""

    tps_per_card: float | None = None
    regression_tolerance: float = 0.05  # relative, vs baseline (verl Ascend nightly: throughput >= -5%)
    memory_headroom_gib: float = 2.0  # each phase must leave this much of the device free


@dataclass(frozen=True)
class Scale:
    name: str
    tier: str
    model: ModelSpec
    hardware: HardwareProfile
    devices: int  # torch devices (dies on A3); the world size
    nodes: int
    plan: ParallelPlan
    batch: DapoBatch
    targets: Targets = field(default_factory=Targets)
    graph_mode: bool = True  # vLLM enforce_eager=False (graph capture / aclgraph)
    chunked_prefill: bool = True  # chunked prefill for MLA (seed 001: vanilla prefill OOMs at GBS 128)
    load_format: str = "dummy"  # rollout weights come from the actor via weight sync
    description: str = ""
    # verl megatron param + optimizer offload (param_offload also releases the grad buffers), emitted in the scale's
    # job (harness.config.recipe.dapo_recipe): the memory model reads the job's overrides only, and verl 0.9.1
    # defaults both to False. Seed 001 (A2 256 cards) and seed 002 (A3) ran with them; without them the 671B
    # plans need ~114 GiB per device (issue 44).
    offload: bool = False

    @property
    def cards(self) -> int:
        return self.devices // self.hardware.dies_per_card

    @property
    def devices_per_node(self) -> int:
        return self.devices // self.nodes

    @property
    def runs_on(self) -> str:
        """What running the scale needs, in words (`layer`'s 256 devices are the plan it is sharded as)."""
        if self.tier in LOCAL_TIERS:
            return "CPU or 1 card"
        return f"{plural(self.cards, f'{self.hardware.name} card')} on {plural(self.nodes, 'node')}"

    @property
    def sharded_as(self) -> str:
        """The devices the plan is laid out for: `256 a2 devices = 256 cards`, `256 a3 dies = 128 cards`."""
        unit = "die" if self.hardware.dies_per_card > 1 else "device"
        return f"{plural(self.devices, f'{self.hardware.name} {unit}')} = {plural(self.cards, 'card')}"

    def validate(self) -> None:
        validate_plan(self.plan, self.model, self.devices)


def _plan(tp, pp, ep=1, etp=1, cp=1, stage_layers=(), rtp=1, rdp=1, rep=1, recompute=None) -> ParallelPlan:
    return ParallelPlan(TrainParallel(tp, pp, ep, etp, cp, tuple(stage_layers), recompute),
                        RolloutParallel(rtp, rdp, rep))


def _recompute_every_layer(layers_per_stage: int) -> Recompute:
    """Full recompute of every layer, one checkpoint per layer (Megatron `block` with num_layers >= the layers of
    any stage): seed 002 recomputes 8 layers per stage of 7-8 ("重计算改为8层"), as verl's r1_ascend 671B recipe
    does (recompute_granularity=full, recompute_method=block, recompute_num_layers=8)."""
    return Recompute(method="block", num_layers=layers_per_stage)


_DSV3 = MODELS["deepseek-v3"]
# Seed 001, Atlas 800T A2 256 cards: TP8 PP16 EP16 ETP1, first stage 3 layers, last 2, middle 4;
# rollout TP8 EP64 (EP spans an instance of 64 devices, so DP8 inside it).
_A2_FULL_PLAN = _plan(8, 16, 16, 1, 1, TrainParallel.uniform_middle(61, 16, 3, 2), rtp=8, rdp=8, rep=64,
                      recompute=_recompute_every_layer(4))
# Seed 002's A3 split is 7,7,8,8,8,8,8,7 (MindSpeed's --num-layer-list, set by MindSpeed-LLM's checkpoint
# converter); megatron-core core_r0.12.1 -- MindSpeed's line -- has no pipeline_model_parallel_layout (core_r0.13+)
# and MindSpeed's --num-layer-list never reaches verl's TransformerConfig, so the closest split it can express is
# first/last-stage counts with an even middle: 6,8,8,8,8,8,8,7, exactly what verl's r1_ascend 671B recipe runs on
# A3 256 dies (num_layers_in_first_pipeline_stage=6, num_layers_in_last_pipeline_stage=7). Same largest stage (8).
A3_STAGE_LAYERS = TrainParallel.uniform_middle(61, 8, 6, 7)

SCALES: dict[str, Scale] = {s.name: s for s in (
    # The tiny task's batch, the lab's (harness.lab.config): 8 prompts x 8 samples, 2 optimizer steps per step,
    # answers of up to 4 tokens with the overlong penalty past 2, so the run learns inside the alignment window.
    # Micro batches of 8 sequences, not 1: in exact arithmetic the same loss, as verl's FSDP engine normalises a
    # token-mean loss by the mini batch's token count before it splits it (verl 0.9.1
    # verl/workers/engine/fsdp/transformer_impl.py, FSDPEngine.forward_backward_batch: batch_num_tokens;
    # trainer/ppo/core_algos.py agg_loss), in 8x fewer passes: on the 2-core EPYC a tiny step 8.2 -> 5.2 s (old
    # log-probs 1.2 -> 0.35 s, the update 2.6 -> 0.6 s). The tiny model's gradient through verl's padding agrees
    # with micro batches of 1 to 7e-7 (tests/test_tiny_verl.py). Over 21 seeds the runs spread less (reward window
    # sd 0.185 -> 0.104), which the 10 seeds run after the question was raised do not confirm alone (docs/curves.md);
    # the verl golden (baselines/tiny/dapo_verl.json) is recorded at this micro batch.
    Scale("tiny", "tiny", MODELS["tiny-dsv3-task"], PROFILES["cpu"], 1, 1, _plan(1, 1),
          DapoBatch(gbs=8, n=8, max_prompt_length=8, max_response_length=4, ppo_mini_batch_size=4,
                    overlong_buffer_len=2, micro_batch_size_per_device=8),
          description="random-init tiny DeepSeek-V3 (2 layers, latent 576) on CPU: every suite, seconds"),
    Scale("layer", "layer", _DSV3, PROFILES["a2"], 256, 32, _A2_FULL_PLAN,
          DapoBatch(gbs=128, n=16, max_prompt_length=2048, max_response_length=8192),
          offload=True,
          description="one full-size DSV3 decoder layer (dense and MoE) sharded as on A2 256 cards; "
                      "1 card, or CPU with fake tensors"),
    Scale("reduced-a2", "reduced", MODELS["deepseek-v3-4l"], PROFILES["a2"], 8, 1,
          _plan(8, 1, 8, 1, rtp=8, rdp=1, rep=8, recompute=_recompute_every_layer(4)),
          DapoBatch(gbs=16, n=4, max_prompt_length=1024, max_response_length=1024),
          description="DSV3 dims, 4 layers (3 dense + 1 MoE), one Atlas 800T A2 node"),
    Scale("moonlight-a2", "moonlight", MODELS["moonlight-16b-a3b"], PROFILES["a2"], 16, 2,
          _plan(4, 2, 8, 1, stage_layers=(14, 13), rtp=4, rdp=4, rep=16, recompute=_recompute_every_layer(14)),
          DapoBatch(gbs=32, n=8, max_prompt_length=2048, max_response_length=4096),
          description="Moonlight-16B-A3B DAPO alignment run on two A2 nodes"),
    Scale("full-a2-gbs32", "full", _DSV3, PROFILES["a2"], 256, 32, _A2_FULL_PLAN,
          DapoBatch(gbs=32, n=16, max_prompt_length=2048, max_response_length=12288, micro_batch_size_per_device=2),
          offload=True,
          description="seed 001 case 1: GBS 32, 2k prompt -> 12k response (the logits OOM when responses run long)"),
    Scale("full-a2-gbs128", "full", _DSV3, PROFILES["a2"], 256, 32, _A2_FULL_PLAN,
          DapoBatch(gbs=128, n=16, max_prompt_length=2048, max_response_length=8192, micro_batch_size_per_device=2),
          offload=True,
          description="seed 001 case 2: GBS 128, 2k -> 8k (the vanilla MLA prefill OOM)"),
    # Seed 002, Atlas A3 128 cards = 256 dies: TP4 PP8 EP8, layers 6,8,...,8,7 (A3_STAGE_LAYERS: the seed's
    # 7,7,8,8,8,8,8,7 cannot be expressed on core_r0.12.1); rollout TP2 DP64 EP128 (two instances of 128 dies);
    # GBS 512, n 16, 1k/3k, graph mode, recompute 8 layers per stage -> 120 TPS per card.
    Scale("full-a3", "full", _DSV3, PROFILES["a3"], 256, 16,
          _plan(4, 8, 8, 1, stage_layers=A3_STAGE_LAYERS, rtp=2, rdp=64, rep=128, recompute=_recompute_every_layer(8)),
          DapoBatch(gbs=512, n=16, max_prompt_length=1024, max_response_length=3072),
          targets=Targets(tps_per_card=120.0), offload=True,
          description="seed 002: DSV3 671B on Atlas A3 128 cards (256 dies), 120 TPS/card with graph mode; "
                      "stages 6,8,8,8,8,8,8,7 (the seed's 7,7,8,8,8,8,8,7 is not expressible on megatron-core "
                      "0.12: first/last stage counts only)"),
)}

# The scale a tier marker selects when --scale is not given, per detected hardware profile.
DEFAULT_SCALE_FOR_TIER = {"tiny": "tiny", "layer": "layer", "reduced": "reduced-a2",
                          "moonlight": "moonlight-a2", "full": "full-a3"}


def get_scale(name: str) -> Scale:
    """The registered scale `name`; BadInput (the `--scale` option named) when there is none."""
    try:
        return SCALES[name]
    except KeyError:
        raise BadInput(f"--scale: unknown scale {name!r}; known: {', '.join(SCALES)} "
                       "(see `ascend-rl-harness scales`)") from None


def default_scale(tier: str, hardware: str | None = None) -> Scale:
    """The scale a bare tier marker means; on A2 hardware `full` means the A2 plan."""
    if tier == "full" and hardware == "a2":
        return SCALES["full-a2-gbs128"]
    return SCALES[DEFAULT_SCALE_FOR_TIER[tier]]
