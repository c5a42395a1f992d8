"""Credentials out of everything the harness writes: `redact` is the one function every writer of a command line,
URL, environment or free text calls -- report JSON/HTML/Markdown (the collector and the renderer), the console,
pytest.log, launch.json, the error lines. A report keeps the full command line, so `--ray-address
https://user:TOKEN@head:8265` was published with the nightly HTML and printed on the console.

A leaf module (no harness imports) so the report collector, the launcher and the CLI can all use it.
"""
from __future__ import annotations

import re

MASK = "***"
# scheme://user:password@ (or scheme://token@). The lookbehind starts a scheme only where a run of scheme characters
# starts: without it every letter of a 300 kB word began a new scan to the word's end (issue 48: quadratic, `plan`
# ran past 120 s and a pytest failure printing such a line took 267 s).
_CREDENTIALS = re.compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
# a query parameter that carries a secret: ?token=..., &sig=...
_SECRET_QUERY = re.compile(r"(?i)([?&](?:token|access_token|auth|key|password|secret|sig|signature)=)[^&#\s]+")
# A secret's name ends in a secret word: RAY_AUTH_TOKEN, HF_TOKEN, WANDB_API_KEY, --ray-auth-token, DB_PASSWORD; or
# its last part (after `_`, `.` or `-`) is a short one: WANDB_KEY, +trainer.wandb_key, SMTP_PASS, GH_PAT, PRIVATE_KEY
# (issue 48: those were printed, put in --json and in the manifest's env). verl's `max_num_batched_tokens=8192`,
# `ppo_max_token_len_per_gpu`, `bypass_mode` or `monkey` stay as they are.
_LONG_WORD = r"(?:token|secret|password|passwd|passphrase|credentials?|api[_-]?key|access[_-]?key)"
_SHORT_WORD = r"(?:key|pass|pat|pwd)"
_SECRET_WORD = rf"(?:[\w.-]*?{_LONG_WORD}|(?:[\w.-]*?[_.-])?{_SHORT_WORD})"
_SECRET_ASSIGNMENT = re.compile(rf"(?i)(?<![\w.-])({_SECRET_WORD}=)[^\s&#'\"]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s'\"]+")
_SECRET_NAME = re.compile(rf"(?i)^[-+~]*{_SECRET_WORD}$")  # a variable or key that holds a secret: HF_TOKEN
_SECRET_OPTION = re.compile(rf"(?i)^--?{_SECRET_WORD}$")  # `--token VALUE`: the next word is the secret
# verl's own config keys that end so and name a dataset column or a flag, not a secret (verl v0.9.0
# verl/trainer/config/*.yaml: data.prompt_key, data.reward_fn_key, ..., actor_rollout_ref.rollout.*_token):
# masking them would hide the job's settings from its own plan.
NOT_SECRET = frozenset({"prompt_key", "response_key", "image_key", "video_key", "audio_key", "teacher_key",
                        "reward_fn_key", "tools_key", "reward_model_key", "messages_key", "enable_thinking_key",
                        "data_source_key", "continuous_token", "balance_dp_token"})


def secret_name(name: str) -> bool:
    """Whether `name` (an environment variable, a Hydra key `+a.b_key`, an option `--ray-auth-token`) holds a
    secret: it ends in a secret word (_SECRET_WORD), case-insensitive, and is none of verl's NOT_SECRET keys."""
    return _SECRET_NAME.fullmatch(name) is not None and name.rsplit(".", 1)[-1].lower() not in NOT_SECRET


def _mask_assignment(match: re.Match) -> str:
    return f"{match.group(1)}{MASK}" if secret_name(match.group(1)[:-1]) else match.group(0)


def redact(text: str) -> str:
    """`text` with every credential replaced by `***`: URL user:password@, token-like query parameters,
    NAME=VALUE assignments of secret names and bearer tokens. Idempotent; text without secrets is unchanged."""
    text = _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    text = _SECRET_QUERY.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _SECRET_ASSIGNMENT.sub(_mask_assignment, text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", text)


def redact_argv(argv) -> list[str]:
    """A command line with `redact` applied to every word, and the value after a secret option (`--token X`)
    masked."""
    out: list[str] = []
    for i, word in enumerate(argv):
        secret_value = i > 0 and _SECRET_OPTION.match(str(argv[i - 1])) is not None and not str(word).startswith("-")
        out.append(MASK if secret_value else redact(str(word)))
    return out


def redact_value(name: str, value: str) -> str:
    """`value` as `redact` shows it when it is assigned to `name` (an environment variable, a mapping's key): MASK
    for a secret name (HF_TOKEN, WANDB_API_KEY, ...), else the value redacted on its own. A mapping {"HF_TOKEN":
    "hf_x"} split the assignment in two, and neither half looked like a secret."""
    if secret_name(name):
        return MASK if value else value
    return redact(value)


def redact_doc(value):
    """A JSON value with `redact` applied to every string in it (record_property values may hold a URL), and a
    string under a secret key (`redact_value`) masked."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k:
                redact_value(k, v) if isinstance(k, str) and isinstance(v, str) else redact_doc(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact_doc(v) for v in value]
    return value


# Terminal control: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other ESC sequences (ECMA-48: ESC,
# intermediates 0x20-0x2F, a final 0x30-0x7E), the 8-bit CSI and OSC introducers, then any C0/C1 control character
# left but newline and tab. A job's log or a run directory's name can carry them (`\x1b]0;title\x07`, `\x1b[2J`,
# a cursor move that hides a FAILED line): printed raw, they
# rewrite the reader's terminal.
_TERMINAL_CONTROL = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                               r"|\x1b[ -/]*[0-~]?|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def for_terminal(text: str) -> str:
    """`text` as it may leave the process for a terminal or a shared log: `redact`ed, and with every terminal
    escape sequence and control character (but newline and tab) removed. Idempotent."""
    return _TERMINAL_CONTROL.sub("", redact(text.replace("\r\n", "\n")))


def one_line(text: str, limit: int = 200) -> str:
    """`text` as it may stand inside a one-line message: `for_terminal`, with newlines and tabs shown as `\\n` and
    `\\t` (a newline in an exported value printed fake verdict lines: issue 48), and cut after `limit` characters
    (a 100 kB item gave a 100 kB error line)."""
    text = for_terminal(text).replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
