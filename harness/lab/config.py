"""The lab's run options (LabConfig) and faults (FAULTS): importable without torch, so `ascend-rl-harness --help`
lists the lab's defaults without loading the stack (--help answers at once)."""
from __future__ import annotations

from dataclasses import dataclass

from harness.config.models import TINY_TASK, ModelSpec
from harness.errors import BadInput


@dataclass(frozen=True)
class LabFault:
    """How a fault flag configures the rollout side."""

    load_format: str = "real"
    engine_fault: str | None = None  # harness.engines.reference.EngineFault value
    sync: bool = True
    trainer_fault: str | None = None  # patched into the trainer's code from step FAULT_FROM_STEP on (loop._patched)


# The trainer faults start after harness.config.cpu_tier.FAULT_FROM_STEP healthy steps: a run that learns, then
# stops (issue 43's class).


FAULTS: dict[str, LabFault] = {
    "none": LabFault(),
    "stale-absorbed": LabFault(engine_fault="stale_copy"),
    "dummy-no-rederive": LabFault(load_format="dummy", engine_fault="stale_copy"),
    "wrong-scale": LabFault(engine_fault="scale_v_head"),
    "no-sync": LabFault(sync=False),
    # A run that stops learning, whichever part of the trainer stops it (issue 43): the advantage verl computes,
    # the policy loss verl returns, the optimizer's step; and ones that learn on half or a quarter of the updates, or
    # on every update at a quarter of its size (no step left out, so no KL rest).
    "zero-advantage": LabFault(trainer_fault="zero-advantage"),
    "dead-loss": LabFault(trainer_fault="dead-loss"),
    "frozen-optimizer": LabFault(trainer_fault="frozen-optimizer"),
    "half-updates": LabFault(trainer_fault="half-updates"),
    "quarter-updates": LabFault(trainer_fault="quarter-updates"),
    "damped-updates": LabFault(trainer_fault="damped-updates"),
}


# What a run made before a field existed ran at (its meta.json lacks the field): the lab's recipe until 2026-12-08
PREDATED_FIELDS = {"init_seed": None, "format_credit": 0.0}


@dataclass(frozen=True)
class LabConfig:
    """One lab run. Defaults: 8 prompts x 8 samples per step, responses up to 4 tokens."""

    steps: int = 30
    seed: int = 0
    # The policy's initial weights and its warm start (None: `seed`). Real RL starts every run from one pretrained
    # checkpoint, so a golden's runs and a candidate differ in data order and sampling only; a seed that also drew
    # the initial policy added the spread of many models to the spread of one (issue 43). One for every run since
    # 2026-12-08, with the graded reward below (docs/curves.md, "The lab's recipe").
    init_seed: int | None = 0
    fault: str = "none"
    gbs: int = 8  # prompts per step (data.train_batch_size)
    n: int = 8  # samples per prompt (rollout.n)
    ppo_mini_batch_size: int = 4  # prompts per optimizer update: 2 updates per step, so clipping is live (at most
    # one update per step when it is --gbs or more)
    max_response_length: int = 4
    overlong_buffer_len: int = 2  # DAPO overlong buffer: responses longer than 4 - 2 tokens are penalised
    overlong_penalty_factor: float = 1.0
    max_num_gen_batches: int = 4  # dynamic sampling: at most this many generation rounds per step
    temperature: float = 1.0
    lr: float = 1e-3
    head_scale: float = 0.1  # lm_head init x this: near-uniform first rollouts, so groups have reward variance
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    grad_clip: float = 1.0
    layers: int = 2
    # Warm start (issue 43: clean seeds must agree): before RL, this many supervised steps on the task's format --
    # one digit, then EOS -- whose digit is the right one with probability `warm_start_correct`, else uniform, so
    # RL starts from a policy that answers in format and is right about 0.2 + 0.8 / 4 = 40 % of the time, the way
    # real RL starts from a pretrained model. 0: RL from the random init.
    warm_start: int = 0
    warm_start_correct: float = 0.2
    # A graded reward (issue 43's lever): a wrong answer in the task's format (one digit, then EOS) scores
    # -1 + this, not math_dapo's -1. A clean seed that stops at once (an empty answer, no overlong penalty) then
    # sees a gradient out of that trap from its first in-format samples, not only from the 1 in 4 that are right.
    # At 0 (math_dapo's score, the lab's recipe until 2026-12-08) clean seeds were bimodal: a quarter stayed near
    # -0.95 over steps 5-14, and a golden of the fast ones flagged the slow ones (docs/curves.md).
    format_credit: float = 0.5

    def __post_init__(self):
        if self.fault not in FAULTS:
            raise BadInput(f"--fault {self.fault!r}: use one of {', '.join(FAULTS)}")
        if self.steps < 1 or self.gbs < 1 or self.n < 2:
            raise BadInput("--steps and --gbs must be >= 1 and --n >= 2 (GRPO needs a group)")
        if not 0.0 <= self.format_credit <= 2.0:
            raise BadInput("--format-credit must be in [0, 2]: a wrong answer in format scores -1 + it, a right one +1")
        if self.warm_start < 0 or not 0.0 <= self.warm_start_correct <= 1.0:
            raise BadInput("--warm-start must be >= 0 steps, and its share of right answers in [0, 1]")

    def spec(self) -> ModelSpec:
        """The tiny task model (the one the tiny scale's verl run trains) with `layers` layers."""
        return TINY_TASK if self.layers == TINY_TASK.num_hidden_layers else TINY_TASK.with_layers(self.layers)
