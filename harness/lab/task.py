"""The lab's learnable synthetic task and its reward, in math_dapo's `Answer: X` style.

Char-level vocabulary "\\n0123=" ("\\n" is EOS). A prompt is two digits and "=", e.g. "31=", and the
correct answer is the FIRST digit ("3"): copying it needs attention back over the prompt, so the MLA
path (and its faults) sits on the learning signal. The prompt plays the role of the assistant prefill
"Answer:", so the scored solution is "Answer: " + response, and verl's own math_dapo.compute_score
gives +1 / -1; verl's DAPORewardManager adds the overlong penalty.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VOCAB = "\n0123="
EOS_ID = 0
DIGITS = "0123"


class CharTokenizer:
    """The slice of the HF tokenizer API verl's DAPORewardManager uses (decode, eos_token)."""

    eos_token = VOCAB[EOS_ID]
    eos_token_id = EOS_ID
    pad_token_id = EOS_ID

    def encode(self, text: str) -> list[int]:
        return [VOCAB.index(ch) for ch in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(VOCAB[int(i)] for i in ids)


@dataclass(frozen=True)
class Prompt:
    token_ids: tuple[int, ...]
    ground_truth: str


def make_prompts(rng: np.random.Generator, count: int) -> list[Prompt]:
    """`count` prompts "ab=" with ground truth "a" (digits drawn from `rng`)."""
    tok = CharTokenizer()
    out = []
    for a, b in rng.integers(0, len(DIGITS), size=(count, 2)):
        out.append(Prompt(tuple(tok.encode(f"{DIGITS[a]}{DIGITS[b]}=")), DIGITS[a]))
    return out


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's math_dapo score of "Answer: <response>" (the prompt is the "Answer:" prefill)."""
    from verl.utils.reward_score import math_dapo

    return math_dapo.compute_score("Answer: " + solution_str, ground_truth)
