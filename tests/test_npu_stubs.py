"""The NPU platform rehearsed on this CPU (issue 46): stubs of verl's Ascend platform (harness.engines.verl_npu_stub)
and of vllm-ascend's MoE layer (harness.engines.ascend_moe_stub), written from the upstream files they cite, run
the code paths that broke on the NPU nights; each case fails with its fix reverted."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.tiny

WANT = torch.arange(6, dtype=torch.float32).reshape(2, 3)


def _pp_broadcast(rank: int, store: str, revert_b1: bool) -> None:
    """One gloo rank of the sender's PP group on verl's Ascend platform (stubbed): megatron's PP 2, rank 0 owns a
    tensor, verl's `broadcast_from_megatron_pp` hands it to rank 1 (the collective path of the verl exporter)."""
    from harness.engines import verl_npu_stub

    os.environ.pop("VERL_PLATFORM", None)
    os.environ.update(verl_npu_stub.ENV)  # before verl is imported in this spawned process
    from harness.launch import megatron_sender

    if revert_b1:  # the old sender: verl's platform left to verl's detection in every rank
        megatron_sender._cpu_verl_platform = lambda: None
    megatron_sender._rank_setup(rank, 2, store)
    from megatron.core import parallel_state as mpu
    from verl.utils.megatron_utils import broadcast_from_megatron_pp

    mpu.initialize_model_parallel(pipeline_model_parallel_size=2)
    got = broadcast_from_megatron_pp(WANT.clone() if rank == 0 else None)
    assert got.device.type == "cpu" and torch.equal(got, WANT), (rank, got.device)
    torch.distributed.destroy_process_group()


def _spawn_pp_broadcast(tmp_path, revert_b1: bool) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_pp_broadcast, args=(str(tmp_path / "store"), revert_b1), nprocs=2, join=True)


@pytest.mark.parametrize("revert_b1", [False, True], ids=["fixed", "b1-reverted"])
def test_sender_ranks_broadcast_on_cpu_under_the_npu_platform(tmp_path, revert_b1):
    """B1: under a verl platform that is not CPU (the Ascend one, stubbed: device npu, no gloo backend for it),
    every sender rank forces verl's CPU platform before verl runs, so the PP broadcast of the verl exporter lands
    on CPU; reverted (the old sender forced it only without an accelerator and only in rank 0), the non-owning
    rank allocates on the NPU device and gloo refuses it."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("verl")
    if not revert_b1:
        _spawn_pp_broadcast(tmp_path, revert_b1)
        return
    with pytest.raises(Exception, match="torch.npu") as caught:
        _spawn_pp_broadcast(tmp_path, revert_b1)
    # the non-owning PP rank, allocating verl's buffer on its platform's device
    assert "Process 1 terminated" in str(caught.value) and "broadcast_from_megatron_pp" in str(caught.value)
