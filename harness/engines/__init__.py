"""Rollout engines behind one interface (`base.Engine`): `reference` (pure torch, numeric golden),
`vllm` (real vLLM / vllm-ascend, imported lazily), and user engines through `--engine module:factory`."""
from harness.engines.base import Engine, MLALayer, Rollout, load_factory

__all__ = ["Engine", "MLALayer", "Rollout", "load_factory"]
