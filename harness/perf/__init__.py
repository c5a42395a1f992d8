"""Phase model of one RL step: the seconds of each phase and the TPS/card a plan should deliver (harness.perf.model)."""
