"""harness.launch.startup reads a verl job log's milestones into phases: on a log shaped like verl 0.9.1's, in
order, and a log that never reached a milestone is one line naming it."""
from __future__ import annotations

import pytest

from harness.errors import BadInput
from harness.launch.startup import FIRST_STEP, MILESTONES, startup_phases

LINES = [
    "2026-12-01 21:36:57,614\tINFO job_manager.py:581 -- Runtime env is setting up.",
    "2026-12-01 21:37:11,567\tINFO worker.py:2029 -- Connected to Ray cluster. View the dashboard at http://x",
    "(TaskRunnerV1 pid=583) INFO:2026-12-01 21:37:19,833:Platform override from VERL_PLATFORM: cpu",
    "(TaskRunnerV1 pid=583) INFO:2026-12-01 21:37:29,265:create worker group dict_keys(['actor_rollout'])",
    "(WorkerDict pid=700) INFO:2026-12-01 21:37:41,720:actor and ref model engine initialized",
    "(vLLMHttpServer pid=870) INFO:2026-12-01 21:37:58,697:Platform override from VERL_PLATFORM: cpu",
    "(TaskRunnerV1 pid=583) INFO:2026-12-01 21:38:24,320:all initialize finished, ready to fit",
    "(TaskRunnerV1 pid=583) INFO:2026-12-01 21:38:25,378:update_weights done, time cost: 1.01s",
]


def test_phases_follow_the_milestones(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("\n".join(["noise without a stamp", *LINES]))
    phases = startup_phases(log, first_step_s=25.6)
    assert [p.name for p in phases] == [name for name, _ in MILESTONES[1:]] + [FIRST_STEP]
    assert [p.seconds for p in phases] == [13.953, 8.266, 9.432, 12.455, 16.977, 25.623, 1.058, 25.6]


def test_a_log_that_stops_early_names_the_missing_milestone(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("\n".join(LINES[:5]))
    with pytest.raises(BadInput, match="no 'vLLM server actor start' milestone"):
        startup_phases(log)
    with pytest.raises(BadInput, match="cannot read the job log"):
        startup_phases(tmp_path / "absent.log")


def test_a_prepared_tiny_run_directory_is_not_prepared_twice(tmp_path):
    """`launch --local` prepares the tiny inputs while its Ray cluster starts; the job's own prepare step then
    finds them done for the same seed/steps/fault (and redoes them for another)."""
    from harness.launch.tiny_verl import model_dir, prepare

    prepare(tmp_path, seed=3, steps=2)
    weights = model_dir(tmp_path) / "model.safetensors"
    written = weights.stat().st_mtime_ns
    prepare(tmp_path, seed=3, steps=2)
    assert weights.stat().st_mtime_ns == written
    prepare(tmp_path, seed=4, steps=2)
    assert weights.stat().st_mtime_ns != written
