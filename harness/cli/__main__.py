"""`python -m harness.cli ...`: the same as the `ascend-rl-harness` script (the launcher re-executes itself so)."""
import sys

from harness.cli import main

sys.exit(main())
