"""Rollout replay (seed 003): rollouts dumped on one platform replay bit-exactly on another, in verl's
own RolloutSkip layout, so that a training-side difference (log_prob, advantage, update) is isolated.

Both directions run against verl's real code: a dump written by verl's SkipManager/RolloutSkip is
replayed by the harness, and a harness dump is replayed by verl's decorator without generating.
The rollouts are real samples of the tiny DeepSeek-V3 (transformers, random init).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.artifacts.replay import ReplayKey, RolloutReplay, batch_differences, verl_skip_overrides

pytestmark = [pytest.mark.tiny, pytest.mark.cpu]

PROMPTS, PROMPT_LEN = 2, 4


def _rollout(model, scale, seed: int):
    """One sampled rollout of the tiny model, shaped like verl's generate_sequences output."""
    from verl import DataProto

    n, new = scale.batch.n, 4
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, model.config.vocab_size, (PROMPTS, PROMPT_LEN), generator=g).repeat_interleave(n, 0)
    torch.manual_seed(seed)
    with torch.no_grad():
        seq = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                             max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    mask = torch.ones_like(seq)
    uids = np.repeat(np.array([f"prompt-{seed}-{i}" for i in range(PROMPTS)], dtype=object), n)
    return DataProto.from_dict(
        {"prompts": prompts, "responses": seq[:, PROMPT_LEN:], "input_ids": seq, "attention_mask": mask,
         "position_ids": torch.cumsum(mask, -1) - 1},
        non_tensors={"uid": uids}, meta_info={"global_token_num": mask.sum(-1).tolist()})


@pytest.fixture
def verl_skip(tmp_path, tiny_dapo_verl_config_factory):
    """verl's SkipManager initialised from the tiny DAPO recipe's real config with skip.rollout on, and
    a generate_sequences decorated exactly as verl's AgentLoopManager's is."""
    from verl.utils.skip import SkipManager

    config = tiny_dapo_verl_config_factory(verl_skip_overrides(tmp_path, [1, 2, 3], "cache", group="rollout"))
    SkipManager.init(config)

    class Rollout:
        calls = 0

        def __init__(self, produce):
            self.produce = produce

        @SkipManager.annotate(role="rollout")
        def generate_sequences(self, prompts):
            Rollout.calls += 1
            return self.produce()

    yield config, Rollout, SkipManager
    SkipManager.skip_instances = {}


def test_verl_dump_replays_in_harness(verl_skip, tmp_path, tiny_dsv3_factory, scale, record_property):
    config, Rollout, manager = verl_skip
    model = tiny_dsv3_factory(0)
    baseline = _rollout(model, scale, seed=1)
    manager.set_step(1)
    Rollout(lambda: baseline).generate_sequences(baseline)  # verl generates and dumps step 1

    key = ReplayKey.from_verl_config(config)
    assert key == ReplayKey.for_scale(scale, "dapo-tiny", "ascend-rl-harness"), "the recipe's names/batch changed"
    verl_dir = manager.skip_instances["rollout"]._get_step_dump_dir(1)
    replay = RolloutReplay(tmp_path, key)
    assert replay.step_dir(1) == verl_dir, f"harness layout {replay.step_dir(1)} != verl's {verl_dir}"
    assert sorted(p.name for p in verl_dir.iterdir()) == ["gen_batch.dp", "meta.json"]

    replayed = replay.generate(1, produce=lambda: pytest.fail("replay generated instead of loading step 1"))
    diffs = batch_differences(baseline, replayed)
    assert not diffs, f"{len(diffs)} fields differ after replay: " + "; ".join(map(str, diffs))
    record_property("replay.verl_to_harness", {"step": 1, "sequences": len(replayed),
                                               "fields": len(baseline.batch.keys())})


def test_harness_dump_replays_in_verl(verl_skip, tmp_path, tiny_dsv3_factory, scale):
    config, Rollout, manager = verl_skip
    model = tiny_dsv3_factory(0)
    replay = RolloutReplay(tmp_path, ReplayKey.from_verl_config(config))
    dumped = replay.generate(2, produce=lambda: _rollout(model, scale, seed=2))  # the "GPU" run dumps

    fresh = _rollout(model, scale, seed=99)  # what a new rollout on the "NPU" would sample instead
    assert batch_differences(dumped, fresh), "seed 99 sampled the same tokens; the replay test proves nothing"
    manager.set_step(2)
    calls = Rollout.calls
    replayed = Rollout(lambda: fresh).generate_sequences(fresh)
    assert Rollout.calls == calls, "verl generated step 2 although the harness dumped it"
    diffs = batch_differences(dumped, replayed)
    assert not diffs, f"{len(diffs)} fields differ after verl replayed the harness dump: " + "; ".join(map(str, diffs))


def test_repeat_action_picks_the_step_verl_picks(tmp_path, tiny_dapo_verl_config_factory, tiny_dsv3_factory, scale):
    from verl.utils.skip import SkipManager

    config = tiny_dapo_verl_config_factory(verl_skip_overrides(tmp_path, [2, 5, 9], "repeat", group="rollout"))
    SkipManager.init(config)
    try:
        verl_skip = SkipManager.skip_instances["rollout"]
        replay = RolloutReplay(tmp_path, ReplayKey.from_verl_config(config), action="repeat")
        model = tiny_dsv3_factory(0)
        for step in (3, 6):
            replay.dump(step, _rollout(model, scale, seed=step))
        for step in (1, 3, 4, 6, 9):
            assert replay.resolve(step) == verl_skip._find_latest_step(step), f"step {step}"
    finally:
        SkipManager.skip_instances = {}


def test_v1_trainer_skip_shares_the_directory_not_the_files(tmp_path, tiny_dapo_verl_config_factory):
    """harness.config.recipe's recipe runs verl's V1 trainer, whose skip group is `rollout_tq`: same directory per
    step as RolloutSkip, but TransferQueue files (tq_batch.pt), so seed 003's gen_batch.dp dumps need the
    harness replay (or `trainer.use_v1=false`) -- the module docstring of harness.artifacts.replay says why."""
    from verl.utils.skip import SkipManager

    config = tiny_dapo_verl_config_factory(verl_skip_overrides(tmp_path, [1], group="rollout_tq"))
    assert config.trainer.use_v1, "the recipe no longer runs the V1 trainer; revisit the replay notes"
    SkipManager.init(config)
    try:
        tq = SkipManager.skip_instances["rollout_tq"]
        assert tq.is_enabled() and not SkipManager.skip_instances["rollout"].is_enabled()
        replay = RolloutReplay(tmp_path, ReplayKey.from_verl_config(config))
        assert tq._get_step_dump_dir(1) == replay.step_dir(1)
        assert tq.tq_batch_name == "tq_batch.pt" != "gen_batch.dp"
    finally:
        SkipManager.skip_instances = {}
