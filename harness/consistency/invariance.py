"""Batch invariance of a rollout engine, measured: does a greedy prompt get the same tokens and the same float32
bits of its log-probs whatever else runs with it?

RL compares the rollout's log-probs with the trainer's token by token; an engine whose numbers change with the
batch a prompt lands in adds mismatch no weight sync can fix (vLLM's batch-invariant mode,
model_executor/determinism/batch_invariant.py; vLLM + TorchTitan's bitwise-consistent RL). The same prompt runs
alone, alone again, first in a batch with 7 others of varied lengths, at another position of that batch, and (where
the engine chunks prefill) with its prefill chunked. Each case is compared with the first run alone: the first
divergent token and the first position whose log-prob bits differ. Alone vs alone again must be bit-equal on every
engine (else it is not even deterministic); the other cases are judged only where the engine claims batch
invariance (`Engine.batch_invariant`), and recorded everywhere.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.findings import Finding

REPEAT = "alone again"


def float32_bits(values: Sequence[float]) -> list[int]:
    """The IEEE float32 bit patterns of `values` (log-probs come out of the engines as float32)."""
    return torch.tensor(list(values), dtype=torch.float32).view(torch.int32).tolist()


@dataclass(frozen=True)
class Generation:
    """The target prompt's greedy tokens and their log-probs in one case."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class CaseComparison:
    """One case against the first run alone: first divergent token, first position whose log-prob bits differ
    (None: none), the largest |d log-prob| over the common prefix of equal tokens, and whether it is judged."""

    case: str
    first_token: int | None
    first_bits: int | None
    max_abs: float
    judged: bool

    @property
    def equal(self) -> bool:
        return self.first_token is None and self.first_bits is None

    def describe(self) -> str:
        if self.equal:
            return f"{self.case}: bit-equal"
        where = (f"tokens diverge at position {self.first_token}" if self.first_token is not None else "same tokens")
        bits = f"log-prob bits first differ at position {self.first_bits}" if self.first_bits is not None else ""
        return f"{self.case}: {where}{'; ' + bits if bits else ''}, max |d log-prob| {self.max_abs:.3g}"

    def to_json(self) -> dict:
        return {"case": self.case, "equal": self.equal, "first_token": self.first_token,
                "first_bits": self.first_bits, "max_abs": self.max_abs, "judged": self.judged}


def compare(case: str, alone: Generation, other: Generation, *, judged: bool) -> CaseComparison:
    first_token = next((i for i, (a, b) in enumerate(zip(alone.tokens, other.tokens, strict=False)) if a != b),
                       None if len(alone.tokens) == len(other.tokens) else min(len(alone.tokens), len(other.tokens)))
    common = len(alone.tokens) if first_token is None else first_token + 1  # the first divergent step's log-prob too
    a, b = float32_bits(alone.logprobs[:common]), float32_bits(other.logprobs[:common])
    first_bits = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    diffs = [abs(x - y) for x, y in zip(alone.logprobs[:common], other.logprobs[:common], strict=True)]
    return CaseComparison(case=case, first_token=first_token, first_bits=first_bits, max_abs=max(diffs, default=0.0),
                          judged=judged)


@dataclass(frozen=True)
class BatchInvariance:
    """Every case of one engine. `ok` judges determinism (alone vs alone again) always; `invariant` judges the
    batched cases, meaningful only where `claimed`."""

    engine: str
    claimed: bool
    cases: tuple[CaseComparison, ...]

    @property
    def deterministic(self) -> bool:
        return all(c.equal for c in self.cases if c.case == REPEAT)

    @property
    def invariant(self) -> bool:
        return all(c.equal for c in self.cases)

    @property
    def ok(self) -> bool:
        return self.deterministic and (self.invariant or not self.claimed)

    def message(self) -> str:
        claim = "claims batch invariance" if self.claimed else "claims no batch invariance (batched cases recorded)"
        head = f"{self.engine} ({claim}): " + "; ".join(c.describe() for c in self.cases)
        if not self.deterministic:
            return head + ". The same prompt alone twice is not bit-equal: the engine is not deterministic"
        if self.claimed and not self.invariant:
            return head + ". The engine claims batch invariance, but the batch changed the prompt's outputs"
        return head

    def findings(self) -> tuple[Finding, ...]:
        return tuple(_finding(c) for c in self.cases if c.judged and not c.equal)

    def determinism(self) -> Verdict:
        """The determinism verdict alone (alone vs alone again): a batch-dependent difference of an engine that
        claims invariance is no evidence against determinism, and must not fail this one."""
        return Verdict(self, "determinism")

    def invariance(self) -> Verdict:
        """The batch-invariance verdict alone (every batched / moved / chunked case bit-equal to alone), meaningful
        where the engine claims it."""
        return Verdict(self, "invariance")

    def to_json(self) -> dict:
        return {"engine": self.engine, "claimed": self.claimed, "cases": [c.to_json() for c in self.cases]}


@dataclass(frozen=True)
class Verdict:
    """One of a BatchInvariance's two verdicts (a CheckResult): "determinism" judges only the same prompt alone
    twice; "invariance" only the batched cases."""

    of: BatchInvariance
    what: str

    def _cases(self) -> tuple[CaseComparison, ...]:
        return tuple(c for c in self.of.cases if (c.case == REPEAT) == (self.what == "determinism"))

    @property
    def ok(self) -> bool:
        return all(c.equal for c in self._cases())

    def message(self) -> str:
        of = self.of
        claim = "claims batch invariance" if of.claimed else "claims no batch invariance"
        head = f"{of.engine} ({claim}): " + "; ".join(c.describe() for c in self._cases())
        if self.ok:
            return head
        if self.what == "determinism":
            return head + ". The same prompt alone twice is not bit-equal: the engine is not deterministic"
        return head + (". The engine claims batch invariance, but the batch changed the prompt's outputs"
                       if of.claimed else ". The batch changed the prompt's outputs (no invariance claimed)")

    def findings(self) -> tuple[Finding, ...]:
        return tuple(_finding(c) for c in self._cases() if c.judged and not c.equal)


def _finding(c: CaseComparison) -> Finding:
    return Finding("consistency.batch_invariance", "log-probs",
                   f"{c.case}: position {c.first_token if c.first_token is not None else c.first_bits}", c.describe())


def _generation(rollout, row: int) -> Generation:
    return Generation(tokens=tuple(rollout.token_ids[row]), logprobs=tuple(rollout.logprobs[row]))


def measure_batch_invariance(engine, target: list[int], others: Sequence[list[int]], max_tokens: int, *,
                             position: int = 3, chunked: Generation | None = None) -> BatchInvariance:
    """Run the cases on `engine` (any harness Engine; greedy). `chunked`: the target's generation from an engine of
    the same kind whose prefill is chunked (built by the caller with a small token budget)."""
    alone = _generation(engine.sample([target], max_tokens), 0)
    claimed = bool(getattr(engine, "batch_invariant", False))
    batch = [target, *others]
    moved = [*others[:position], target, *others[position:]]
    cases = [compare(REPEAT, alone, _generation(engine.sample([target], max_tokens), 0), judged=True),
             compare(f"first of a batch of {len(batch)}", alone, _generation(engine.sample(batch, max_tokens), 0),
                     judged=claimed),
             compare(f"at position {position} of a batch of {len(moved)}", alone,
                     _generation(engine.sample(moved, max_tokens), position), judged=claimed)]
    if chunked is not None:
        cases.append(compare("prefill chunked", alone, chunked, judged=claimed))
    return BatchInvariance(engine=engine.name, claimed=claimed, cases=tuple(cases))


def measure_with_mode(make, env: dict[str, str], make_kwargs: dict, target: list[int], others: Sequence[list[int]],
                      max_tokens: int) -> BatchInvariance:
    """In a fresh process (harness.engines.isolation.in_fresh_process): switch the platform's batch-invariant mode
    on (`env`, e.g. VLLM_BATCH_INVARIANT=1), build the engine with `make(**make_kwargs)` and measure it. The mode
    patches torch for the whole process (vllm-ascend v0.23.0 batch_invariant.py init_batch_invariance, called from
    worker/worker.py; vLLM model_executor/determinism/batch_invariant.py), so it never runs in the suite's own
    process; the engine then claims invariance (`Engine.batch_invariant`) and its claim is judged."""
    import os

    os.environ.update(env)
    with make(**make_kwargs) as engine:
        return measure_batch_invariance(engine, target, others, max_tokens)

