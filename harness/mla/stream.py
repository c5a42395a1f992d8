"""What a weight sync sent, against the weights the trainer held: every tensor by name, exactly once, bit for bit
(the export and verl's bucketed transfer copy tensors; they do not compute). A mismatch is diagnosed from the
evidence, not blamed by name:

  stale      equals the tensor of that name at an EARLIER sync (a sender-side cache across syncs:
             NovaSky-AI/SkyRL#1345, a bucketed Megatron export caching PP metadata with PP > 1)
  misnamed   equals ANOTHER tensor of this sync: the (from -> to) pairs are summarised by what differs, a layer
             number (a PP stage's layer offset lost) or an expert id (an EP rank's experts under another rank's
             global ids)
  duplicate  the same name sent more than once in a sync
  missing    never sent; when there is one per bucket boundary, it says so (the tensor that overflowed a bucket)
  corrupt    equals nothing the trainer held
"""
from __future__ import annotations

import collections
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.findings import Finding

_INDEX = {"layer": re.compile(r"\.layers\.(\d+)\."), "expert": re.compile(r"\.experts\.(\d+)\.")}


def _key(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, tuple(t.flatten()[:8].tolist()))


def _shift(sent_as: str, really: str) -> str | None:
    """'layer' / 'expert' when the two names differ only in that index, else None."""
    for what, pattern in _INDEX.items():
        if pattern.sub(".#.", sent_as) == pattern.sub(".#.", really) and sent_as != really:
            return what
    return None


def _span(numbers) -> str:
    values = sorted(set(numbers))
    return f"{values[0]}-{values[-1]}" if len(values) > 2 and values[-1] - values[0] == len(values) - 1 \
        else ", ".join(map(str, values))


@dataclass(frozen=True)
class StreamCheck:
    """One sync's stream against the trainer's weights (see the module docstring)."""

    sender: str
    sync: int  # 1-based
    sent: int
    expected: int
    buckets: int
    stale: tuple[str, ...] = ()
    misnamed: tuple[tuple[str, str], ...] = ()  # (name sent, name whose tensor it is)
    duplicate: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    corrupt: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.stale or self.misnamed or self.duplicate or self.missing or self.corrupt)

    def diagnoses(self) -> list[str]:
        out = []
        if self.stale:
            layers = {int(m.group(1)) for n in self.stale if (m := _INDEX["layer"].search(n))}
            out.append(f"stale: {len(self.stale)} tensors (layers {_span(layers) if layers else '-'}) are an earlier "
                       "sync's values: consistent with a sender-side cache not refreshed across syncs (with PP > 1, "
                       "NovaSky-AI/SkyRL#1345's cached PP-stage metadata)")
        by_kind = collections.defaultdict(set)
        for sent_as, really in self.misnamed:
            kind = _shift(sent_as, really)
            if kind:
                by_kind[kind].add((int(_INDEX[kind].search(really).group(1)),
                                   int(_INDEX[kind].search(sent_as).group(1))))
        if "layer" in by_kind:
            pairs = sorted(by_kind["layer"])
            out.append(f"misnamed: layers {_span(a for a, _ in pairs)} arrived as layers {_span(b for _, b in pairs)}: "
                       "consistent with a pipeline stage's layer offset lost (its local layer numbers exported as "
                       "global)")
        if "expert" in by_kind:
            pairs = sorted(by_kind["expert"])
            out.append(f"misnamed: experts {_span(a for a, _ in pairs)} arrived as experts "
                       f"{_span(b for _, b in pairs)}: consistent with an EP rank's experts exported with another "
                       "rank's global expert ids")
        other = [p for p in self.misnamed if not _shift(*p)]
        if other:
            out.append(f"misnamed: {len(other)} tensors under another weight's name, e.g. {other[0][1]} sent as "
                       f"{other[0][0]}")
        if self.duplicate:
            out.append(f"duplicate: {len(self.duplicate)} names sent more than once, e.g. {self.duplicate[0]}")
        if self.missing:
            boundary = (" -- as many as bucket boundaries: consistent with a bucket's last tensor lost at each flush"
                        if len(self.missing) == self.buckets - 1 else "")
            out.append(f"missing: {len(self.missing)} of {self.expected} tensors never sent, e.g. {self.missing[0]}"
                       + boundary)
        if self.corrupt:
            out.append(f"corrupt: {len(self.corrupt)} tensors equal nothing the trainer held, e.g. {self.corrupt[0]}")
        return out

    def message(self) -> str:
        head = (f"{self.sender}: sync {self.sync} sent {self.sent} tensors in {self.buckets} buckets for the "
                f"trainer's {self.expected}")
        return head + (": every one exact" if self.ok else "; " + "; ".join(self.diagnoses()))

    def findings(self) -> tuple[Finding, ...]:
        return tuple(Finding("sync.sender_stream", d.split(":")[0], f"sync {self.sync}", d) for d in self.diagnoses())


def check_stream(sender: str, sync: int, sent: Sequence[tuple[str, torch.Tensor]], buckets: int,
                 truth: dict[str, torch.Tensor], earlier: Sequence[dict[str, torch.Tensor]] = ()) -> StreamCheck:
    """Judge one sync's stream `sent` ((name, tensor) in arrival order) against the trainer's `truth`; `earlier`:
    the trainer's weights at the previous syncs (the evidence for "stale")."""
    index = collections.defaultdict(list)
    for name, tensor in truth.items():
        index[_key(tensor)].append(name)
    counts = collections.Counter(name for name, _ in sent)
    stale, misnamed, corrupt = [], [], []
    for name, tensor in sent:
        want = truth.get(name)
        if want is not None and want.shape == tensor.shape and torch.equal(want, tensor):
            continue
        if name in truth and any(name in old and old[name].shape == tensor.shape and torch.equal(old[name], tensor)
                                 for old in earlier):
            stale.append(name)
            continue
        really = next((n for n in index.get(_key(tensor), ()) if torch.equal(truth[n], tensor)), None)
        (misnamed.append((name, really)) if really else corrupt.append(name))
    return StreamCheck(sender=sender, sync=sync, sent=len(sent), expected=len(truth), buckets=buckets,
                       stale=tuple(stale), misnamed=tuple(misnamed),
                       duplicate=tuple(sorted(n for n, c in counts.items() if c > 1)),
                       missing=tuple(sorted(set(truth) - set(counts))), corrupt=tuple(corrupt))
