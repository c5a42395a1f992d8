"""Runs and metrics: ingest verl logs into `Run`s, throughput per card, baselines."""
from harness.metrics.run import Run, Series

__all__ = ["Run", "Series"]
