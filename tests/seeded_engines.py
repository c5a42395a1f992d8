"""Engines that reproduce the real MLA failures, for `--engine seeded_engines:<name>` (self-tests only; tests/ is
on sys.path under pytest).

Each is the reference engine with one `harness.engines.reference.EngineFault`; `correct` is the reference itself.
"""
from harness.engines.reference import EngineFault, make_reference_engine


def _seeded(fault: EngineFault):
    def factory(spec, **kwargs):
        return make_reference_engine(spec, fault=fault, **kwargs)

    factory.__name__ = fault.value
    factory.__doc__ = f"Reference engine with EngineFault.{fault.name} (see harness.engines.reference.EngineFault)."
    return factory


correct = make_reference_engine
stale_copy = _seeded(EngineFault.STALE_COPY)  # vllm-ascend .contiguous() W_UK_T/W_UV, never re-derived
dtype_copy = _seeded(EngineFault.DTYPE_COPY)  # absorbed weights cast (copied) at init
rebind = _seeded(EngineFault.REBIND)  # load_weights rebinds param.data
scale_v_head = _seeded(EngineFault.SCALE_V_HEAD)  # MindSpeed 1/sqrt(kv_channels)
scale_no_mscale = _seeded(EngineFault.SCALE_NO_MSCALE)  # yarn scale without mscale^2
# realistic bugs that single-sync, list-input, token-only suites let through
rederive_once = _seeded(EngineFault.REDERIVE_ONCE)  # copies re-derived on the first sync only
two_pass = _seeded(EngineFault.TWO_PASS)  # iterates the sync input twice: empty 2nd pass on a generator
hidden_copy = _seeded(EngineFault.HIDDEN_COPY)  # decode uses packed copies mla_layers() does not show
drop_kv_a = _seeded(EngineFault.DROP_KV_A)  # sync drops kv_a_proj_with_mqa
precision = _seeded(EngineFault.PRECISION)  # re-derived copies rounded through bf16
layout = _seeded(EngineFault.LAYOUT)  # fresh views split [v | nope]
decode_scale = _seeded(EngineFault.DECODE_SCALE)  # softmax_scale() right, decode kernel 1/sqrt(v_head)
# MoE weight sync: the experts' kernel copy packed at build; the router bias never sent by the sync
packed_experts = _seeded(EngineFault.PACKED_EXPERTS)
stale_router_bias = _seeded(EngineFault.STALE_ROUTER_BIAS)


def batch_invariant(spec, **kwargs):
    """Reference engine that decodes every sequence on its own: claims (and has) batch invariance."""
    return make_reference_engine(spec, batch_invariant=True, **kwargs)


def split_k(spec, **kwargs):
    """Claims batch invariance, but layer 0's o_proj is a split-K GEMM split by the batch size (EngineFault.SPLIT_K)."""
    return make_reference_engine(spec, batch_invariant=True, fault=EngineFault.SPLIT_K, **kwargs)


MODE_ENV = "HARNESS_SEEDED_BATCH_INVARIANT"  # a stand-in for VLLM_BATCH_INVARIANT=1 (self-tests only)


def mode_invariant(spec, **kwargs):
    """Claims batch invariance when its mode variable is set, as vLLM does with VLLM_BATCH_INVARIANT=1; the suite
    builds it that way only in a fresh process (harness.consistency.invariance.measure_with_mode)."""
    import os

    return make_reference_engine(spec, batch_invariant=os.environ.get(MODE_ENV) == "1", **kwargs)


# MoE routing and sync (issue 31): each passed every suite under --engine before the MoE forward alignment and the
# MoE sync suite over fp32/bf16 x real/dummy
plain_topk = _seeded(EngineFault.PLAIN_TOPK)  # plain top-k, no group limit (n_group / topk_group ignored)
biased_weights = _seeded(EngineFault.BIASED_WEIGHTS)  # gating weights from the bias-corrected scores
stale_router_fp32 = _seeded(EngineFault.STALE_ROUTER_FP32)  # router fp32 copy made once: stale in bf16
dummy_experts = _seeded(EngineFault.DUMMY_EXPERTS)  # a dummy build's syncs drop the routed experts
# The Megatron sender suite's receiving side: the expert map kept from before a level-2 sleep (verl#7086)
stale_expert_map = _seeded(EngineFault.STALE_EXPERT_MAP)
