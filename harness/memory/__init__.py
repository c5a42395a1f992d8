"""Memory verdicts at real 671B shapes on CPU: an analytic per-phase model (`model`) and a fake-tensor
peak tracer over real HF DeepseekV3 modules (`tracer`, `prefill`); `cli` adds `ascend-rl-harness memory`."""
from harness.memory.model import PHASES, MemoryOptions, PhaseMemory, plan_memory

__all__ = ["PHASES", "MemoryOptions", "PhaseMemory", "plan_memory"]
