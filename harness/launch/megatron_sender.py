"""The sending side of the weight sync, run for real on CPU: a tiny DeepSeek-V3 in megatron-core 0.12.1 on four gloo
ranks (PP 2 with EP 2, or PP 2 with TP 2), exported the way verl exports it, sent through verl's own bucketed
transfer, received by an engine under test (`SenderRun`).

    python -m harness.launch.megatron_sender --socket-dir D

The process (`SenderServer` starts it) sends one series of syncs per request D/request-<n>.json (`SenderRun`
writes it: the checkpoints, layout, exporter, seeded bug, bucket size) and answers D/reply-<n>.json with the
per-sync timings, until D/stop; a failure leaves D/error.json. Each sync k of series n: every rank loads the k-th
checkpoint (an HF model directory) into its shard with mbridge's `load_weights` (its HF -> Megatron import: the
step's new weights), the exporter turns the shards back into HF tensors, and rank 0 sends them through verl
0.9.1's `BucketedWeightSender` (shared memory + ZMQ, the path verl takes where there is no CUDA IPC) to
`ipc://D/series-n-sync-k.sock`.

Exporters (both real code, installed):
  verl     verl 0.9.1 `verl/utils/megatron_utils.py` `per_tensor_generator` (PP broadcast, EP all-gather with
           global expert ids, TP all-gather + `default_tp_concat_fn`) with `verl/models/mcore/weight_converter.py`
           `McoreToHFWeightConverterDpskv3`.
  mbridge  mbridge 0.15.1 `mbridge/core/bridge.py` `Bridge.export_weights` with `models/deepseek_v3.py`
           `DeepseekV3Bridge` (verl 0.9.1's `vanilla_mbridge=True` path: `workers/engine/megatron/
           transformer_impl.py` `get_per_tensor_param` calls `bridge.export_weights(self.module)`).

What does not run on this CPU, and what stands in for it:
- Transformer Engine (CUDA only). Both exporters read TE's parameter names (`linear_q_up_proj.layer_norm_weight`,
  `mlp.linear_fc1.layer_norm_weight`, grouped experts `mlp.experts.linear_fc1.weight<i>`), and megatron-core's
  local spec has other names (separate `q_layernorm` / `kv_layernorm` / `pre_mlp_layernorm` modules,
  `local_experts.<i>`). So the model is megatron-core's own decoder-block spec with TE's fused modules replaced by
  CPU modules that compute the same thing under TE's names: `NormedColumnParallelLinear` (RMSNorm then a
  ColumnParallelLinear: TELayerNormColumnParallelLinear), `GroupedLinear` (one weight per local expert, sharded by
  expert-TP and marked tensor-parallel as TE marks them: TEColumn/RowParallelGroupedLinear) inside megatron-core's
  real `TEGroupedMLP`, and `CoreAttention` (TE DotProductAttention's signature: core_r0.12.1's local one refuses the
  `k_channels` MLA passes).
- `mbridge/__init__.py` imports every model family, and gemma3's projector imports transformer_engine at module
  level; the package is loaded without it (`mbridge.core` and `mbridge.models.deepseek_v3` only).
- The alltoall token dispatcher creates a `torch.cuda.Stream` in its constructor: the CPU build uses the allgather
  one (with fixed sequence lengths, which it requires). The dispatcher does not touch the parameters exported.
- TP 2 with EP 2 needs sequence parallelism (megatron-core refuses TP x EP without it) and core_r0.12.1's torch
  norm refuses sequence parallelism, so TP 2 runs with EP 1 (experts then sharded by expert-TP 2).
- mbridge 0.15.1 reads `hf_config.rope_theta` / `rope_scaling`, which transformers 5 moved into
  `rope_parameters` (the known bug `mbridge-rope-theta-transformers-5`; fixed from 9ad77d7): the config handed to
  the bridge carries both, as the fix reads them. Its DeepseekV3Bridge loads only bf16 (`_get_safetensor_io`
  calls `NotImplemented(...)` otherwise): the tiny fp32 checkpoint has no fp8 tensors to dequantize, so the base
  class's SafeTensorIO reads it.
- `perform_initialization=True`: with it False, core_r0.12.1 ColumnParallelLinear never marks its weight
  tensor-parallel, and verl's generator then hands the fused gate/up to the DSV3 converter as one tensor
  (AssertionError in `_convert_mlp_param`).

Seeded sender bugs (`--bug`, SENDER_BUGS): each reproduces a reported class at the place it lives; the sender
suite's self-tests must fail on each.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

WORLD = 4
EXPORTERS = ("verl", "mbridge")
COLLECTIVE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    ep: int
    etp: int


LAYOUTS = {"tp1-pp2-ep2": Layout(tp=1, pp=2, ep=2, etp=1), "tp2-pp2-ep1": Layout(tp=2, pp=2, ep=1, etp=2)}

SENDER_BUGS = {
    "stale-pp-cache": "the tensors rank 0 receives from the other PP stage are cached at the first sync and reused "
                      "(NovaSky-AI/SkyRL#1345: a bucketed Megatron export caches stale PP metadata, PP > 1, "
                      "DeepSeek-style; the reward collapses)",
    "pp-offset-lost": "the second PP stage exports its local layer numbers: its layers arrive named as the first "
                      "stage's (verl: get_transformer_layer_offset; mbridge: the local-to-global layer map)",
    "bucket-drops-boundary": "every bucket but the last loses its last tensor at the flush (verl's own packing and "
                             "boundaries; the metadata sent at the boundary leaves the tensor out)",
    "ep-rank0-ids": "every EP rank's experts are exported with EP rank 0's global expert ids",
}
_LAYER = re.compile(r"(\.layers\.)(\d+)(\.)")
_EXPERT = re.compile(r"(\.experts\.)(\d+)(\.)")


# ------------------------------------------------------------------ the sender (spawned ranks)
def _load_mbridge():
    """mbridge's core and its DeepseekV3 bridge, without `mbridge/__init__.py` (see the module docstring)."""
    if "mbridge.core" not in sys.modules:
        spec = importlib.util.find_spec("mbridge")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("mbridge is not installed (scripts/bootstrap installs mbridge==0.15.1)")
        root = spec.submodule_search_locations[0]
        for name, path in (("mbridge", root), ("mbridge.models", os.path.join(root, "models"))):
            package = types.ModuleType(name)
            package.__path__ = [path]
            # a spec as the import system gives a package: find_spec("mbridge") raised on a module without one
            package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            package.__spec__.submodule_search_locations = [path]
            sys.modules[name] = package
    import mbridge.models.deepseek_v3  # noqa: F401  (registers "deepseek_v3")
    from mbridge.core import AutoBridge

    return AutoBridge


def _cpu_modules():
    """The CPU stand-ins for TE's fused modules, under TE's parameter names (module docstring)."""
    import torch.nn.functional as F
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, set_tensor_model_parallel_attributes
    from megatron.core.transformer.module import MegatronModule

    class NormedColumnParallelLinear(ColumnParallelLinear):
        """TELayerNormColumnParallelLinear: RMSNorm (weight `layer_norm_weight`) then the column-parallel GEMM."""

        def __init__(self, input_size, output_size, *, config, **kwargs):
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size, dtype=config.params_dtype))
            self.eps = config.layernorm_epsilon

        def forward(self, x):
            return super().forward(F.rms_norm(x, (x.shape[-1],), self.layer_norm_weight, self.eps))

    class GroupedLinear(torch.nn.Module):
        """TE's grouped GEMM: `weight<i>` per local expert, column- (fc1) or row-sharded (fc2) by expert-TP."""

        def __init__(self, num_gemms, input_size, output_size, *, config, init_method, bias, skip_bias_add,
                     is_expert, tp_comm_buffer_name=None, pg_collection=None, tp_group=None):
            # pg_collection / tp_group: megatron-core 0.16's TEGroupedMLP passes them (NVIDIA/Megatron-LM
            # core_v0.16.0 megatron/core/transformer/moe/experts.py TEGroupedMLP.__init__, linear_fc1 / linear_fc2
            # `pg_collection=pg_collection`); the sharding here reads megatron's global groups, which 0.16 sets up
            # the same way, so they are accepted and not used (issue 46, M2: every rank raised TypeError on the
            # core_r0.16.0 row)
            super().__init__()
            if bias:
                raise ValueError("GroupedLinear: TEGroupedMLP has no bias (add_bias_linear=False)")
            dim = 0 if tp_comm_buffer_name == "fc1" else 1
            shape = [output_size, input_size]
            shape[dim] //= mpu.get_expert_tensor_parallel_world_size()
            self.num_gemms = num_gemms
            for i in range(num_gemms):
                weight = torch.nn.Parameter(torch.empty(*shape, dtype=config.params_dtype))
                init_method(weight)
                set_tensor_model_parallel_attributes(weight, True, dim, 1)
                setattr(self, f"weight{i}", weight)

        def forward(self, x, m_splits):
            parts = torch.split(x, m_splits)
            return torch.cat([part @ getattr(self, f"weight{i}").t() for i, part in enumerate(parts)]), None

    class CoreAttention(MegatronModule):
        """TE DotProductAttention's signature (MLA passes k_channels / v_channels): causal SDPA at `softmax_scale`."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None, **kwargs):
            super().__init__(config=config)
            self.softmax_scale = softmax_scale

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [s, b, h, d] -> [b, h, s, d]
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)

    return NormedColumnParallelLinear, GroupedLinear, CoreAttention


def _cpu_block_spec(config):
    """megatron-core's decoder-block spec (local modules) with TE's fused modules swapped for the CPU ones."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    normed, grouped, core = _cpu_modules()
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    for layer in block.layer_specs:
        sub = layer.submodules
        attn = sub.self_attention.submodules
        attn.linear_q_up_proj, attn.q_layernorm = normed, IdentityOp
        attn.linear_kv_up_proj, attn.kv_layernorm = normed, IdentityOp
        attn.core_attention = core
        if sub.mlp.module is MLP:  # dense: TE fuses pre_mlp_layernorm into linear_fc1
            sub.mlp.submodules.linear_fc1, sub.pre_mlp_layernorm = normed, IdentityOp
        else:
            experts = sub.mlp.submodules.experts
            experts.module, experts.submodules = TEGroupedMLP, MLPSubmodules(linear_fc1=grouped, linear_fc2=grouped)
    return block


def _bridge(model_dir: str):
    """mbridge's DeepseekV3 bridge for the checkpoint's config, with the CPU build's settings."""
    auto_bridge = _load_mbridge()
    from mbridge.core.safetensor_io import SafeTensorIO
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(model_dir)
    rope = getattr(hf_config, "rope_parameters", None)  # transformers 5; 4.x keeps rope_theta / rope_scaling
    if rope:
        hf_config.rope_theta, hf_config.rope_scaling = rope["rope_theta"], dict(rope)  # mbridge-rope-theta
    hf_config.num_nextn_predict_layers = 0  # the MTP layer is not part of the HF model the engines load
    bridge = auto_bridge.from_config(hf_config, dtype=torch.float32)
    bridge.set_extra_args(use_cpu_initialization=True, perform_initialization=True, moe_shared_expert_overlap=False,
                          moe_token_dispatcher_type="allgather", variable_seq_lengths=False, sequence_parallel=False,
                          bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
                          persist_layer_norm=False, attention_backend="local")
    bridge._get_safetensor_io = SafeTensorIO  # fp32 checkpoint (docstring)
    bridge.has_vp_stage = False
    bridge._get_transformer_layer_spec = lambda vp_stage=None: _cpu_block_spec(bridge.config)
    return hf_config, bridge


def _exporter(name: str, bridge, hf_config, model):
    if name == "mbridge":
        return lambda: bridge.export_weights([model])
    from verl.models.mcore.weight_converter import McoreToHFWeightConverterDpskv3
    from verl.utils.megatron_utils import per_tensor_generator

    converter = McoreToHFWeightConverterDpskv3(hf_config, bridge.config)
    # verl 0.9.1 workers/engine/megatron/transformer_impl.py MegatronEngine.__init__: layer_name_mapping
    mapping = {"qkv_layer_name": "self_attention.linear_qkv.", "gate_proj_layer_name": "linear_fc1."}
    return lambda: per_tensor_generator([model], hf_config, converter, bridge.config, mapping)


def _with_index(name: str, pattern: re.Pattern, index: int) -> str:
    return pattern.sub(lambda m: f"{m.group(1)}{index}{m.group(3)}", name, count=1)


def pp_cache_hook_reaches(export_weights) -> None:
    """Refuse the `stale-pp-cache` seed where mbridge's export does not go through the function it hooks. mbridge
    0.15.1's `Bridge.export_weights` (mbridge/core/bridge.py) calls `broadcast_from_megatron_pp`; ISEEKYAN/mbridge
    10cb17f, the NPU rows' pin, rewrote it around `bucketed_pp_broadcast` (mbridge/core/util.py) and the seed
    silently seeded nothing there (issue 46, m2). PyPI's newest mbridge is 0.15.1 (`pip index versions mbridge`):
    10cb17f is a git commit only, which the CPU tier (package registry only) cannot install."""
    import inspect

    if "broadcast_from_megatron_pp(" not in inspect.getsource(export_weights):
        raise ValueError("--bug stale-pp-cache: the installed mbridge's Bridge.export_weights does not call "
                         "broadcast_from_megatron_pp (mbridge 10cb17f broadcasts through bucketed_pp_broadcast): "
                         "the hook would seed nothing; use --exporter verl")


@contextlib.contextmanager
def _seeded(bug: str | None, bridge, layout: Layout, exporter: str = "verl"):
    """`bug` installed in this rank for one series; yields (wrap the exported stream on rank 0, start a sync). The
    module attributes it patches are restored when the series ends: the next series the same ranks send is clean
    (one sender process serves a whole session: `SenderServer`)."""
    import verl.utils.megatron_utils as verl_mu
    from mbridge.core import bridge as mbridge_core

    patched = []

    def patch(owner, name, value):
        patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    try:
        yield _install(bug, bridge, layout, exporter, verl_mu, mbridge_core, patch)
    finally:
        for owner, name, value in reversed(patched):
            setattr(owner, name, value)


def _install(bug, bridge, layout, exporter, verl_mu, mbridge_core, patch):

    def identity(stream):
        return stream

    def new_sync():
        pass

    if bug == "stale-pp-cache":
        if exporter == "mbridge":
            pp_cache_hook_reaches(mbridge_core.Bridge.export_weights)
        cache: dict[int, torch.Tensor] = {}
        calls = [0]

        def cached(real):
            def broadcast(tensor):
                out = real(tensor)  # every rank still joins the collective
                k, calls[0] = calls[0], calls[0] + 1
                if tensor is None:  # a tensor from the other stage: the first sync's values, ever after
                    out.copy_(cache.setdefault(k, out.clone()))
                return out
            return broadcast

        patch(verl_mu, "broadcast_from_megatron_pp", cached(verl_mu.broadcast_from_megatron_pp))
        patch(mbridge_core, "broadcast_from_megatron_pp", cached(mbridge_core.broadcast_from_megatron_pp))
        return identity, lambda: calls.__setitem__(0, 0)
    if bug == "pp-offset-lost":
        patch(verl_mu, "get_transformer_layer_offset", lambda *args, **kwargs: 0)
        real_map = mbridge_core.Bridge._weight_name_mapping_mcore_local_to_global

        def local_names(self, model, consider_ep=True):
            names = real_map(self, model, consider_ep)
            if consider_ep:  # load_weights' map (the import) stays right; export_weights asks with consider_ep=False
                return names
            return {k: _with_index(v, _LAYER, int(_LAYER.search(k).group(2))) if _LAYER.search(k) else v
                    for k, v in names.items()}

        patch(mbridge_core.Bridge, "_weight_name_mapping_mcore_local_to_global", local_names)
        return identity, new_sync
    if bug == "ep-rank0-ids":
        if layout.ep < 2:
            raise ValueError(f"--bug ep-rank0-ids needs expert parallelism: layout {layout} has EP 1")
        per_rank = bridge.config.num_moe_experts // layout.ep

        def rank0_ids(stream):
            for name, tensor in stream:
                m = _EXPERT.search(name)
                yield (_with_index(name, _EXPERT, int(m.group(2)) % per_rank) if m else name), tensor
        return rank0_ids, new_sync
    if bug == "bucket-drops-boundary":
        return identity, new_sync
    if bug is not None:
        raise ValueError(f"--bug {bug!r}: use one of {', '.join(SENDER_BUGS)}")
    return identity, new_sync


def _cpu_verl_platform() -> None:
    """verl's CPU platform in this rank, whatever the host has, before any verl code runs here: the ranks are gloo
    ranks on CPU, and verl allocates where its platform says (verl 0.9.1 verl/utils/megatron_utils.py
    `broadcast_from_megatron_pp`: `torch.empty(..., device=get_device_id())` on a non-owning PP rank, then a
    broadcast over the PP group; `.to(get_device_id())` of the router's expert_bias). On an NPU host verl picks
    its Ascend platform (platform_manager.py `_detect_platform_name`: `huawei` once torch_npu imports) and those
    tensors land on npu:0, which gloo has no backend for: issue 46, B1 (forced before only without an
    accelerator, and only on rank 0). Rehearsed on CPU under harness.engines.verl_npu_stub."""
    from harness.launch.verl_cpu import use_cpu_platform

    use_cpu_platform()


def _rank_setup(rank: int, world: int, store: str) -> None:
    """A CPU gloo rank: one torch thread, megatron's `torch.cuda.current_device` answered with "cpu" where there is
    no CUDA (harness.engines.megatron_probe: the TE-less CPU build), verl's CPU platform (`_cpu_verl_platform`)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    if not torch.cuda.is_available():  # this process only (harness.engines.megatron_probe): TE-less CPU build
        torch.cuda.current_device = lambda: "cpu"
    _cpu_verl_platform()
    # a rank left in a collective by a dead peer gives up in minutes, not gloo's default 30
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))


def _requests(root: Path) -> Iterator[tuple[int, dict]]:
    """The series asked of this sender, in order: `request-<n>.json` as `SenderRun` writes them (atomically: every
    rank reads the same request, so no collective waits between series and none can time out while the session
    runs other tests), until `stop` (written only after every reply is in)."""
    n = 0
    while True:
        if (root / f"request-{n}.json").exists():
            yield n, json.loads((root / f"request-{n}.json").read_text())
            n += 1
        elif (root / "stop").exists():
            return
        else:
            time.sleep(0.05)


def _rank(rank: int, args) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    _rank_setup(rank, WORLD, args.store)
    root, layout = Path(args.socket_dir), None
    for n, request in _requests(root):
        if LAYOUTS[request["layout"]] != layout:  # the process groups of the layout, made again only when it changes
            if layout is not None:
                mpu.destroy_model_parallel()
            layout = LAYOUTS[request["layout"]]
            mpu.initialize_model_parallel(tensor_model_parallel_size=layout.tp,
                                          pipeline_model_parallel_size=layout.pp,
                                          expert_model_parallel_size=layout.ep,
                                          expert_tensor_parallel_size=layout.etp)
        times = _series(rank, n, request, layout, root)
        if rank == 0:
            from harness.io import write_json_atomic

            write_json_atomic(root / f"reply-{n}.json", {"syncs": times, "request": request})
    dist.destroy_process_group()


def _series(rank: int, n: int, request: dict, layout: Layout, root: Path) -> list[dict]:
    """One series: a model built fresh for it (as a new trainer builds it), each sync's checkpoint loaded, exported
    and sent to `ipc://ROOT/series-<n>-sync-<k>.sock`; rank 0's per-sync export and send times."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    exporter, bug = request["exporter"], request["bug"]
    hf_config, bridge = _bridge(request["syncs"][0])
    model = bridge._model_provider([])(pre_process=mpu.is_pipeline_first_stage(),
                                       post_process=mpu.is_pipeline_last_stage())
    export = _exporter(exporter, bridge, hf_config, model)
    times = []
    with _seeded(bug, bridge, layout, exporter) as (wrap, new_sync):
        for k, model_dir in enumerate(request["syncs"]):
            bridge.load_weights([model], model_dir)
            new_sync()
            dist.barrier()
            stream = export()
            if rank != 0:
                for _ in stream:  # the collectives rank 0's export needs
                    pass
            else:
                times.append(_send(wrap(stream), f"ipc://{root}/series-{n}-sync-{k}.sock", request["bucket_mb"],
                                   _sender_class(bug)))
            dist.barrier()
    return times


def _accelerator() -> bool:
    from harness.config.hardware import npu_available

    return torch.cuda.is_available() or npu_available()


def _sender_class(bug: str | None):
    """verl's BucketedWeightSender, or with `bucket-drops-boundary` a subclass whose every bucket but the last
    loses its last tensor when the sender flushes it: the metadata sent at the boundary leaves it out (the real
    packing and boundaries, the bug at the flush)."""
    real = _bucketed_transfer().BucketedWeightSender
    if bug != "bucket-drops-boundary":
        return real

    class DropsAtBoundary(real):
        def _init_socket(self):
            super()._init_socket()
            send = self.socket.send_pyobj

            def send_pyobj(obj, *args, **kwargs):
                if isinstance(obj, dict) and obj.get("is_last") is False and obj.get("bucket_meta"):
                    meta = dict(obj["bucket_meta"])
                    meta.pop(next(reversed(meta)))
                    obj = {**obj, "bucket_meta": meta}
                return send(obj, *args, **kwargs)

            self.socket.send_pyobj = send_pyobj

    return DropsAtBoundary


def _bucketed_transfer():
    """verl 0.9.1 `verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py`, loaded by its file: its package's
    `__init__` imports vLLM (`vllm_rollout.py` -> `verl.third_party.vllm`), which neither end of the transfer uses."""
    name = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
    if not _accelerator():
        from harness.launch.verl_cpu import use_cpu_platform

        use_cpu_platform()
    if name not in sys.modules:
        verl = importlib.util.find_spec("verl")
        path = Path(verl.submodule_search_locations[0]) / "workers/rollout/vllm_rollout/bucketed_weight_transfer.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def _send(stream: Iterator, handle: str, bucket_mb: int, sender_cls) -> dict:
    """Send one sync through `sender_cls` (verl's BucketedWeightSender, shared memory): the time spent producing the
    tensors (export) and the rest from the first tensor on (transfer, which includes waiting for the receiver's
    acknowledgement of each bucket; not the receiver's connect, which waits for the previous sync's checks)."""
    export = [0.0, 0, 0]
    first = []  # when the sender asks for its first tensor: the receiver has connected (its handshake is done)

    def timed():
        it = iter(stream)
        first.append(time.perf_counter())
        while True:
            start = time.perf_counter()
            try:
                name, tensor = next(it)
            except StopIteration:
                return
            export[0] += time.perf_counter() - start
            export[1], export[2] = export[1] + 1, export[2] + tensor.nbytes
            yield name, tensor

    sender = sender_cls(handle, bucket_size_mb=bucket_mb, use_shm=True)
    asyncio.run(sender.async_send_weights(timed()))
    total = time.perf_counter() - (first[0] if first else time.perf_counter())
    return {"export_s": export[0], "send_s": total - export[0], "tensors": export[1], "bytes": export[2]}


def _preload() -> None:
    """What every rank imports (megatron-core, mbridge, transformers, verl, the harness's verl CPU platform),
    imported once here and inherited by the ranks as they fork: spawned ranks each imported it all again (~40 CPU-s
    a rank, 26 of them verl's; 4 ranks on 2 cores were ~50 s of each sender start: issue 43). Fork is safe here as
    torch states it (no device initialised in the parent: verl's import only counts devices, verl 0.9.1
    verl/utils/device.py `is_torch_npu_available`), and the ranks use none (gloo ranks on verl's CPU platform:
    `_rank_setup`). zmq and the process group come in each rank, after the fork."""
    import megatron.core.parallel_state  # noqa: F401
    import megatron.core.transformer.moe.experts  # noqa: F401
    from megatron.core.models.gpt import gpt_layer_specs  # noqa: F401
    from transformers import AutoConfig  # noqa: F401

    _load_mbridge()
    import verl.models.mcore.weight_converter  # noqa: F401
    import verl.utils.megatron_utils  # noqa: F401

    import harness.launch.verl_cpu  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(prog="python -m harness.launch.megatron_sender",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--socket-dir", required=True, help="where the requests, replies and sockets are")
    args = parser.parse_args(argv)
    owner = os.getppid()
    with tempfile.TemporaryDirectory(prefix="harness-sender-") as tmp:
        args.store = os.path.join(tmp, "store")
        _preload()
        ranks = mp.start_processes(_rank, args=(args,), nprocs=WORLD, join=False, start_method="fork")
        try:
            while not ranks.join(timeout=1):
                if os.getppid() != owner:  # the receiver is gone (a killed session): no ranks left polling
                    for process in ranks.processes:
                        process.kill()
                    return 3
        except Exception as exc:  # one line back to the receiver: the failing rank's own error (its traceback's last
            from harness.io import write_json_atomic  # line), not the wrapper's; the traceback goes to the log

            print(exc, file=sys.stderr)

            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()] or [type(exc).__name__]
            write_json_atomic(Path(args.socket_dir) / "error.json", {"error": lines[-1][:500]})
            return 3
    return 0


# ------------------------------------------------------------------ the receiving side (this process)
@dataclass
class Received:
    """One sync as it arrived: (name, tensor copy, bucket index) in arrival order, the buckets, what the engine
    refused (None: it took every bucket), and the receiver's phase times."""

    tensors: list[tuple[str, torch.Tensor, int]]
    buckets: int
    refused: str | None
    load_s: float
    finalize_s: float


class SenderServer:
    """One sender process (its four ranks) for many series: the ranks start, import the stack and join their
    process group once, then send each `SenderRun`'s series as it asks (a model built fresh per series, the
    process groups made again when the layout changes). Started on the first series; a series that fails kills it
    (its ranks may be left mid-sync) and the next one starts a new process. Start-up was ~85 of the ~100 s each
    sender case took on a 2-core EPYC (issue 43: the suites beside the verl run outlasted it)."""

    def __init__(self, *, env: dict[str, str] | None = None):
        self.env = dict(env or {})  # over this process's environment (the platform stub: --platform-stub npu)
        self._tmp = None
        self._proc = None
        self._log = None
        self._series = 0

    @property
    def root(self) -> Path:
        return Path(self._tmp.name)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def request(self, request: dict) -> int:
        """Ask for one series (starting the process if none runs); its number."""
        from harness.io import write_json_atomic

        if not self.alive():
            self._start()
        n, self._series = self._series, self._series + 1
        write_json_atomic(self.root / f"request-{n}.json", request)
        return n

    def reply(self, n: int, timeout_s: float) -> dict:
        """Series n's reply (rank 0 writes it after the series' last barrier)."""
        from harness.errors import HarnessError

        path = self.root / f"reply-{n}.json"
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if not self.alive():
                raise HarnessError(f"Megatron sender: {self.error()}")
            if time.monotonic() > deadline:
                raise HarnessError(f"Megatron sender: series {n + 1} not finished in {timeout_s:.0f} s")
            time.sleep(0.05)
        return json.loads(path.read_text())

    def _start(self) -> None:
        self.close(kill=True)
        self._tmp = tempfile.TemporaryDirectory(prefix="harness-sync-")
        self._series = 0
        self._log = (self.root / "sender.log").open("w")
        # its own session: the four ranks it spawns go with it (os.killpg) whatever state they are in
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, "--socket-dir", str(self.root)],
                                      stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**os.environ, **self.env})

    def error(self) -> str:
        """The sender's one-line error, or its exit code and the last line of its log (the log goes with the
        server's temporary directory)."""
        with contextlib.suppress(OSError, ValueError):
            error = json.loads((self.root / "error.json").read_text()).get("error")
            if error:
                return error
        self._log.flush()
        tail = [ln for ln in (self.root / "sender.log").read_text(errors="replace").splitlines() if ln.strip()][-1:]
        return f"exited {self._proc.returncode}" + (f"; its log ends: {tail[0][:300]}" if tail else "")

    def close(self, kill: bool = False) -> None:
        """Stop the process (after its last reply: `stop`; `kill`: now, its ranks wherever they are)."""
        from harness.errors import HarnessError

        if self._proc is None:
            return
        try:
            if not kill:
                (self.root / "stop").touch()
            try:
                code = self._proc.wait(timeout=5 if kill else 60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                code = self._proc.wait()
            if not kill and code != 0:
                raise HarnessError(f"Megatron sender: {self.error()}")
        finally:
            self._log.close()
            self._tmp.cleanup()
            self._proc = None

    def __enter__(self) -> SenderServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close(kill=exc[0] is not None)


class SenderRun:
    """One series of syncs from a sender process (`server`, shared; without it one of its own, stopped at the
    end); `receive(engine)` takes the next sync into `engine` through verl's BucketedWeightReceiver, bucket by
    bucket into `engine.load_weights`, then `engine.finish_sync()`."""

    def __init__(self, syncs: list[Path], *, exporter: str = "verl", layout: str = "tp1-pp2-ep2",
                 bug: str | None = None, bucket_mb: int = 1, timeout_s: float = 300.0,
                 env: dict[str, str] | None = None, server: SenderServer | None = None):
        from harness.errors import BadInput

        for what, value, known in (("exporter", exporter, EXPORTERS), ("layout", layout, LAYOUTS),
                                   ("bug", bug, (None, *SENDER_BUGS))):
            if value not in known:  # here, not in the sender's ranks: a bad request would stop its process
                raise BadInput(f"Megatron sender: {what} {value!r}: use one of {', '.join(map(str, known))}")
        self.syncs, self.exporter, self.layout, self.bug = list(syncs), exporter, layout, bug
        self.bucket_mb, self.timeout_s = bucket_mb, timeout_s
        self._own = server is None
        self.server = SenderServer(env=env) if server is None else server
        self._next = 0
        self._series = None
        self.phases: list[dict] = []

    def __enter__(self) -> SenderRun:
        self._series = self.server.request({"syncs": [str(d) for d in self.syncs], "layout": self.layout,
                                            "exporter": self.exporter, "bug": self.bug,
                                            "bucket_mb": self.bucket_mb})
        return self

    def receive(self, engine) -> Received:
        from harness.errors import HarnessError
        from harness.mla.sync import one_shot

        if self._next >= len(self.syncs):
            raise HarnessError(f"sender: all {len(self.syncs)} syncs were received already")
        got: list[tuple[str, torch.Tensor, int]] = []
        state = {"buckets": 0, "refused": None, "load_s": 0.0}

        def on_bucket(bucket, is_last):
            index = state["buckets"]
            state["buckets"] += 1
            # copies, not views into the shared-memory bucket the receiver reuses: vLLM's layerwise reload holds a
            # layer's tensors until the layer is complete (as harness.launch.verl_rollout's extension copies)
            copies = [(name, tensor.clone()) for name, tensor in bucket]
            got.extend((name, tensor, index) for name, tensor in copies)
            if state["refused"] is None:
                start = time.perf_counter()
                try:
                    engine.load_weights(one_shot(copies))
                except Exception as exc:  # recorded: the stream is still drained and judged
                    state["refused"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                state["load_s"] += time.perf_counter() - start

        handle = f"ipc://{self.server.root}/series-{self._series}-sync-{self._next}.sock"
        failure: list[BaseException] = []

        def run():
            try:
                receiver = _bucketed_transfer().BucketedWeightReceiver(handle, device=torch.device("cpu"), use_shm=True)
                receiver.receive_weights(on_bucket)
            except BaseException as exc:  # noqa: BLE001 -- reported by the waiting thread
                failure.append(exc)

        thread = threading.Thread(target=run, daemon=True, name="sync-receiver")
        thread.start()
        deadline = time.monotonic() + self.timeout_s
        while True:
            thread.join(0.2)
            if not thread.is_alive():
                break
            if not self.server.alive():  # gone while this sync is still owed: failed, or exited early
                raise HarnessError(f"Megatron sender ({self.exporter}, {self.layout}) stopped at sync "
                                   f"{self._next + 1}: {self.server.error()}")
            if time.monotonic() > deadline:
                raise HarnessError(f"Megatron sender: sync {self._next + 1} not received in {self.timeout_s:.0f} s")
        if failure:
            raise HarnessError(f"receiving sync {self._next + 1}: {type(failure[0]).__name__}: {failure[0]}")
        start = time.perf_counter()
        if state["refused"] is None:
            engine.finish_sync()
        finalize_s = time.perf_counter() - start
        self._next += 1
        return Received(tensors=got, buckets=state["buckets"], refused=state["refused"], load_s=state["load_s"],
                        finalize_s=finalize_s)

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # the ranks may be mid-sync, waiting for a receiver that is gone
            self.server.close(kill=True)
            return
        try:
            self.phases = self.server.reply(self._series, self.timeout_s)["syncs"]
        except BaseException:
            self.server.close(kill=True)
            raise
        if self._own:
            self.server.close()


@dataclass(frozen=True)
class SyncRefused:
    """The engine under test raised while loading a sync's buckets (the rest of the stream was still drained)."""

    engine: str
    error: str
    ok: bool = False

    def message(self) -> str:
        return f"{self.engine} refused the sync: {self.error}"

    def findings(self):
        from harness.findings import Finding

        return (Finding("sync.engine_load", "load_weights", "-", self.message()),)


@dataclass
class SeriesResult:
    """The checks of a sync series (harness.mla.checks.AtSync each), one log row per sync, and what arrived (its
    phase times join the sender's once it has exited: `phases`)."""

    results: list
    log: list[dict]
    received: list[Received]

    def phases(self, sender: SenderRun) -> list[dict[str, float]]:
        return [phase_times(sent, got) for sent, got in zip(sender.phases, self.received, strict=True)]


def run_series(engine, sender: SenderRun, truths: list[dict[str, torch.Tensor]], goldens: list, *,
               prompts: list[list[int]], max_tokens: int, sleep_level: int = 2) -> SeriesResult:
    """Take every sync of `sender` into `engine` (built dummy or on other weights), sleeping and waking the engine
    between syncs where it supports sleep mode (level 2 discards its weights: verl#7086's setting), and judge each
    sync: the stream against the trainer's weights (harness.mla.stream), what the engine refused, greedy tokens and
    full log-probs against `goldens` (rollouts of engines built fresh on each sync's weights), W_UK_T / W_UV
    against the current kv_b_proj, and every exposed weight against the trainer's."""
    from harness.mla.checks import AtSync, SyncBehaviour, check_freshness, check_integrity
    from harness.mla.stream import check_stream

    results, log, received = [], [], []
    name, dtype = engine.name, engine.dtype
    previous = [{layer.layer: layer.kv_b_proj.detach().cpu().clone() for layer in engine.mla_layers()}]
    for k, (truth, golden) in enumerate(zip(truths, goldens, strict=True), 1):
        at = f"sync {k}/{len(truths)} ({sender.exporter}, {sender.layout}"
        pre = engine.sample(prompts, max_tokens, full_logprobs=True)
        slept = k > 1 and engine.supports_sleep
        if slept:
            engine.sleep(level=sleep_level)
            engine.wake_up()
        at += f", after sleep level {sleep_level} / wake)" if slept else ")"
        got = sender.receive(engine)
        received.append(got)
        stream = check_stream(f"{sender.exporter} {sender.layout}", k, [(n, t) for n, t, _ in got.tensors],
                              got.buckets, truth, truths[:k - 1])
        checks = [stream] + ([SyncRefused(name, got.refused)] if got.refused else [])
        post = engine.sample(prompts, max_tokens, full_logprobs=True)
        checks.append(SyncBehaviour.of_rollouts(name, pre, post, golden, dtype, "Megatron sync"))
        checks.append(check_freshness(name, engine.mla_layers(), engine.spec, dtype, previous))
        exposed = engine.synced_weights()
        if exposed is not None:
            checks.append(check_integrity(name, exposed, truth, dtype))
        previous.append({layer.layer: layer.kv_b_proj.detach().cpu().clone() for layer in engine.mla_layers()})
        results += [AtSync(at, c) for c in checks]
        log.append({"sync": at, "buckets": got.buckets, "tensors": len(got.tensors), "stream_ok": stream.ok,
                    "refused": got.refused, "checks_ok": all(c.ok for c in checks)})
    return SeriesResult(results=results, log=log, received=received)


def phase_times(sent: dict, received: Received) -> dict[str, float]:
    """Seconds per phase (harness.config.platforms SYNC_PHASES) of one sync: export (the exporter producing
    tensors), transfer (packing, shared memory and ZMQ: the sender's send time less the receiver's loading, which
    it waits for), load (the engine's load_weights over the buckets), finalize (its finish_sync: re-derivation,
    layerwise-reload finalize)."""
    return {"export": sent["export_s"], "transfer": max(sent["send_s"] - received.load_s, 0.0),
            "load": received.load_s, "finalize": received.finalize_s}


if __name__ == "__main__":
    sys.exit(main())
