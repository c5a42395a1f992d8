"""Memory verdicts at real 671B shapes on CPU: an analytic per-phase model (`phases`) and a fake-tensor
peak tracer over real HF DeepseekV3 modules (`tracer`, `prefill`); measured memory of a real device and the
sleep-mode release check (`device`). The `memory` command is harness.cli.memory_cmd."""
from harness.memory.phases import PHASES, MemoryOptions, PhaseMemory, plan_memory

__all__ = ["PHASES", "MemoryOptions", "PhaseMemory", "plan_memory"]
