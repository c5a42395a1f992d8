"""Self-tests of harness.artifacts.checkpoint: each check fails on a seeded reproduction of its seed-001 bug
(an index key training never yields, a resume that loses the optimizer state, a FileLogger truncated
on resume) and passes on the correct save / resume."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from harness.artifacts.checkpoint import (
    INDEX_FILE,
    check_keys_against_index,
    check_saved_dir,
    describe_differences,
    describe_gaps,
    missing_steps,
    rotate_log_for_resume,
    state_differences,
)
from harness.errors import BadInput

INV_FREQ = "model.layers.0.self_attn.rotary_emb.inv_freq"


def _weights():
    g = torch.Generator().manual_seed(0)
    return {f"model.layers.{i}.{part}.weight": torch.randn(4, 4, generator=g)
            for i in range(2) for part in ("self_attn.q_proj", "mlp.up_proj")}


def _index(tmp_path, weights, extra=()):
    weight_map = {k: f"model-0000{int(k.split('.')[2]) + 1}-of-00002.safetensors" for k in weights}
    weight_map.update({k: "model-00001-of-00002.safetensors" for k in extra})
    path = tmp_path / INDEX_FILE
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def mbridge_like_save(named_tensors, index_path, out_dir):
    """Seeded reproduction of mbridge's save_hf_weights (mbridge/core/safetensor_io.py): a shard is written
    only when every key the index maps to it has come out of the generator."""
    weight_map = json.loads(index_path.read_text())["weight_map"]
    by_file = {}
    for key, file in weight_map.items():
        by_file.setdefault(file, set()).add(key)
    states = {}
    for name, tensor in named_tensors:
        states[name] = tensor
        for file, keys in list(by_file.items()):
            if keys <= states.keys():
                save_file({k: states.pop(k) for k in keys}, str(out_dir / file))
                del by_file[file]
    (out_dir / INDEX_FILE).write_text(index_path.read_text())


def test_index_with_a_key_training_never_yields_is_caught(tmp_path):
    weights = _weights()
    index = _index(tmp_path, weights, extra=[INV_FREQ])  # Moonlight's index lists rotary_emb.inv_freq
    check = check_keys_against_index(index, weights)
    assert not check.ok
    (blocked,) = check.blocked
    assert blocked == type(blocked)("model-00001-of-00002.safetensors", (INV_FREQ,))
    assert INV_FREQ in str(check) and "1 of 2 files blocked" in str(check)


def test_blocked_save_on_disk_is_caught(tmp_path):
    weights = _weights()
    index = _index(tmp_path, weights, extra=[INV_FREQ])
    out = tmp_path / "hf"
    out.mkdir()
    mbridge_like_save(weights.items(), index, out)
    assert not (out / "model-00001-of-00002.safetensors").exists()  # the seeded bug really blocked the shard
    check = check_saved_dir(out)
    (blocked,) = check.blocked
    assert blocked.file == "model-00001-of-00002.safetensors" and INV_FREQ in blocked.missing
    assert len(blocked.missing) == 3  # the shard's two real weights are lost with it


def test_complete_save_passes(tmp_path):
    weights = _weights()
    index = _index(tmp_path, weights)
    out = tmp_path / "hf"
    out.mkdir()
    mbridge_like_save(weights.items(), index, out)
    assert check_keys_against_index(index, weights).ok
    check = check_saved_dir(out)
    assert check.ok and check.files == 2 and check.keys == 4, str(check)


def test_key_missing_from_the_index_is_caught(tmp_path):
    weights = _weights()
    index = _index(tmp_path, {k: v for k, v in list(weights.items())[1:]})
    check = check_keys_against_index(index, weights)
    assert check.unindexed == (next(iter(weights)),) and not check.ok


def test_unusable_index_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match=INDEX_FILE):
        check_saved_dir(tmp_path)
    (tmp_path / INDEX_FILE).write_text('{"weight_map": {"a": ')
    with pytest.raises(BadInput, match="not JSON"):
        check_keys_against_index(tmp_path / INDEX_FILE, [])


def _trained_adam():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(3, 4)).square().sum().backward()
        optim.step()
        optim.zero_grad()
    return model, optim


def _round_trip(state_dict, save):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optim.load_state_dict(save(state_dict))
    return optim.state_dict()


def test_correct_optimizer_round_trip_passes(tmp_path):
    _, optim = _trained_adam()
    saved = optim.state_dict()
    torch.save(saved, tmp_path / "optim.pt")
    assert state_differences(saved, _round_trip(saved, lambda sd: torch.load(tmp_path / "optim.pt"))) == ()


def test_lost_optimizer_state_is_caught():
    _, optim = _trained_adam()
    saved = optim.state_dict()
    # Seeded: the offloaded state was never gathered back, so only the param groups reach the file.
    diffs = state_differences(saved, _round_trip(saved, lambda sd: {"state": {}, "param_groups": sd["param_groups"]}))
    assert len(diffs) == 12 and {d.problem for d in diffs} == {"lost"}  # 4 params x (step, exp_avg, exp_avg_sq)
    message = describe_differences(diffs, "optimizer state after resume")
    assert "12 leaves differ (12 lost)" in message and "state/0/exp_avg: lost" in message


def test_missing_master_param_is_caught():
    master = {"state": {"layer.weight": {"exp_avg": torch.ones(2), "master_param": torch.full((2,), 0.5)}}}
    loaded = {"state": {"layer.weight": {"exp_avg": torch.ones(2)}}}  # verl PR #3850's KeyError class
    (diff,) = state_differences(master, loaded)
    assert str(diff) == "state/layer.weight/master_param: lost"


def test_changed_moment_is_caught_with_count_and_worst():
    a = {"state": {"w": {"exp_avg_sq": torch.zeros(4)}}}
    b = {"state": {"w": {"exp_avg_sq": torch.tensor([0.0, 0.5, 0.0, 2.0])}}}
    (diff,) = state_differences(a, b)
    assert (diff.problem, diff.count, diff.worst) == ("changed", 2, 2.0)
    assert state_differences(a, b, atol=2.0) == ()


def _filelogger_run(tmp_path, monkeypatch, rotate: bool):
    from verl.utils.tracking import FileLogger

    from harness.metrics.ingest import load_run

    log = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    for steps in (range(1, 5), range(3, 7)):  # crash after step 4, resume from the step-2 checkpoint
        if rotate:
            rotate_log_for_resume(log)
        logger = FileLogger("p", "e")
        for step in steps:
            logger.log({"critic/rewards/mean": float(step)}, step)
        logger.finish()
    return load_run(tmp_path, strict=False)


def test_truncated_log_is_caught(tmp_path, monkeypatch):
    run = _filelogger_run(tmp_path, monkeypatch, rotate=False)
    gaps = missing_steps(run)
    assert [str(g) for g in gaps] == ["1..2"]
    message = describe_gaps(run, gaps)
    assert "2 steps missing (1..2)" in message and "FileLogger" in message and "metrics.jsonl" in message


def test_rotated_segments_pass(tmp_path, monkeypatch):
    run = _filelogger_run(tmp_path, monkeypatch, rotate=True)
    assert missing_steps(run) == () and run.steps == tuple(range(1, 7))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.seg0.jsonl"]


def test_hole_in_the_middle_and_at_the_end():
    from harness.metrics.run import Run, Series

    run = Run("r", {"m": Series((1, 2, 5), (0.0, 0.0, 0.0))})
    assert [str(g) for g in missing_steps(run, last=7)] == ["3..4", "6..7"]
    assert "FileLogger" not in describe_gaps(run, missing_steps(run))
