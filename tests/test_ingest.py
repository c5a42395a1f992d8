"""Self-tests of harness.metrics.ingest on logs written by verl's own writers (FileLogger, console
LocalLogger, the TensorBoard adapter's SummaryWriter) and on broken copies of them: truncated, corrupt,
resumed, duplicate steps, NaN. Each broken input must produce a message naming file:line."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from harness.errors import BadInput
from harness.metrics.ingest import load_run

METRICS = ("critic/rewards/mean", "response_length/mean", "actor/pg_loss")


def _data(step: int) -> dict:
    # numpy 2 scalars, as verl's reduce_metrics returns them (console prints np.float64(x))
    return {k: np.float64(0.01 * step + i) for i, k in enumerate(METRICS)} | {"timing_s/step": np.float64(1.5)}


def write_filelogger(path, steps, monkeypatch):
    from verl.utils.tracking import FileLogger

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger("proj", "exp")
    for step in steps:
        logger.log(_data(step), step)
    logger.finish()
    return path


def write_console(path, steps, prefix="(TaskRunner pid=1) "):
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    lines = ["INFO launching", *(prefix + concat_dict_to_str(_data(s), step=s) for s in steps)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_filelogger_roundtrip(tmp_path, monkeypatch):
    run = load_run(write_filelogger(tmp_path / "m.jsonl", range(1, 6), monkeypatch))
    assert run["critic/rewards/mean"].steps == (1, 2, 3, 4, 5)
    assert run["actor/pg_loss"].values[2] == pytest.approx(2.03)
    assert run.meta.warnings == ()


def test_console_numpy2_scalars(tmp_path):
    path = write_console(tmp_path / "train.log", range(1, 4))
    assert "np.float64(" in path.read_text()  # the numpy 2 repr this parser must handle
    run = load_run(path)
    assert run["response_length/mean"].values == pytest.approx((1.01, 1.02, 1.03))
    assert run["timing_s/step"].steps == (1, 2, 3)


def test_tensorboard(tmp_path):
    from torch.utils.tensorboard import SummaryWriter  # what verl's _TensorboardAdapter uses

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(1, 5):
        for key, value in _data(step).items():
            writer.add_scalar(key, value, step)
    writer.close()
    run = load_run(tmp_path / "tb")
    assert run["critic/rewards/mean"].steps == (1, 2, 3, 4)
    (event_file,) = (tmp_path / "tb").iterdir()
    event_file.write_bytes(event_file.read_bytes()[:-5])
    with pytest.raises(BadInput, match=r"tfevents.*:byte\d+: truncated last record"):
        load_run(event_file)
    lenient = load_run(event_file, strict=False)
    # only the last record (step 4's last scalar, timing_s/step) is cut; everything before it is kept
    assert lenient["critic/rewards/mean"].steps == (1, 2, 3, 4) and lenient["timing_s/step"].steps == (1, 2, 3)
    assert any("truncated" in w for w in lenient.meta.warnings)


def test_wandb_ui_export(tmp_path):
    path = tmp_path / "wandb.csv"
    path.write_text('"Step","dapo-1 - critic/rewards/mean","dapo-1 - critic/rewards/mean__MIN",'
                    '"dapo-1 - critic/rewards/mean__MAX","dapo-1 - actor/pg_loss"\n'
                    '1,-0.9,-0.9,-0.9,0.1\n2,-0.8,-0.8,-0.8,\n3,-0.7,-0.7,-0.7,0.3\n')
    run = load_run(path)
    assert run["critic/rewards/mean"].values == (-0.9, -0.8, -0.7)
    assert run["actor/pg_loss"].steps == (1, 3)  # empty cell: not logged at step 2
    path.write_text("_step,a - x,b - x\n1,1,2\n")
    with pytest.raises(BadInput, match="holds 2 runs"):
        load_run(path)


def test_truncated_last_line_names_file_and_line(tmp_path, monkeypatch):
    path = write_filelogger(tmp_path / "m.jsonl", range(1, 6), monkeypatch)
    path.write_bytes(path.read_bytes()[:-20])  # killed mid-write
    with pytest.raises(BadInput, match=r"m\.jsonl:5: truncated last record"):
        load_run(path)
    run = load_run(path, strict=False)
    assert run["critic/rewards/mean"].steps == (1, 2, 3, 4)
    assert [w for w in run.meta.warnings if "m.jsonl:5" in w]


def test_corrupt_line(tmp_path, monkeypatch):
    path = write_filelogger(tmp_path / "m.jsonl", range(1, 4), monkeypatch)
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:30] + "#garbage"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInput, match=r"m\.jsonl:2: corrupt line"):
        load_run(path)
    assert load_run(path, strict=False)["actor/pg_loss"].steps == (1, 3)


def test_console_corrupt_value(tmp_path):
    path = write_console(tmp_path / "train.log", range(1, 3))
    path.write_text(path.read_text().replace("actor/pg_loss:np.float64(2.01)", "actor/pg_loss:np.float64(2.0#"))
    with pytest.raises(BadInput, match=r"train\.log:2: corrupt metrics line at 'actor/pg_loss"):
        load_run(path)


def test_nan_is_kept_and_reported(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    from verl.utils.tracking import FileLogger

    logger = FileLogger("p", "e")
    logger.log({"actor/grad_norm": np.float64(1.0)}, 1)
    logger.log({"actor/grad_norm": np.float64("nan")}, 2)  # orjson writes null
    logger.finish()
    run = load_run(path)
    assert math.isnan(run["actor/grad_norm"].values[1]) and not run["actor/grad_norm"].finite
    assert any("m.jsonl:2: actor/grad_norm is null" in w for w in run.meta.warnings)


def test_duplicate_step(tmp_path):
    path = write_console(tmp_path / "train.log", [1, 2, 2, 3])
    with pytest.raises(BadInput, match=r"train\.log:4: duplicate step 2 \(also at .*train\.log:3\)"):
        load_run(path)
    assert load_run(path, strict=False)["critic/rewards/mean"].steps == (1, 2, 3)


def test_resumed_run_two_files_and_truncated_first_segment(tmp_path, monkeypatch):
    # verl reopens the FileLogger with "wb" on resume: the user keeps the old file as a segment.
    first = write_filelogger(tmp_path / "seg1.jsonl", range(1, 11), monkeypatch)
    first.write_bytes(first.read_bytes()[:-10])  # killed mid-line at step 10
    second = write_filelogger(tmp_path / "seg2.jsonl", range(8, 16), monkeypatch)
    run = load_run(second, first)  # any order
    assert run["critic/rewards/mean"].steps == tuple(range(1, 16))
    assert run["critic/rewards/mean"].as_dict()[9] == pytest.approx(0.09)
    warnings = "\n".join(run.meta.warnings)
    assert "seg1.jsonl:10: truncated" in warnings and "seg2.jsonl:1: resumed run: steps 8..9" in warnings
    assert load_run(tmp_path)["critic/rewards/mean"].steps == tuple(range(1, 16))  # the directory


def test_resumed_console_segments_in_one_file(tmp_path):
    path = write_console(tmp_path / "train.log", [*range(1, 7), *range(5, 9)])
    run = load_run(path)
    assert run["critic/rewards/mean"].steps == tuple(range(1, 9))
    assert any("train.log:8: resumed run: steps 5..6" in w for w in run.meta.warnings)


def test_two_different_runs_refused(tmp_path, monkeypatch):
    a = write_filelogger(tmp_path / "a.jsonl", range(1, 4), monkeypatch)
    b = write_filelogger(tmp_path / "b.jsonl", range(1, 4), monkeypatch)
    with pytest.raises(BadInput, match="starts at step 1 like"):
        load_run(a, b)


def test_bad_paths(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        load_run(tmp_path / "missing.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="no verl logs"):
        load_run(tmp_path / "empty")


def test_meta_json_beside_logs(tmp_path, monkeypatch):
    write_filelogger(tmp_path / "m.jsonl", range(1, 3), monkeypatch)
    (tmp_path / "meta.json").write_text('{"name": "lab-s0", "scale": "tiny", "hardware": "cpu", '
                                        '"versions": {"verl": "0.9.1"}, "seed": 0}')
    # not metrics: verl's trainer.rollout_data_dir generation dumps and config files
    (tmp_path / "rollout_data").mkdir()
    (tmp_path / "rollout_data" / "1.jsonl").write_text('{"input": "1+1=", "output": "2", "score": 1.0, "step": 1}\n')
    (tmp_path / "config.json").write_text('{"trainer": {}}')
    run = load_run(tmp_path)
    assert (run.name, run.meta.scale, run.meta.versions["verl"], run.meta.extra["seed"]) == ("lab-s0", "tiny",
                                                                                             "0.9.1", 0)
    assert os.path.basename(run.meta.sources[0]) == "m.jsonl"
