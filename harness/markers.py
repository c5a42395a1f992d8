"""The pytest vocabulary of the harness, in one leaf module: marker tables, stash keys, `requires(...)` and
`skip_or_fail`. The plugin registers the markers; suites, fixtures and the report collector import them from
here (no library module imports the plugin).

A test states what it needs with a tier marker (`tiny` ... `full`), hardware markers (`npu`, `a3`, ...) or
`@requires(...)`; when the need is not met it is skipped with the reason, and `--strict-hardware` turns the
skip into a failure naming what is missing, so a nightly run can never go green by skipping.
"""
from __future__ import annotations

import re

import pytest

HARDWARE_MARKERS = {
    "cpu": "runs on the CPU",
    "gpu": "needs a CUDA GPU",
    "npu": "needs an Ascend NPU (torch_npu + CANN)",
    "a2": "needs Atlas A2 (Ascend 910B)",
    "a3": "needs Atlas A3 (Ascend 910_93, 2 dies per card)",
}
# Keys are harness.config.scales.TIERS, in tier order (tests/test_plugin.py checks they agree).
TIER_MARKERS = {
    "tiny": "tiny random-init DeepSeek-V3 on CPU or one card; every suite, seconds",
    "layer": "one full-size DSV3 decoder layer; one card, or CPU with fake tensors",
    "reduced": "DSV3 dims with reduced layers on one node (A2 8 cards / A3 16 dies)",
    "moonlight": "Moonlight-16B-A3B on 1-2 nodes",
    "full": "DeepSeek-V3 671B, 61 layers: A2 256 cards or A3 128 cards",
}
OTHER_MARKERS = {  # name (with its signature, as `pytest --markers` lists it) -> what it means
    "nightly": "part of the nightly NPU cluster run",
    "regression": "a seeded algorithmic regression on verl's real trainer (one tiny verl run each, minutes): the "
                  "alignment must fail it",
    "fabric": "the team's recipe through the multi-node rehearsal (harness.launch.cluster; two tiny verl runs, "
              "~15 min on 2 cores): opt in with -m fabric",
    "registry": "needs the package registry (resolves the NPU constraint sets); deselect offline: -m 'not registry'",
    "scales(*names)": "applies only to these scales (e.g. the A3 TPS target): deselected, not skipped, when the "
                      "session's scale (--scale, or the tier's default for the hardware) is another one",
    "syncs_weights": "judges the rollout engine after an in-place weight sync: with an engine kind that does not "
                     "re-derive the absorbed MLA weights, on a platform whose decode kernel keeps copies, an "
                     "expected failure (seed 001's bug on purpose; fixtures/engines.py)",
    "upstream_failure(raises, match, reason, condition=True)": "a strict expected failure that names the upstream "
                                                              "behaviour it documents: the exception type and a "
                                                              "regex its message must match; another crash, or a "
                                                              "pass, fails (harness.markers.upstream_failure)",
    "requires(hardware=None, cards=None, devices=None, packages=())": "skip (or fail with --strict-hardware) "
                                                                        "unless the hardware, card count and "
                                                                        "packages are present",
}
REPORTED_MARKERS = (*TIER_MARKERS, *HARDWARE_MARKERS, "nightly")  # what a report lists per test

SCALE_KEY = pytest.StashKey["Scale | None"]()  # --scale, resolved (harness.config.scales.Scale)
DETECTED_KEY = pytest.StashKey["Detected"]()  # the hardware this session runs on (harness.config.hardware)
CLUSTER_KEY = pytest.StashKey["dict"]()  # --ray-address and, once counted, the cluster's devices
ENGINE_KEY = pytest.StashKey["Callable | None"]()  # --engine, resolved to its factory at configure time


def upstream_failure(raises: type[BaseException], match: str, reason: str, *,
                     condition: bool = True) -> pytest.MarkDecorator:
    """The one way this project expects a failure: a strict xfail that says what is expected -- `raises` (the
    exception type) and `match` (a regex searched in its message) -- and why. pytest's own `xfail(strict=True)`
    without `raises` read any crash as the expected failure (on an AMX host the weight sync raised RuntimeError
    where the stale-weights AssertionError was expected, and a different crash would have passed as well); with a
    type but no message a wrong assertion still passes. The plugin turns this marker into pytest's xfail and fails
    the test when the exception does not match (harness.plugin), and refuses a bare xfail in the project's tests."""
    if not (isinstance(raises, type) and issubclass(raises, BaseException)):
        raise TypeError(f"upstream_failure(raises={raises!r}): an exception type is expected")
    re.compile(match)  # a bad pattern fails at import, not as a puzzling test failure
    return pytest.mark.upstream_failure(raises=raises, match=match, reason=reason, condition=bool(condition))


def requires(hardware: str | None = None, *, cards: int | None = None, devices: int | None = None,
             packages: tuple[str, ...] | list[str] = ()) -> pytest.MarkDecorator:
    """One decorator per hardware need: `@requires(hardware="a3", cards=128, packages=["vllm_ascend"])`."""
    if hardware is not None and hardware not in HARDWARE_MARKERS:
        raise ValueError(f"requires(hardware={hardware!r}): use one of {', '.join(HARDWARE_MARKERS)}")
    return pytest.mark.requires(hardware=hardware, cards=cards, devices=devices, packages=tuple(packages))


def skip_or_fail(config: pytest.Config, reason: str, *, strict: bool = True) -> None:
    """Skip with the reason; under --strict-hardware fail with it instead. Every suite skips through here
    (never a bare `pytest.skip` / `importorskip`), so --strict-hardware cannot be bypassed. `strict=False`: what is
    missing is nothing this run could have -- a GPU/NPU's sleep mode on a CPU run, AMX tiles, which no --hardware
    choice promises, a check the job's own settings rule out -- so it stays a skip, with its reason, under
    --strict-hardware too (a CPU night on a CPU host without AMX failed 7 tests it can never run)."""
    if strict and config.getoption("strict_hardware"):
        pytest.fail(f"--strict-hardware: missing {reason}", pytrace=False)
    # Report the skip at the test's location (as pytest's own skip marks do), not at this line, so
    # `-rs` says which test lacks what.
    raise pytest.skip.Exception(f"missing {reason}", _use_item_location=True)
