"""Self-test of the sleep-release check (harness.memory.probe) on real process memory: a sleep that
frees its weights passes; the seeded bug, a sleep that "offloads" but keeps a reference to the
weights (seed 001's question: is the framework leaving memory behind?), is flagged with its numbers."""
from __future__ import annotations

import torch

from harness.memory.probe import check_sleep_release, used_bytes

WEIGHTS = 64 * 2**20


class _Holder:
    """A real allocation with a sleep: `leak=True` keeps a second reference, as a forgotten copy does."""

    def __init__(self, leak: bool):
        self.weights = torch.ones(WEIGHTS // 4)  # touched pages: resident
        self.leak, self._kept = leak, None

    def sleep(self):
        if self.leak:
            self._kept = self.weights  # seeded bug: offloaded "copy" still references the storage
        self.weights = None


def _measure(leak: bool):
    base = used_bytes("cpu")
    holder = _Holder(leak)
    loaded = used_bytes("cpu")
    holder.sleep()
    asleep = used_bytes("cpu")
    return check_sleep_release("holder", "cpu", base, loaded, asleep)


def test_freeing_sleep_passes():
    verdict = _measure(leak=False)
    assert verdict.ok, verdict.message()


def test_seeded_leaking_sleep_is_flagged():
    verdict = _measure(leak=True)
    assert not verdict.ok, verdict.message()
    assert "remain above the pre-load level" in verdict.message()


def test_nothing_loaded_is_not_a_pass():
    verdict = check_sleep_release("empty", "cpu", 100, 100, 100)
    assert not verdict.ok and "nothing measurable" in verdict.message()
