"""The one numeric policy for every number the harness reads -- JSON documents, logs and the command line.

Why one: the arithmetic downstream has limits the input does not. `range`/`len`/array sizes take a C ssize_t (a
golden with `end_step` 10**300 raised OverflowError), `float()` of a 400-digit JSON integer overflows, sums and
squares of values near 1e308 overflow in `statistics.fmean` / the band's variance, a subnormal step time turns
tokens per second into `inf` (which then passed `--target 100` and printed `Infinity`, not JSON), and `sleep` /
`wait` refuse timeouts beyond a C double of milliseconds. Every reader bounds what it takes with these functions,
each refusal one BadInput line naming the value's place (`what`).

- integers: whole numbers (never bool, never a float) in [low, high]; steps below MAX_STEP (int64 arrays with
  headroom), counts and sizes below MAX_COUNT;
- metric values: finite and within +-METRIC_LIMIT, which no logged metric reaches (fp32/bf16 tensors top out at
  3.4e38; token counts at 1e15), so squares (1e200) and sums of 10**8 of them stay finite;
- durations: [MIN_SECONDS, MAX_SECONDS] -- 0 and subnormal step times are no measurement;
- output: `json_text` prints non-finite floats as null (what orjson, verl's FileLogger writer, does).
"""
from __future__ import annotations

import json
import math

from harness.errors import BadInput

MAX_STEP = 2**62  # training steps live in int64 arrays (harness.metrics.ingest)
MAX_COUNT = 2**31 - 1  # devices, sequences, workers, rounds, CPUs: far beyond any cluster
MAX_SEED = 2**32 - 1  # numpy's legacy seeding and msprobe's seed_all take 32-bit seeds
METRIC_LIMIT = 1e100  # |value| of any metric; see the module docstring
MIN_SECONDS = 1e-9  # a step or a timeout shorter than a nanosecond is no measurement
MAX_SECONDS = 1e9  # ~31 years: beyond it a duration is a corrupt field, and sleeps/timeouts overflow


def _where(what: str, value) -> str:
    text = repr(value)
    return f"{what} {text[:40]}{'...' if len(text) > 40 else ''}"


def integer(value, what: str, *, low: int = 0, high: int = MAX_COUNT) -> int:
    """`value` if it is a whole number (a JSON integer, never true/false or 2.0) in [low, high]."""
    if type(value) is not int or not low <= value <= high:
        raise BadInput(f"{_where(what, value)}: must be a whole number in [{low}, {high}]")
    return value


def real(value, what: str, *, low: float = -METRIC_LIMIT, high: float = METRIC_LIMIT, low_open: bool = False,
         high_open: bool = False) -> float:
    """`value` as a float if it is a finite number (int or float, not bool) within the bounds."""
    if type(value) not in (int, float) or not is_real(value):
        raise BadInput(f"{_where(what, value)}: must be a finite number")
    number = float(value)
    if (number <= low if low_open else number < low) or (number >= high if high_open else number > high):
        raise BadInput(f"{_where(what, value)}: must be in {'(' if low_open else '['}{low:g}, {high:g}"
                       f"{')' if high_open else ']'}")
    return number


def seconds(value, what: str, *, low: float = MIN_SECONDS, high: float = MAX_SECONDS) -> float:
    """A duration in seconds: finite, in [low, high] (0 and subnormal values refused)."""
    return real(value, what, low=low, high=high)


def is_real(value) -> bool:
    """A number a float holds (10**400 does not), neither NaN nor infinite; not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def is_metric_value(value) -> bool:
    """A value some metric can take: real and within +-METRIC_LIMIT."""
    return is_real(value) and abs(float(value)) <= METRIC_LIMIT


def json_safe(obj):
    """`obj` with every non-finite float replaced by None (JSON null), recursively through dicts/lists/tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_text(obj, *, indent: int | None = 2) -> str:
    """JSON for people and tools to read: never `Infinity` or `NaN` (not JSON; jq and browsers refuse them)."""
    return json.dumps(json_safe(obj), indent=indent, allow_nan=False)
