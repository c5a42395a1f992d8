"""Applies HARNESS_CPU_ISA at the start of every Python process that has this directory on PYTHONPATH.

vLLM CPU picks its kernel library when it is first imported (vllm/_custom_ops.py `import_kernels`), and in a Ray
actor it starts its EngineCore and worker processes with `spawn` (vllm/utils/system_utils.py
`_maybe_force_spawn`): fresh interpreters that import vLLM before any harness code runs. Interpreter start is
the one hook every such process passes, so harness.config.host.kernel_env puts this directory on the job's
PYTHONPATH while a mask is in force. A venv's own sitecustomize would be shadowed; the CPU tier's has none.
"""
import os

if os.environ.get("HARNESS_CPU_ISA"):
    from harness.config.host import apply_isa_mask

    apply_isa_mask()
