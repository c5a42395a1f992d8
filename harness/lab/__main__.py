"""`python -m harness.lab --steps N --seed S --fault F --out DIR` is `ascend-rl-harness lab ...`
(harness/cli/lab_cmd.py), kept under this name as the Ray job entry point. Run by module name, not imported:
harness.lab sits below harness.cli in the import layers (pyproject.toml)."""
import runpy
import sys

if __name__ == "__main__":
    sys.argv[1:1] = ["lab"]
    runpy.run_module("harness.cli", run_name="__main__", alter_sys=True)
