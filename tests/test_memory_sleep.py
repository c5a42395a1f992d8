"""Self-test of the sleep-release check (harness.memory.device) on real process memory: a sleep that
frees its weights passes; the seeded bug, a sleep that "offloads" but keeps a reference to the
weights (seed 001's question: is the framework leaving memory behind?), is flagged with its numbers.
The same holds for the reference engine the memory suite measures: its real sleep passes, and the two
ways an engine's sleep keeps its memory (the storage itself, or an in-process "host" copy) fail."""
from __future__ import annotations

import pytest
import torch

from harness.config.models import TINY
from harness.engines.reference import ReferenceEngine
from harness.memory.device import check_sleep_release, used_bytes

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


# ~69 MiB of fp32 weights (the memory suite's model size): far above the check's 16 MiB noise floor.
ENGINE_SPEC = TINY.with_layers(24, first_k_dense_replace=24, name="tiny-dsv3-24l")


class _KeepsStorage(ReferenceEngine):
    """Seeded bug: sleep emulates the numbers only (level 2 NaN-fills the weights in place) and keeps every
    byte, the reference engine's own sleep before it freed storage."""

    def sleep(self, level: int = 1) -> None:
        if level == 2:
            with torch.no_grad():
                for p in self.params.values():
                    p.fill_(float("nan"))
        self._asleep = True

    def wake_up(self) -> None:
        self._asleep = False


class _HostCopyInProcess(ReferenceEngine):
    """Seeded bug: level-1 "offload" to a host copy in the same process, then frees the working copy. On a
    GPU the copy would leave device memory; on a CPU engine host memory IS its memory, so nothing returns."""

    def sleep(self, level: int = 1) -> None:
        self._host_copy = {k: p.detach().clone() for k, p in self.params.items()}
        super().sleep(level=2)


def _measure_engine(cls, level: int):
    base = used_bytes("cpu")
    engine = cls(ENGINE_SPEC, load_format="dummy")
    loaded = used_bytes("cpu")
    engine.sleep(level=level)
    asleep = used_bytes("cpu")
    engine.wake_up()
    return check_sleep_release(engine.name, "cpu", base, loaded, asleep)


@pytest.mark.parametrize("level", [1, 2])
def test_reference_engine_sleep_passes(level):
    verdict = _measure_engine(ReferenceEngine, level)
    assert verdict.ok, verdict.message()


@pytest.mark.parametrize("cls, level", [(_KeepsStorage, 2), (_HostCopyInProcess, 1)])
def test_seeded_engine_sleep_keeping_memory_is_flagged(cls, level):
    verdict = _measure_engine(cls, level)
    assert not verdict.ok, verdict.message()
    assert "remain above the pre-load level" in verdict.message()
