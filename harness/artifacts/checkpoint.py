"""Checkpoint / resume checks (seed 001 "断点续训"): what blocks a save, what a resume loses.

- mbridge writes an HF safetensors shard only once every key that `model.safetensors.index.json` maps
  to that shard has come out of the weight generator (mbridge/core/safetensor_io.py, subset test on
  `filename_to_keys_map`). A key training never yields -- Moonlight-16B-A3B's index lists
  `self_attn.rotary_emb.inv_freq`, a buffer no trainer exports -- blocks that shard silently, every
  save. `check_keys_against_index` applies the same rule before a run; `check_saved_dir` compares
  what is on disk after a save with the index. Both name the blocked file and its missing keys.
- resume with optimizer CPU offload lost the optimizer state (`KeyError: 'master_param'`, verl PR
  #3850): `state_differences` compares optimizer (or model) state before save and after load, key by
  key, and names what is lost or changed.
- verl's FileLogger opens $VERL_FILE_LOGGER_PATH with "wb" (verl/utils/tracking.py), so a resumed job
  truncates the metrics of every step before the resume: `rotate_log_for_resume` keeps the segment,
  `missing_steps` finds the hole in an ingested Run.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BadInput
from harness.io import read_json
from harness.metrics.run import Run

INDEX_FILE = "model.safetensors.index.json"


# ---------------------------------------------------------------------------------------------------
# HF save vs model.safetensors.index.json


@dataclass(frozen=True)
class BlockedFile:
    """A shard of the index that cannot be (or was not) written, and the keys it waits for."""

    file: str
    missing: tuple[str, ...]


@dataclass(frozen=True)
class SaveCheck:
    """Saved (or produced) keys against an index: blocked shards, and keys the index does not know."""

    index: str
    files: int
    keys: int
    blocked: tuple[BlockedFile, ...]
    unindexed: tuple[str, ...]  # produced/saved but absent from the index: mbridge drops them silently

    @property
    def ok(self) -> bool:
        return not self.blocked and not self.unindexed

    def __str__(self) -> str:
        if self.ok:
            return f"{self.index}: all {self.files} files / {self.keys} keys saved"
        parts = []
        if self.blocked:
            missing = sum(len(b.missing) for b in self.blocked)
            worst = max(self.blocked, key=lambda b: len(b.missing))
            parts.append(f"{len(self.blocked)} of {self.files} files blocked by {missing} missing keys; "
                         + "; ".join(f"{b.file} misses {', '.join(b.missing[:3])}"
                                     + (f" (+{len(b.missing) - 3} more)" if len(b.missing) > 3 else "")
                                     for b in self.blocked[:3])
                         + f"; worst {worst.file} ({len(worst.missing)} keys)")
        if self.unindexed:
            parts.append(f"{len(self.unindexed)} keys not in the index, e.g. {', '.join(self.unindexed[:3])}")
        return f"{self.index}: " + " | ".join(parts)


def read_weight_map(index_path: str | os.PathLike) -> dict[str, str]:
    """`weight_map` (key -> shard file name) of a safetensors index; BadInput naming the file if unusable."""
    path = Path(index_path)
    doc = read_json(path, missing=f"no such index; point at the model directory's {INDEX_FILE}",
                    corrupt="the index is truncated or corrupt, copy it again")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise BadInput(f"{path}: no `weight_map` object; is this a safetensors index?")
    return {str(k): str(v) for k, v in weight_map.items()}


def _check(index: str, weight_map: Mapping[str, str], present: set[str]) -> SaveCheck:
    by_file: dict[str, list[str]] = {}
    for key, file in weight_map.items():
        by_file.setdefault(file, []).append(key)
    blocked = tuple(BlockedFile(file, tuple(sorted(k for k in keys if k not in present)))
                    for file, keys in sorted(by_file.items()) if any(k not in present for k in keys))
    return SaveCheck(index, len(by_file), len(weight_map), blocked, tuple(sorted(present - set(weight_map))))


def check_keys_against_index(index_path: str | os.PathLike, produced: Iterable[str]) -> SaveCheck:
    """mbridge's save rule before a run: each shard is written only if all its index keys are produced."""
    return _check(str(index_path), read_weight_map(index_path), set(produced))


def check_saved_dir(directory: str | os.PathLike) -> SaveCheck:
    """After a save: the keys really stored in the directory's shards against its index."""
    from safetensors import safe_open

    directory = Path(directory)
    index = directory / INDEX_FILE
    weight_map = read_weight_map(index)
    present: set[str] = set()
    for file in sorted(set(weight_map.values())):
        shard = directory / file
        if not shard.is_file():
            continue  # a blocked shard is simply never written: its keys count as missing
        try:
            with safe_open(str(shard), framework="pt") as f:
                stored = set(f.keys())
        except Exception as exc:
            raise BadInput(f"{shard}: unreadable safetensors file ({type(exc).__name__}: {exc}); "
                           "the save was interrupted, save again") from None
        # a key stored in another shard than the index says is as good as missing for from_pretrained
        present |= {k for k in stored if weight_map.get(k) == file}
        present |= {k for k in stored if k not in weight_map}
    return _check(str(index), weight_map, present)


# ---------------------------------------------------------------------------------------------------
# optimizer / model state round trip


@dataclass(frozen=True)
class StateDifference:
    """One leaf of a state dict that a save/load round trip lost or changed."""

    path: str  # e.g. "state/model.layers.0.mlp.up_proj.weight/exp_avg"
    problem: str  # "lost", "added", "changed", "shape"
    count: int = 0  # elements that differ ("changed")
    worst: float = 0.0  # largest absolute difference ("changed")

    def __str__(self) -> str:
        if self.problem == "changed":
            return f"{self.path}: {self.count} elements differ, worst |diff| {self.worst:g}"
        return f"{self.path}: {self.problem}"


def _leaves(obj, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, Mapping):
        out: dict[str, object] = {}
        for key, value in obj.items():
            out.update(_leaves(value, f"{prefix}{key}/"))
        return out
    if isinstance(obj, (list, tuple)) and not all(isinstance(x, (int, float, str, bool)) or x is None for x in obj):
        out = {}
        for i, value in enumerate(obj):
            out.update(_leaves(value, f"{prefix}{i}/"))
        return out
    return {prefix.rstrip("/"): obj}


def state_differences(expected: Mapping, actual: Mapping, *, atol: float = 0.0) -> tuple[StateDifference, ...]:
    """Compare two (nested) state dicts leaf by leaf: tensors exactly (or within `atol`), other values by ==.

    Use on `optimizer.state_dict()` (or torch.distributed.checkpoint's FQN-keyed optimizer state) before
    save and after load: a resume that drops the state (verl PR #3850's class of bug) shows as `lost`
    leaves; Adam silently restarting from zero moments is otherwise invisible until the curve drifts.
    """
    import torch

    a, b = _leaves(expected), _leaves(actual)
    out = [StateDifference(p, "lost") for p in sorted(set(a) - set(b))]
    out += [StateDifference(p, "added") for p in sorted(set(b) - set(a))]
    for path in sorted(set(a) & set(b)):
        x, y = a[path], b[path]
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            x_t, y_t = torch.as_tensor(x), torch.as_tensor(y)
            if x_t.shape != y_t.shape:
                out.append(StateDifference(path, "shape"))
                continue
            diff = (x_t.detach().double().cpu() - y_t.detach().double().cpu()).abs()
            bad = diff > atol
            if x_t.is_floating_point():
                bad &= ~(torch.isnan(x_t.cpu()) & torch.isnan(y_t.cpu()))
            if int(bad.sum()):
                out.append(StateDifference(path, "changed", int(bad.sum()), float(diff[bad].max())))
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            out.append(StateDifference(path, "changed", 1, float("nan")))
    return tuple(out)


def describe_differences(diffs: tuple[StateDifference, ...], what: str) -> str:
    """One failure message: counts by problem, the worst changed leaf, the first few paths."""
    if not diffs:
        return f"{what}: identical"
    counts = {}
    for d in diffs:
        counts[d.problem] = counts.get(d.problem, 0) + 1
    changed = [d for d in diffs if d.problem == "changed"]
    worst = f"; worst {max(changed, key=lambda d: d.worst)}" if changed else ""
    return (f"{what}: {len(diffs)} leaves differ ({', '.join(f'{n} {p}' for p, n in counts.items())}){worst}; "
            + "; ".join(map(str, diffs[:4])))


# ---------------------------------------------------------------------------------------------------
# FileLogger truncation on resume


def rotate_log_for_resume(path: str | os.PathLike) -> Path | None:
    """Move the FileLogger jsonl aside before a resumed job reopens (and truncates) it: `metrics.jsonl`
    becomes `metrics.seg0.jsonl`, `metrics.seg1.jsonl`, ... Returns the segment, or None if no log yet.
    harness.metrics.ingest.load_run(run_dir) merges the segments (the later one wins on repeated steps)."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    n = 0
    while (segment := path.with_name(f"{path.stem}.seg{n}{path.suffix}")).exists():
        n += 1
    os.replace(path, segment)
    return segment


@dataclass(frozen=True)
class StepGap:
    """Steps a run should have logged but did not: first..last inclusive."""

    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.first}" if self.first == self.last else f"{self.first}..{self.last}"


def missing_steps(run: Run, *, first: int = 1, last: int | None = None) -> tuple[StepGap, ...]:
    """Holes in the run's step range [first, last or its last step]. A hole that starts at `first` is the
    signature of a resume that truncated the FileLogger jsonl (the steps before the resume are gone)."""
    steps = set(run.steps)
    if not steps:
        return (StepGap(first, last if last is not None else first),)
    end = max(steps) if last is None else last
    gaps: list[StepGap] = []
    start = None
    for step in range(first, end + 1):
        if step not in steps and start is None:
            start = step
        if step in steps and start is not None:
            gaps.append(StepGap(start, step - 1))
            start = None
    if start is not None:
        gaps.append(StepGap(start, end))
    return tuple(gaps)


def describe_gaps(run: Run, gaps: tuple[StepGap, ...]) -> str:
    """Failure message naming the missing steps and, for a hole at the start, the FileLogger truncation."""
    total = sum(g.last - g.first + 1 for g in gaps)
    sources = ", ".join(run.meta.sources) or run.name
    text = f"run {run.name}: {total} steps missing ({', '.join(map(str, gaps))}) in {sources}"
    if gaps and run.steps and gaps[0].last < min(run.steps):
        text += (f"; the log starts at step {min(run.steps)}: verl's FileLogger reopened it with 'wb' on resume "
                 "and truncated the earlier steps -- rotate the log before resuming (rotate_log_for_resume)")
    return text
