"""Runs and their metrics: verl's keys and run-dir file names (`keys`), the typed Run (`run`), ingest of verl
logs (`ingest`), golden baselines (`baseline`), curve alignment (`curves`) and throughput per card
(`throughput`). Suites never parse logs themselves: ingest -> Run -> checker."""
from harness.metrics.run import Run, Series

__all__ = ["Run", "Series"]
