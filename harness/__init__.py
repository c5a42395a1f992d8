"""ascend-rl-harness: test harness and benchmark suite for DeepSeek-V3/R1 RL on Ascend NPUs."""

__version__ = "0.1.0"
