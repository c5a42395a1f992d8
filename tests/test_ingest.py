"""Self-tests of harness.metrics.ingest on logs written by verl's own writers (FileLogger, console
LocalLogger through Ray's driver printing, the TensorBoard adapter's SummaryWriter) and on broken copies of
them: truncated, corrupt, resumed, duplicate steps, NaN, wrapped lines, appended notes, values that are not
numbers, bad CSV bytes and cells, bad meta.json. Each broken input must produce a message naming file:line;
lenient ingest keeps the good pairs of a bad line and counts what it skipped."""
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
    with pytest.raises(BadInput, match=r"train\.log:2: corrupt metrics pair 'actor/pg_loss"):
        load_run(path)
    lenient = load_run(path, strict=False)  # the good pairs of the bad line are kept
    assert lenient["critic/rewards/mean"].steps == (1, 2) and lenient["actor/pg_loss"].steps == (2,)
    assert (lenient.meta.skipped_lines, lenient.meta.skipped_pairs) == (0, 1)
    assert "lenient ingest skipped 0 lines and 1 key:value pairs" in lenient.meta.warnings[-1]


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


# ---------------------------------------------------------------- real-world verl log shapes (tests/verl_logs.py)
def test_ray_prefixed_coloured_console_of_a_resumed_run(tmp_path):
    from verl_logs import KEYS, step_metrics, write_console_log

    path = write_console_log(tmp_path / "driver.log", range(101, 116))
    text = path.read_text()
    assert "\x1b[36m(TaskRunner pid=2787)\x1b[0m step:101 - " in text and "np.float64(" in text
    run = load_run(path)
    assert run["critic/rewards/mean"].steps == tuple(range(101, 116)) and set(run.series) == set(KEYS)
    assert all(run[k].as_dict()[s] == float(v) for s in range(101, 116) for k, v in step_metrics(s).items())
    assert run.meta.warnings == ()


@pytest.mark.parametrize("width", [41, 80, 97, 120, 200])
def test_lines_wrapped_mid_key_are_joined_and_notes_ignored(tmp_path, width):
    from verl_logs import step_metrics, write_console_log

    path = write_console_log(tmp_path / "pasted.log", range(101, 106), wrap_width=width,
                             note={103: "   <-- reward jumps here (rerun after OOM)"})
    assert any(len(line) == width for line in path.read_text().splitlines())
    run = load_run(path)
    assert all(run[k].as_dict()[s] == float(v) for s in range(101, 106) for k, v in step_metrics(s).items())
    warnings = "\n".join(run.meta.warnings)
    assert "wrapped over" in warnings and "pasted.log:" in warnings
    assert "text after the last value ignored: '<-- reward jumps" in warnings  # (its own wrapped tail is not metrics)


def test_lenient_keeps_the_good_pairs_of_a_bad_line_and_counts_what_it_skipped(tmp_path):
    from verl_logs import console_line

    good = [console_line(s) for s in (1, 2, 3)]
    lines = [good[0], good[1].replace("actor/pg_loss:np.float64(0.002)", "actor/pg_loss:np.float64(0.0#"),
             good[2].replace("timing_s/step:12.5", "timing_s/step:n/a"), "step:x - broken", good[2]]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInput, match=r"train\.log:2: corrupt metrics pair 'actor/pg_loss"):
        load_run(path)
    run = load_run(path, strict=False)
    assert run["critic/rewards/mean"].steps == (1, 2, 3) and run["actor/pg_loss"].steps == (1, 3)
    assert len(run["response_length/mean"]) == 3  # 6 good pairs of each bad line kept, not dropped with the line
    assert (run.meta.skipped_lines, run.meta.skipped_pairs) == (1, 2)  # the duplicate step 3; two bad pairs
    assert run.meta.warnings[-1].startswith("lenient ingest skipped 1 lines and 2 key:value pairs")


def test_verl_nightly_baseline_summary(tmp_path):
    from harness.metrics.ingest import is_summary_file, load_summary

    path = tmp_path / "baseline_ppo_qwen3-8b_fsdp_npu.txt"
    path.write_text("# mean of steps 5-14\ncritic/rewards/mean: 0.6125\nperf/throughput: 1234.5\n"
                    "timing_s/step: 88.1\n")
    assert is_summary_file(path) and not is_summary_file(write_console(tmp_path / "train.log", range(1, 3)))
    summary = load_summary(path)
    assert summary.values == {"critic/rewards/mean": 0.6125, "perf/throughput": 1234.5, "timing_s/step": 88.1}
    assert summary.window == (5, 14) and "verl Ascend nightly" in summary.statistic
    with pytest.raises(BadInput, match="nightly baseline summary.*pass it as the BASELINE"):
        load_run(path)
    path.write_text("critic/rewards/mean: 0.6\ncritic/rewards/mean: 0.7\n")
    with pytest.raises(BadInput, match=r"\.txt:2: 'critic/rewards/mean' appears twice"):
        load_summary(path)


def test_device_named_in_a_console_log_is_remembered(tmp_path):
    path = tmp_path / "job.log"
    path.write_text("| 0     910B3               | OK            | 95.7        45                0    / 0 |\n"
                    + write_console(tmp_path / "x.log", range(1, 3)).read_text())
    assert load_run(path).meta.hardware_in_logs == {"a2": f"{path}:1"}


# ---------------------------------------------------------------- bad input: one line naming file:line
@pytest.mark.parametrize("line, match", [
    ('{"step": 1, "data": {"a": 1' + "0" * 400 + "}}", r"m\.jsonl:1: a is 1000.*too big for a float"),
    ('{"step": Infinity, "data": {"a": 1.0}}', r"m\.jsonl:1: corrupt line"),
    ('{"step": 1e400, "data": {"a": 1.0}}', r"m\.jsonl:1: corrupt line"),
    ('{"step": true, "data": {"a": 1.0}}', r"m\.jsonl:1: corrupt line.*step must be an integer"),
    ('{"step": 1, "data": {"a": true}}', r"m\.jsonl:1: a is bool 'True', not a number"),
    ('[1, 2]', r"m\.jsonl:1: corrupt line"),
])
def test_filelogger_values_that_are_not_numbers(tmp_path, line, match):
    path = tmp_path / "m.jsonl"
    path.write_text(line + "\n" + '{"step": 2, "data": {"a": 2.0}}\n')
    with pytest.raises(BadInput, match=match):
        load_run(path)
    assert load_run(path, strict=False)["a"].as_dict()[2] == 2.0


def test_csv_bad_bytes_huge_cells_duplicate_columns_and_bad_steps(tmp_path):
    path = tmp_path / "export.csv"
    path.write_bytes(b"_step,loss\n1,0.5\n2,\xff\xfe\n")
    with pytest.raises(BadInput, match=r"export\.csv:3: bytes that are not UTF-8"):
        load_run(path)
    path.write_text("_step,loss\n1,0.5\n2," + "9" * 200_000 + "\n")
    with pytest.raises(BadInput, match=r"export\.csv:3: unreadable CSV row \(field larger than field limit"):
        load_run(path)
    path.write_text("Step,run - loss,run - loss\n1,0.5,0.6\n")
    with pytest.raises(BadInput, match=r"export\.csv:1: column 'loss' appears twice \(columns 2 and 3\)"):
        load_run(path)
    for step in ("inf", "1e400", "1.5", "-2"):
        path.write_text(f"_step,loss\n{step},0.5\n3,0.7\n")
        with pytest.raises(BadInput, match=r"export\.csv:2: step .* is not a whole number"):
            load_run(path)


def test_csv_that_is_not_a_wandb_export_is_read_with_a_warning(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,critic/rewards/mean\n1,0.1\n2,0.2\n")
    run = load_run(path)
    assert run["critic/rewards/mean"].values == (0.1, 0.2)
    assert any("metrics.csv:1: not a wandb export" in w for w in run.meta.warnings)
    path.write_text("_step,_runtime,critic/rewards/mean\n1,3.0,0.1\n")
    assert load_run(path).meta.warnings == ()


def test_steps_out_of_order_in_one_file_are_merged_with_a_warning(tmp_path, monkeypatch):
    path = write_filelogger(tmp_path / "m.jsonl", [1, 2, 3, 5, 4, 6], monkeypatch)
    run = load_run(path)
    assert run["critic/rewards/mean"].steps == (1, 2, 3, 4, 5, 6)
    assert any("m.jsonl:5: step 4 after step 5: steps out of order" in w for w in run.meta.warnings)


@pytest.mark.parametrize("meta, match", [
    ("[1, 2]", "a JSON object expected"),
    ('"tiny"', "a JSON object expected"),
    ('{"devices": "abc"}', r'"devices" is "abc", not a positive whole number'),
    ('{"devices": 0}', r'"devices" is 0'),
    ('{"devices": true}', r'"devices" is true'),
    ('{"versions": {"verl": 9}}', "package names to version strings"),
    ('{"scale": 3}', r'"scale" is 3'),
])
def test_bad_meta_json(tmp_path, monkeypatch, meta, match):
    write_filelogger(tmp_path / "m.jsonl", range(1, 3), monkeypatch)
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(BadInput, match=match):
        load_run(tmp_path)


def test_ingest_streams_in_bounded_memory(tmp_path):
    """A FileLogger log is read line by line into 8-byte columns: the peak stays within 2x the series it
    returns (the whole-file read took 3.5 GiB for a 373 MiB log). The timing is a benchmark."""
    import gc
    import json
    import tracemalloc

    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for step in range(1, 40_001):
            f.write(json.dumps({"step": step, "data": {k: step * 0.001 + i for i, k in enumerate(METRICS)}}) + "\n")
    gc.collect()
    tracemalloc.start()
    try:
        run = load_run(path)
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(run["actor/pg_loss"]) == 40_000
    assert peak <= 2 * retained, f"peak {peak / 2**20:.1f} MiB for {retained / 2**20:.1f} MiB of series"


def test_verls_resolved_config_is_read_from_the_runs_hydra_directory(tmp_path, monkeypatch):
    """The launcher points hydra.run.dir into the run directory, so verl writes its resolved config there; ingest
    gives it as meta "config" (the algorithm check, precision and graph-mode detection read it). A file that is
    not a YAML mapping is one line naming it."""
    from harness.metrics.keys import HYDRA_CONFIG

    run = tmp_path / "run"
    run.mkdir()
    write_filelogger(run / "metrics.jsonl", range(1, 3), monkeypatch)
    (run / HYDRA_CONFIG).parent.mkdir(parents=True)
    (run / HYDRA_CONFIG).write_text("actor_rollout_ref:\n  rollout:\n    dtype: float32\n    temperature: 1.0\n")
    loaded = load_run(run)
    assert loaded.meta.extra["config"]["actor_rollout_ref"]["rollout"]["dtype"] == "float32"
    (run / HYDRA_CONFIG).write_text("- just\n- a list\n")
    with pytest.raises(BadInput, match=r"config\.yaml: not a mapping"):
        load_run(run)
