"""Checkpoint / resume (seed 001 "断点续训"): an HF save that writes every shard of the index, a resume
with the optimizer offloaded to the CPU that continues exactly where the run stopped, and metrics of
every step kept although verl's FileLogger truncates its file on resume.

tiny: the real DeepSeek-V3 architecture (transformers, random init), real torch AdamW and
torch.distributed.checkpoint, verl's real FileLogger and the harness ingest. NPU: the same checks
through verl's Megatron checkpoint manager with mbridge (behind `requires`).
"""
from __future__ import annotations

import json

import pytest
import torch

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
from harness.markers import requires

STEPS, SAVE_AT = 3, 2


def _batches(vocab: int, n: int):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (2, 8), generator=g) for _ in range(n)]


def _key(name: str) -> str:
    return name.replace(".", "__")  # ParameterDict keys cannot hold dots


class OffloadedMixedPrecision:
    """The optimizer layout of Megatron's `optimizer_cpu_offload`: the model computes in bf16 on the
    device; fp32 master copies of the parameters and AdamW's moments live on the CPU. A checkpoint
    must carry the masters (Megatron's `master_param`) or a resume restarts from bf16-rounded weights."""

    def __init__(self, model):
        self.model = model.to(torch.bfloat16)
        self.params = dict(model.named_parameters())
        self.master_module = torch.nn.ParameterDict({_key(n): torch.nn.Parameter(p.detach().float().cpu().clone())
                                                     for n, p in self.params.items()})
        self.optim = torch.optim.AdamW(self.master_module.parameters(), lr=1e-2)

    def pairs(self):
        return [(p, self.master_module[_key(n)]) for n, p in self.params.items()]

    def step(self, tokens):
        loss = self.model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        for p, master in self.pairs():
            master.grad = None if p.grad is None else p.grad.detach().float().cpu()
            p.grad = None
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, master in self.pairs():
                p.copy_(master.to(p.device, p.dtype))
        return float(loss)

    def state(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        master_sd, optim_sd = get_state_dict(self.master_module, self.optim)
        return {"master_param": master_sd, "optim": optim_sd}

    def load(self, state):
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.master_module, self.optim, model_state_dict=state["master_param"],
                       optim_state_dict=state["optim"])
        with torch.no_grad():
            for p, master in self.pairs():
                p.copy_(master.to(p.device, p.dtype))


@pytest.mark.tiny
@pytest.mark.cpu
def test_hf_save_writes_every_shard_of_the_index(tmp_path, tiny_dsv3_factory, record_property):
    model = tiny_dsv3_factory(0)
    model.save_pretrained(tmp_path, max_shard_size="2MB")  # several shards, hence an index
    index = tmp_path / INDEX_FILE
    weight_map = json.loads(index.read_text())["weight_map"]
    assert len(set(weight_map.values())) > 1, "the tiny save was not sharded; the index check would be vacuous"
    # What the exporter yields, in checkpoint names: transformers 5 fuses the experts in memory
    # (experts.gate_up_proj) and splits them back on save, as mbridge maps MCore names to HF names. The
    # in-memory names would block 1 of 5 shards here -- the same subset rule that blocked seed 001's save.
    from transformers.core_model_loading import revert_weight_conversion

    produced = revert_weight_conversion(model, model.state_dict()).keys()
    before = check_keys_against_index(index, produced)  # mbridge's rule, before any save
    assert before.ok, str(before)
    after = check_saved_dir(tmp_path)
    assert after.ok, str(after)
    record_property("checkpoint.hf_save", {"files": after.files, "keys": after.keys, "blocked": len(after.blocked)})


@pytest.mark.tiny
@pytest.mark.cpu
def test_resume_with_offloaded_optimizer_continues_exactly(tmp_path, tiny_dsv3_factory, record_property):
    import torch.distributed.checkpoint as dcp

    batches = _batches(tiny_dsv3_factory(0).config.vocab_size, STEPS)
    straight = OffloadedMixedPrecision(tiny_dsv3_factory(0))
    losses = [straight.step(b) for b in batches]

    first = OffloadedMixedPrecision(tiny_dsv3_factory(0))
    for b in batches[:SAVE_AT]:
        first.step(b)
    saved = first.state()
    dcp.save(saved, checkpoint_id=tmp_path / f"global_step_{SAVE_AT}")

    resumed = OffloadedMixedPrecision(tiny_dsv3_factory(1))  # other init: only the checkpoint can make it match
    target = resumed.state()
    dcp.load(target, checkpoint_id=tmp_path / f"global_step_{SAVE_AT}")
    resumed.load(target)
    diffs = state_differences(saved, resumed.state())
    assert not diffs, describe_differences(diffs, "optimizer state after resume")
    resumed_losses = [resumed.step(b) for b in batches[SAVE_AT:]]

    diffs = state_differences(straight.state(), resumed.state())
    assert not diffs, describe_differences(diffs, f"state after {STEPS} steps, resumed at {SAVE_AT} vs straight")
    assert resumed_losses == losses[SAVE_AT:], f"losses after resume {resumed_losses} != {losses[SAVE_AT:]}"
    record_property("checkpoint.resume", {"steps": STEPS, "saved_at": SAVE_AT, "optimizer_leaves":
                                          len(saved["optim"]["state"]), "losses": losses})


@pytest.mark.tiny
@pytest.mark.cpu
def test_resumed_run_keeps_the_metrics_of_every_step(tmp_path, monkeypatch):
    from verl.utils.tracking import FileLogger

    from harness.metrics.ingest import load_run

    log = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    first = FileLogger("ascend-rl-harness", "dapo-tiny")
    for step in range(1, STEPS + 1):  # crashes after step 4; the last checkpoint is step 2
        first.log({"critic/rewards/mean": 0.1 * step}, step)
    first.finish()

    rotate_log_for_resume(log)  # what the launcher does before it resubmits a job with resume_mode=auto
    second = FileLogger("ascend-rl-harness", "dapo-tiny")  # opens with "wb"
    for step in range(SAVE_AT + 1, STEPS + 3):
        second.log({"critic/rewards/mean": 1.0 + step}, step)
    second.finish()
    assert min(json.loads(line)["step"] for line in log.read_text().splitlines()) == SAVE_AT + 1, \
        "verl's FileLogger no longer truncates on resume; the rotation may be unnecessary"

    run = load_run(tmp_path, strict=False)
    gaps = missing_steps(run)
    assert not gaps, describe_gaps(run, gaps)
    assert run["critic/rewards/mean"].as_dict()[SAVE_AT + 1] == 1.0 + SAVE_AT + 1, "the resumed segment must win"


@pytest.mark.moonlight
@pytest.mark.npu
@requires(hardware="npu", packages=["mbridge", "megatron"])
def test_mbridge_hf_save_writes_every_shard(tmp_path, scale):
    """On the NPU: mbridge's `save_weights`, called the way verl's Megatron checkpoint manager calls it for
    the HF model (verl/utils/checkpoint/megatron_checkpoint_manager.py, `self.bridge.save_weights(self.model,
    hf_ckpt_path)`), writes every shard of Moonlight's index (seed 001: `rotary_emb.inv_freq` in the index
    blocked the save). The preflight check names the blocking keys before the 16-card job is booked."""
    import os

    import torch.distributed as dist
    from mbridge import AutoBridge

    # $HARNESS_MODEL_DIR holds one HF directory per model, as for the cluster jobs (harness.launch.jobs)
    model_dir = os.path.join(os.environ.get("HARNESS_MODEL_DIR", "models"), scale.model.name)
    if not os.path.isfile(os.path.join(model_dir, INDEX_FILE)):
        pytest.fail(f"{model_dir}/{INDEX_FILE} missing: set HARNESS_MODEL_DIR to the directory holding "
                    f"{scale.model.name}/", pytrace=False)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("hccl", rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    bridge = AutoBridge.from_pretrained(model_dir)
    models = bridge.get_model()
    bridge.load_weights(models, model_dir)
    produced = [name for name, _ in bridge.export_weights(models)]
    preflight = check_keys_against_index(os.path.join(model_dir, INDEX_FILE), produced)
    bridge.save_weights(models, str(tmp_path))
    saved = check_saved_dir(tmp_path) if (tmp_path / INDEX_FILE).exists() else None
    assert preflight.ok, str(preflight)
    assert saved is not None and saved.ok, str(saved) if saved else f"mbridge wrote no {INDEX_FILE} into {tmp_path}"
