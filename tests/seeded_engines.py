"""Engines that reproduce the real MLA failures, for `--engine seeded_engines:<name>` (self-tests only; tests/ is
on sys.path under pytest).

Each is the reference engine with one `harness.engines.reference.Fault`; `correct` is the reference itself.
"""
from harness.engines.reference import Fault, make_reference_engine


def _seeded(fault: Fault):
    def factory(spec, **kwargs):
        return make_reference_engine(spec, fault=fault, **kwargs)

    factory.__name__ = fault.value
    factory.__doc__ = f"Reference engine with Fault.{fault.name} (see harness.engines.reference.Fault)."
    return factory


correct = make_reference_engine
stale_copy = _seeded(Fault.STALE_COPY)  # vllm-ascend .contiguous() W_UK_T/W_UV, never re-derived
dtype_copy = _seeded(Fault.DTYPE_COPY)  # absorbed weights cast (copied) at init
rebind = _seeded(Fault.REBIND)  # load_weights rebinds param.data
scale_v_head = _seeded(Fault.SCALE_V_HEAD)  # MindSpeed 1/sqrt(kv_channels)
scale_no_mscale = _seeded(Fault.SCALE_NO_MSCALE)  # yarn scale without mscale^2
