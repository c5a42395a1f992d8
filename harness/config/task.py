"""The tiny scale's learnable task and its reward, in math_dapo's `Answer: X` style: one task for the lab
(harness.lab) and for verl's real trainer (harness.launch.tiny_verl writes it as parquet + tokenizer).

Char-level vocabulary "\\n0123=" ("\\n" is EOS), which is the whole vocabulary of the tiny task model
(harness.config.models.TINY_TASK). A prompt is two digits and "=", e.g. "31=", and the correct answer is the
FIRST digit ("3"): copying it needs attention back over the prompt, so the MLA path (and its faults) sits on the
learning signal. The prompt plays the role of the assistant prefill "Answer:", so the scored solution is
"Answer: " + response, and verl's own math_dapo.compute_score gives +1 / -1; verl's DAPO reward manager adds the
overlong penalty. Why this task and not a large vocabulary: with 6 tokens EOS is sampled from the first rollouts
(1 in 6), so the overlong penalty is something a random-init model can learn to avoid within the 5th-14th steps
the alignment window judges; a 256-token language-consistency task left verl's tiny run flat (reward ~-1.1,
responses pinned at the maximum, grad_norm flat at 0.72, entropy 5.525 -> 5.520 in 15 steps).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VOCAB = "\n0123="
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
DATA_SOURCE = "tiny-copy-first-digit"
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


def graded_score(data_source, solution_str, ground_truth, extra_info=None, *, format_credit: float):
    """compute_score, with -1 + `format_credit` for a wrong answer in the task's format: one digit, then EOS (which
    verl's DAPORewardManager strips before it scores; a lone digit without one cannot be sampled below the length
    cap of 4)."""
    result = compute_score(data_source, solution_str, ground_truth, extra_info)
    if not result["acc"] and len(solution_str.rstrip(VOCAB[EOS_ID])) == 1 and solution_str[0] in DIGITS:
        result["score"] = -1.0 + format_credit
    return result


def build_tokenizer():
    """A transformers fast tokenizer over VOCAB (one token per character, the model's whole vocabulary: verl masks
    rollout logits at or above len(tokenizer)), EOS = pad = "\\n", a plain chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={ch: i for i, ch in enumerate(VOCAB)}, unk_token=VOCAB[EOS_ID]))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    eos = VOCAB[EOS_ID]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos, pad_token=eos, unk_token=eos)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_rows(rng: np.random.Generator, count: int, split: str) -> list[dict]:
    """verl RLHFDataset rows (data_source, chat prompt, reward_model.ground_truth) of `count` prompts."""
    tok = CharTokenizer()
    return [{"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": tok.decode(p.token_ids)}],
             "ability": "copy", "reward_model": {"style": "rule", "ground_truth": p.ground_truth},
             "extra_info": {"split": split, "index": index}}
            for index, p in enumerate(make_prompts(rng, count))]
