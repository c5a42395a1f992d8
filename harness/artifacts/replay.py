"""Rollout replay (seed 003): dump the rollouts of one platform (the GPU baseline) and replay them on
another (the NPU) so that a reward / pg_loss / grad_norm difference is isolated to the training side.

The on-disk layout is verl's RolloutSkip layout (verl 0.9.1, `verl/utils/skip/rollout_skip.py`), so a
dump written by verl's PPO trainer is replayed by the harness and vice versa:

    {dump_dir}/{experiment_name}_{project_name}/GBS{gbs}_N{n}_in{max_prompt}_out{max_response}/{step}/
        gen_batch.dp    the generate_sequences output, a pickled verl DataProto (DataProto.save_to_disk)
        meta.json       {"global_steps": step}

What the installed verl 0.9.1 does, checked against its source (and where it differs from seed 003):
- config group `skip.rollout` (`verl.utils.skip.config.RolloutSkipConfig`): enable, dump_dir, steps,
  action. `steps` is an explicit list: a step not listed is generated normally and NOT dumped (the
  seed does not say this). `action` accepts only cache | repeat (`random` / `empty` exist in
  `SkipAction` but the config rejects them).
- GBS is `data.gen_batch_size` when set, else `data.train_batch_size`.
- `repeat` loads the exact step if dumped, else the latest earlier step, else the earliest later one.
- validation batches (meta_info["validate"]) bypass the skip.
- `skip.rollout` is honoured only by the V0 trainer: `RayPPOTrainer.fit` (verl/trainer/ppo/ray_trainer.py)
  calls `SkipManager.init` / `set_step` and the decorator sits on `AgentLoopManager.generate_sequences`
  (verl/experimental/agent_loop/agent_loop.py). The V1 trainer (`trainer.use_v1=true`, the 0.9.1 default
  and what harness.config.recipe's recipe runs) honours only `skip.rollout_tq` (RolloutTqSkip), whose files are
  `{step}/{inner}/tq_batch.pt` (a torch-saved TensorDict + TransferQueue keys/tags) -- not seed 003's
  gen_batch.dp, and not readable on a V0 run.

Why the harness has its own replay: verl's DAPO trainer (`RayDAPOTrainer.fit` in verl-project/verl-recipe
`dapo/dapo_ray_trainer.py`, e.g. commit dd811fe4) overrides `fit` without calling `SkipManager.init` /
`SkipManager.set_step`, so `skip.rollout.*` is silently ignored for DAPO (the decorator sees no skip
instance); the recipe instead imports the pre-0.9 `verl.utils.rollout_skip` module, which verl 0.9.1 no
longer ships. With the V1 path the dump is TransferQueue-specific (above). `RolloutReplay` gives DAPO runs
(and the tiny lab) the same dump/replay semantics and
the same files, using verl's own `DataProto` save/load.

Security: `gen_batch.dp` is a pickle (verl's `DataProto.save_to_disk`), and unpickling runs code, so
whoever can write into a shared dump directory could run code in every job that replays from it. Therefore:
- the harness's own dumps also write a non-pickle copy, `gen_batch.safetensors` (the tensors) plus
  `gen_batch.json` (non-tensor fields and meta_info, when they are JSON data), and the harness replays from that
  copy: no unpickling at all. verl's own RolloutSkip still finds the `gen_batch.dp` it expects (compatibility);
- a pickle is loaded only for dumps without the safe copy (verl's own dumps), and only from a dump directory that is
  owned by this user and writable by nobody else, down to the file (`check_private`): the trade-off is that a
  dump shared with a group must be copied into a private directory before it is replayed.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.errors import BadInput
from harness.io import atomic_target, read_json, write_atomic, write_json_atomic

GEN_BATCH_FILE = "gen_batch.dp"  # RolloutSkip.gen_batch_name
SAFE_TENSORS_FILE = "gen_batch.safetensors"  # the harness's non-pickle copy: tensors
SAFE_FIELDS_FILE = "gen_batch.json"  # ... and the non-tensor fields and meta_info
STEP_META_FILE = "meta.json"  # RolloutSkip.meta_name
ACTIONS = ("cache", "repeat")  # what verl 0.9.1's RolloutSkipConfig accepts


@dataclass(frozen=True)
class ReplayKey:
    """What names a dump directory: verl's experiment/project names and the batch shape."""

    experiment: str
    project: str
    gbs: int
    n: int
    max_prompt_length: int
    max_response_length: int

    @property
    def relative_dir(self) -> str:
        return (f"{self.experiment}_{self.project}/"
                f"GBS{self.gbs}_N{self.n}_in{self.max_prompt_length}_out{self.max_response_length}")

    @classmethod
    def from_verl_config(cls, config) -> ReplayKey:
        """The key verl's RolloutSkip derives from a trainer config (an OmegaConf DictConfig)."""
        from omegaconf import OmegaConf

        gbs = OmegaConf.select(config, "data.gen_batch_size")
        if gbs is None:
            gbs = OmegaConf.select(config, "data.train_batch_size", default=0)
        return cls(experiment=OmegaConf.select(config, "trainer.experiment_name", default="default_experiment_name"),
                   project=OmegaConf.select(config, "trainer.project_name", default="default_project_name"),
                   gbs=int(gbs), n=int(OmegaConf.select(config, "actor_rollout_ref.rollout.n", default=0)),
                   max_prompt_length=int(OmegaConf.select(config, "data.max_prompt_length", default=0)),
                   max_response_length=int(OmegaConf.select(config, "data.max_response_length", default=0)))

    @classmethod
    def for_scale(cls, scale, experiment: str, project: str) -> ReplayKey:
        """The key of a harness Scale's DAPO batch (harness.config.scales.DapoBatch)."""
        b = scale.batch
        return cls(experiment, project, b.gbs, b.n, b.max_prompt_length, b.max_response_length)


def verl_skip_overrides(dump_dir: str | os.PathLike, steps: list[int] | tuple[int, ...], action: str = "cache",
                        *, group: str = "rollout") -> list[str]:
    """Hydra overrides that turn on verl's own skip for `steps`.

    group `rollout`: RolloutSkip, this module's gen_batch.dp layout, honoured by the V0 trainer
    (`trainer.use_v1=false`). group `rollout_tq`: RolloutTqSkip of the V1 trainer (verl 0.9.1's
    default, the one harness.config.recipe's recipe runs), which writes `{step}/{inner}/tq_batch.pt` instead.
    """
    if action not in ACTIONS:
        raise BadInput(f"replay action {action!r}: use one of {', '.join(ACTIONS)} (verl 0.9.1 RolloutSkipConfig)")
    if group not in ("rollout", "rollout_tq"):
        raise BadInput(f"skip group {group!r}: use rollout (V0 trainer) or rollout_tq (V1 trainer)")
    return [f"skip.{group}.enable=True", f"skip.{group}.dump_dir={Path(dump_dir)}",
            f"skip.{group}.steps=[{','.join(str(int(s)) for s in steps)}]", f"skip.{group}.action={action}"]


class RolloutReplay:
    """Dump and replay `generate_sequences` outputs in verl's RolloutSkip layout.

    `generate(step, produce)` is the whole protocol: replay the dump of `step` when there is one
    (`repeat`: the nearest dumped step, as verl does), else call `produce()` and dump its result.
    """

    def __init__(self, dump_dir: str | os.PathLike, key: ReplayKey, action: str = "cache"):
        if action not in ACTIONS:
            raise BadInput(f"replay action {action!r}: use one of {', '.join(ACTIONS)} (verl 0.9.1 RolloutSkipConfig)")
        self.dump_dir = Path(dump_dir).expanduser().resolve()
        self.root = self.dump_dir / key.relative_dir
        self.key = key
        self.action = action

    def step_dir(self, step: int) -> Path:
        return self.root / str(int(step))

    def _complete(self, step: int) -> bool:
        d = self.step_dir(step)
        return (d / GEN_BATCH_FILE).is_file() and (d / STEP_META_FILE).is_file()

    def available_steps(self) -> list[int]:
        """Steps with both files present (a half-written step is not replayable), ascending."""
        if not self.root.is_dir():
            return []
        return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit() and self._complete(int(p.name)))

    def resolve(self, step: int) -> int | None:
        """The dumped step that replays `step`, or None (then the step is generated and dumped)."""
        if self._complete(step):
            return step
        if self.action == "cache":
            return None
        available = self.available_steps()
        earlier = [s for s in available if s < step]
        later = [s for s in available if s > step]
        return earlier[-1] if earlier else (later[0] if later else None)

    def dump(self, step: int, batch) -> Path:
        """Write `batch` (a verl DataProto) and meta.json for `step`; both files appear atomically."""
        d = self.step_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        with atomic_target(d / GEN_BATCH_FILE) as tmp:
            batch.save_to_disk(str(tmp))
        _dump_safe(d, batch)
        # meta.json last: verl treats a step as dumped only when both files exist
        write_json_atomic(d / STEP_META_FILE, {"global_steps": int(step)})
        return d

    def load(self, step: int):
        """The DataProto dumped for the step that replays `step`; BadInput naming the directory if none."""
        from verl import DataProto

        found = self.resolve(step)
        if found is None:
            have = self.available_steps()
            raise BadInput(f"{self.root}: no rollout dump for step {step} (action {self.action}; dumped steps "
                           f"{have or 'none'}); dump it first on the baseline platform with the same "
                           f"experiment/project names and batch shape")
        meta_path = self.step_dir(found) / STEP_META_FILE
        # read_json: a regular file, bounded, one-line errors (a FIFO planted as meta.json would block the read)
        meta = read_json(meta_path, missing="the rollout dump meta vanished; dump the step again",
                         corrupt="unreadable rollout dump meta; delete the step directory and dump again")
        if not isinstance(meta, dict) or str(meta.get("global_steps")) != str(found):
            said = meta.get("global_steps") if isinstance(meta, dict) else f"(no object: {str(meta)[:20]})"
            raise BadInput(f"{meta_path}: says global_steps={said} but lies in step directory "
                           f"{found}; the dump was moved or mixed up, dump it again")
        step_dir = self.step_dir(found)
        safe = _load_safe(step_dir)
        if safe is not None:
            return safe
        # verl's own dump: a pickle, loaded only from a private directory (module docstring)
        check_private(self.dump_dir, step_dir / GEN_BATCH_FILE)
        return DataProto.load_from_disk(step_dir / GEN_BATCH_FILE)

    def generate(self, step: int, produce: Callable[[], object]):
        """Replay `step` when dumped, else `produce()` it and dump it (verl's SkipManager protocol)."""
        if self.resolve(step) is not None:
            return self.load(step)
        batch = produce()
        self.dump(step, batch)
        return batch


def check_private(top: Path, target: Path) -> None:
    """BadInput unless `top` and every directory below it down to `target` (a file), and `target` itself, are
    owned by this user and not writable by group or others, and none is a symlink: who else can write there
    could replace a pickle (the same rule ssh applies to ~/.ssh)."""
    uid = os.geteuid()
    top = Path(top)
    try:
        chain = [top, *reversed(Path(target).relative_to(top).parents[:-1])]
    except ValueError:
        raise BadInput(f"{target}: not inside the dump directory {top}") from None
    paths = [top] + [top / p for p in chain[1:]] + [Path(target)]
    for path in paths:
        try:
            st = path.lstat()
        except OSError as exc:
            raise BadInput(f"{path}: cannot check the rollout dump ({exc.strerror})") from None
        problem = ("is a symlink" if os.path.islink(path) else
                   f"is owned by uid {st.st_uid}, not you (uid {uid})" if st.st_uid != uid else
                   "is writable by group or others" if st.st_mode & 0o022 else None)
        if problem:
            raise BadInput(f"{path} {problem}: rollout dumps are pickles (verl DataProto) and unpickling runs code, "
                           "so the harness loads them only from a directory only you can write; copy the dump into "
                           "one (chmod go-w) or dump it again with the harness (it writes a non-pickle copy)")


def _dump_safe(step_dir: Path, batch) -> None:
    """The non-pickle copy of `batch`: safetensors for the tensors, JSON for the rest. Skipped (with the pickle
    alone left, loaded only from a private directory) when a non-tensor field is not JSON data."""
    import numpy as np
    from safetensors.torch import save_file


    fields = {}
    for key, value in batch.non_tensor_batch.items():
        if not isinstance(value, np.ndarray) or value.ndim != 1:
            return
        fields[key] = {"dtype": str(value.dtype) if value.dtype != object else "object", "values": value.tolist()}
    try:
        text = json.dumps({"non_tensor_batch": fields, "meta_info": batch.meta_info}, allow_nan=True)
    except (TypeError, ValueError):
        return
    tensors = {} if batch.batch is None else {k: v.detach().cpu().contiguous() for k, v in batch.batch.items()}
    with atomic_target(step_dir / SAFE_TENSORS_FILE) as tmp:
        save_file(tensors, str(tmp))
    write_atomic(step_dir / SAFE_FIELDS_FILE, text)


def _load_safe(step_dir: Path):
    """The DataProto from the non-pickle copy, or None when the step has none."""
    tensors_path, fields_path = step_dir / SAFE_TENSORS_FILE, step_dir / SAFE_FIELDS_FILE
    if not (tensors_path.is_file() and fields_path.is_file()):
        return None
    import numpy as np
    from safetensors.torch import load_file
    from verl import DataProto

    try:
        doc = json.loads(fields_path.read_text())
        tensors = load_file(str(tensors_path))
        # object fields element by element: np.array would turn equal-length lists into a 2-D array
        non_tensors = {k: _object_array(v["values"]) if v["dtype"] == "object" else np.array(v["values"], v["dtype"])
                       for k, v in doc["non_tensor_batch"].items()}
        return DataProto.from_dict(tensors=tensors or None, non_tensors=non_tensors, meta_info=doc["meta_info"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{step_dir}: unreadable rollout dump ({type(exc).__name__}: {exc}); delete the step "
                       "directory and dump again") from None


def _object_array(values: list):
    import numpy as np

    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


@dataclass(frozen=True)
class BatchDifference:
    """One field where a replayed batch differs from the dumped one."""

    field: str
    count: int  # elements that differ (or -1 when the field is missing / has another shape)
    worst: float  # largest absolute difference (nan when not comparable)
    where: str  # first differing index, or what is wrong

    def __str__(self) -> str:
        if self.count < 0:
            return f"{self.field}: {self.where}"
        return f"{self.field}: {self.count} elements differ, worst |diff| {self.worst:g} at {self.where}"


def batch_differences(expected, actual) -> tuple[BatchDifference, ...]:
    """Compare two verl DataProto batches field by field, exactly: a replay must hand training the very
    tokens the baseline generated (seed 003), so any difference is a finding."""
    import numpy as np
    import torch

    out: list[BatchDifference] = []

    def compare(name: str, a, b) -> None:
        if b is None:
            out.append(BatchDifference(name, -1, float("nan"), "missing from the replayed batch"))
            return
        a_t = torch.as_tensor(a) if not isinstance(a, np.ndarray) or a.dtype != object else None
        if a_t is None:  # object arrays (uids, raw prompts): element-wise equality
            b = np.asarray(b, dtype=object)
            if a.shape != b.shape:
                out.append(BatchDifference(name, -1, float("nan"), f"shape {tuple(b.shape)} != {tuple(a.shape)}"))
                return
            bad = [i for i, (x, y) in enumerate(zip(a.ravel(), b.ravel(), strict=True)) if not _same_object(x, y)]
            if bad:
                out.append(BatchDifference(name, len(bad), float("nan"), f"index {bad[0]}"))
            return
        b_t = torch.as_tensor(b)
        if a_t.shape != b_t.shape or a_t.dtype != b_t.dtype:
            out.append(BatchDifference(name, -1, float("nan"),
                                       f"{b_t.dtype}{list(b_t.shape)} != {a_t.dtype}{list(a_t.shape)}"))
            return
        neq = a_t != b_t
        if a_t.is_floating_point():
            neq &= ~(torch.isnan(a_t) & torch.isnan(b_t))
        count = int(neq.sum())
        if count:
            diff = (a_t.double() - b_t.double()).abs().masked_fill(~neq, 0)
            worst_flat = int(diff.argmax())
            where = tuple(int(i) for i in np.unravel_index(worst_flat, tuple(a_t.shape)))
            out.append(BatchDifference(name, count, float(diff.flatten()[worst_flat]), f"index {where}"))

    a_batch = {} if expected.batch is None else dict(expected.batch.items())
    b_batch = {} if actual.batch is None else dict(actual.batch.items())
    for key in sorted(a_batch):
        compare(f"batch[{key}]", a_batch[key], b_batch.get(key))
    for key in sorted(expected.non_tensor_batch):
        compare(f"non_tensor_batch[{key}]", expected.non_tensor_batch[key], actual.non_tensor_batch.get(key))
    for key in sorted(set(b_batch) - set(a_batch)):
        out.append(BatchDifference(f"batch[{key}]", -1, float("nan"), "not in the dumped batch"))
    return tuple(out)


def _same_object(x, y) -> bool:
    import numpy as np

    try:
        same = x == y
        return bool(np.all(same)) if not isinstance(same, bool) else same
    except Exception:
        return repr(x) == repr(y)
