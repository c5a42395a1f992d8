"""Rollout engines behind one interface (`base.Engine`): `reference` (pure torch, numeric golden),
`vllm` (real vLLM / vllm-ascend, imported lazily), and user engines through `--engine module:factory`."""
from harness.engines.base import Engine, MLALayer, Rollout, load_factory

# read the launch environment (isolation.LAUNCH_ENV) before any engine can write into it
from harness.engines import isolation  # noqa: E402,F401  isort: skip

__all__ = ["Engine", "MLALayer", "Rollout", "load_factory"]
