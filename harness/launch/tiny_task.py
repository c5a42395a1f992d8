"""The tiny verl run's task: an offline tokenizer over the tiny model's whole vocabulary, prompts, and the reward
verl loads through `reward.custom_reward_function` (this file's path; verl imports it by file location, so it
imports nothing from the harness at module level).

The reward is DeepSeek-R1's language-consistency reward at char level: a prompt is a run of characters of one
script (Latin or Cyrillic) and the score is the share of the response written in that script, scaled to math_dapo's
[-1, 1]. An untrained tiny model then gets rewards that vary within every group (math_dapo's exact-answer score
gives every sample -1: zero GRPO advantages, nothing learns), and the policy can learn it.
"""
from __future__ import annotations

import string

EOS = "\n"
LATIN = string.ascii_letters
CYRILLIC = "".join(chr(c) for c in range(0x400, 0x4A0))  # 160 characters
# id -> character: EOS, the 95 printable ASCII characters, 160 Cyrillic ones = 256 = TINY.vocab_size, so the
# tokenizer covers the whole vocabulary (verl masks rollout logits at or above len(tokenizer)).
VOCAB = EOS + "".join(chr(c) for c in range(32, 127)) + CYRILLIC
SCRIPTS = {"latin": LATIN, "cyrillic": CYRILLIC}
PROMPT_CHARS = 8
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def build_tokenizer():
    """A transformers fast tokenizer: one token per character of VOCAB, EOS = pad = "\\n", a plain chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={ch: i for i, ch in enumerate(VOCAB)}, unk_token=EOS))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=EOS, unk_token=EOS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_rows(rng, count: int, split: str) -> list[dict]:
    """verl RLHFDataset rows (data_source, chat prompt, reward_model.ground_truth) of `count` prompts."""
    rows = []
    for index in range(count):
        script = ("latin", "cyrillic")[int(rng.integers(2))]
        chars = SCRIPTS[script]
        text = "".join(chars[int(i)] for i in rng.integers(len(chars), size=PROMPT_CHARS))
        rows.append({"data_source": "tiny-language-consistency", "prompt": [{"role": "user", "content": text}],
                     "ability": "language", "reward_model": {"style": "rule", "ground_truth": script},
                     "extra_info": {"split": split, "index": index}})
    return rows


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_kwargs):
    """Share of the response's characters in the prompt's script (`acc`, DAPO's filter metric) and the score
    2*acc - 1; an empty response scores -1."""
    text = solution_str.replace(EOS, "")
    script = SCRIPTS[ground_truth]
    acc = sum(ch in script for ch in text) / len(text) if text else 0.0
    return {"score": 2.0 * acc - 1.0, "acc": acc}
