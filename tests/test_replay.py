"""Self-tests of the rollout replay checker (harness.artifacts.replay): it fails on replays that reproduce
real ways a seed-003 "打桩" run goes wrong, and passes on the correct replay."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from harness.artifacts.replay import ReplayKey, RolloutReplay, batch_differences, verl_skip_overrides
from harness.errors import BadInput

KEY = ReplayKey("exp", "proj", gbs=2, n=2, max_prompt_length=4, max_response_length=3)


def _batch(seed: int):
    from verl import DataProto

    g = torch.Generator().manual_seed(seed)
    return DataProto.from_dict({"responses": torch.randint(0, 1000, (4, 3), generator=g),
                                "old_log_probs": torch.randn(4, 3, generator=g)},
                               non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)})


class ResamplingReplay(RolloutReplay):
    """Seeded bug: the replay path is wired but never taken (what verl's DAPO trainer does with
    skip.rollout.*: SkipManager is never initialised), so the NPU run samples its own rollouts."""

    def generate(self, step, produce):
        return produce()


def test_correct_replay_passes(tmp_path):
    replay = RolloutReplay(tmp_path, KEY)
    dumped = replay.generate(1, lambda: _batch(1))
    assert replay.available_steps() == [1]
    assert batch_differences(dumped, replay.generate(1, lambda: _batch(2))) == ()


def test_resampling_replay_is_caught(tmp_path):
    dumped = RolloutReplay(tmp_path, KEY).generate(1, lambda: _batch(1))
    diffs = batch_differences(dumped, ResamplingReplay(tmp_path, KEY).generate(1, lambda: _batch(2)))
    fields = {d.field for d in diffs}
    assert {"batch[responses]", "batch[old_log_probs]"} <= fields
    text = "; ".join(map(str, diffs))
    assert "elements differ, worst |diff|" in text and "at index (" in text


def test_dump_without_non_tensors_is_caught(tmp_path):
    from verl import DataProto

    full = _batch(1)
    stripped = DataProto(batch=full.batch, non_tensor_batch={}, meta_info={})  # seeded: uids lost in the dump
    replay = RolloutReplay(tmp_path, KEY)
    replay.dump(1, stripped)
    diffs = batch_differences(full, replay.load(1))
    assert [str(d) for d in diffs] == ["non_tensor_batch[uid]: missing from the replayed batch"]


def test_changed_dtype_is_caught():
    a = _batch(1)
    b = _batch(1)
    b.batch["old_log_probs"] = b.batch["old_log_probs"].to(torch.bfloat16)
    (diff,) = batch_differences(a, b)
    assert diff.field == "batch[old_log_probs]" and "torch.bfloat16" in diff.where


def test_missing_dump_is_one_line_naming_the_directory(tmp_path):
    with pytest.raises(BadInput) as exc:
        RolloutReplay(tmp_path, KEY).load(3)
    assert "exp_proj/GBS2_N2_in4_out3" in str(exc.value) and "step 3" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_meta_of_another_step_is_refused(tmp_path):
    replay = RolloutReplay(tmp_path, KEY)
    replay.dump(2, _batch(2))
    (replay.step_dir(2) / "meta.json").write_text(json.dumps({"global_steps": 5}))
    with pytest.raises(BadInput, match="global_steps=5"):
        replay.load(2)


def test_half_written_step_is_not_replayed(tmp_path):
    replay = RolloutReplay(tmp_path, KEY)
    replay.dump(1, _batch(1))
    (replay.step_dir(1) / "meta.json").unlink()  # crashed between the two files
    assert replay.available_steps() == [] and replay.resolve(1) is None


def test_bad_action_and_group_are_bad_input(tmp_path):
    with pytest.raises(BadInput, match="random"):
        RolloutReplay(tmp_path, KEY, action="random")
    with pytest.raises(BadInput, match="rollout_tq"):
        verl_skip_overrides(tmp_path, [1], group="async")
    assert verl_skip_overrides(tmp_path, [1, 2], "repeat")[2] == "skip.rollout.steps=[1,2]"


# ---- security: no unpickling from places others can write -------------------------------------------------

class _Boom:
    """Unpickling this writes a marker file: a stand-in for the code an attacker's pickle would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant_pickle(step_dir, marker):
    import pickle

    (step_dir / "gen_batch.dp").write_bytes(pickle.dumps(_Boom(marker)))


def test_harness_dump_replays_without_unpickling(tmp_path):
    """The harness's own dump carries a non-pickle copy; replay reads it and never touches gen_batch.dp, so a
    pickle planted there by someone else runs nothing."""
    replay = RolloutReplay(tmp_path, KEY)
    dumped = replay.generate(1, lambda: _batch(1))
    step_dir = replay.step_dir(1)
    assert {p.name for p in step_dir.iterdir()} >= {"gen_batch.dp", "gen_batch.safetensors", "gen_batch.json",
                                                   "meta.json"}
    marker = tmp_path / "pwned"
    _plant_pickle(step_dir, marker)
    assert batch_differences(dumped, replay.load(1)) == ()
    assert not marker.exists(), "the replay unpickled gen_batch.dp"


def _verl_only_dump(tmp_path, marker):
    """A dump as verl's RolloutSkip writes it: gen_batch.dp (a pickle) and meta.json only."""
    replay = RolloutReplay(tmp_path, KEY)
    replay.dump(1, _batch(1))
    step_dir = replay.step_dir(1)
    for name in ("gen_batch.safetensors", "gen_batch.json"):
        (step_dir / name).unlink()
    _plant_pickle(step_dir, marker)
    return replay, step_dir


def test_verl_pickle_from_a_group_writable_dir_is_refused(tmp_path):
    marker = tmp_path.parent / f"{tmp_path.name}-pwned"
    replay, step_dir = _verl_only_dump(tmp_path / "dumps", marker)
    step_dir.parent.chmod(0o777)  # a shared directory: anyone may replace the pickle
    with pytest.raises(BadInput, match=r"is writable by group or others: rollout dumps are pickles") as err:
        replay.load(1)
    assert "\n" not in str(err.value)
    assert not marker.exists()


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="chown to another user needs root")
def test_verl_pickle_owned_by_someone_else_is_refused(tmp_path):
    import os

    marker = tmp_path.parent / f"{tmp_path.name}-pwned2"
    replay, step_dir = _verl_only_dump(tmp_path / "dumps", marker)
    os.chown(step_dir / "gen_batch.dp", 65534, 65534)
    with pytest.raises(BadInput, match="is owned by uid 65534, not you"):
        replay.load(1)
    assert not marker.exists()


def test_verl_pickle_from_a_private_dir_is_loaded(tmp_path):
    """verl's own dumps stay replayable (RolloutSkip compatibility) from a directory only this user writes."""
    replay = RolloutReplay(tmp_path, KEY)
    dumped = replay.dump(1, _batch(1)) and _batch(1)
    for name in ("gen_batch.safetensors", "gen_batch.json"):
        (replay.step_dir(1) / name).unlink()
    assert batch_differences(dumped, replay.load(1)) == ()
