"""Checks on what a run leaves on disk: checkpoints and resume (`checkpoint`: mbridge's save rule, optimizer
state round trips, FileLogger truncation) and rollout dumps replayed across platforms (`replay`, verl's
RolloutSkip layout)."""
