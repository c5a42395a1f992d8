"""Property tests (hypothesis; the plugin's `ci` profile keeps the budget small): whatever a log, a golden or a
command line holds, ingest / load_baseline / the compare, baseline and throughput commands end in a result or a
one-line BadInput (exit 2) -- never a traceback, never another exception (37 of 200 bad inputs once crashed).
The drawn numbers include the numeric policy's edges (tests/hostile_json.py EXTREMES: 10**300 steps, 1e308
values, subnormal times; harness.numeric), and what loads must compute finitely."""
from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

import pytest
from hostile_json import SETTINGS, json_values, numbers, with_fields_replaced
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import main
from harness.errors import BadInput
from harness.metrics.baseline import load_baseline, slope
from harness.metrics.ingest import load_run

keys = st.sampled_from(["critic/rewards/mean", "actor/pg_loss", "timing_s/step", "perf/throughput", "a", ""])


@contextlib.contextmanager
def _file(suffix: str, data: bytes):
    with tempfile.TemporaryDirectory(prefix="prop-") as directory:
        path = Path(directory) / f"run{suffix}"
        path.write_bytes(data)
        yield path


def _ingests(suffix: str, data: bytes) -> None:
    """load_run strict and lenient: a Run (every series non-empty) or a one-line BadInput, nothing else."""
    with _file(suffix, data) as path:
        for strict in (True, False):
            try:
                run = load_run(path, strict=strict)
            except BadInput as exc:
                assert "\n" not in str(exc), str(exc)
            else:
                assert run.series and all(len(s) for s in run.series.values())


@SETTINGS
@given(st.lists(st.one_of(
    st.fixed_dictionaries({"step": json_values, "data": st.dictionaries(keys, json_values, max_size=4)}),
    st.fixed_dictionaries({"step": st.integers(min_value=-3, max_value=2**64),
                           "data": st.dictionaries(keys, numbers, max_size=4)}),
    json_values), max_size=6), st.booleans())
def test_filelogger_jsonl(records, trailing_newline):
    lines = []
    for record in records:
        try:
            lines.append(json.dumps(record))  # NaN/Infinity tokens included, as json.dumps writes them
        except (ValueError, OverflowError):
            lines.append("{")
    _ingests(".jsonl", ("\n".join(lines) + ("\n" if trailing_newline else "")).encode())


value_texts = st.one_of(numbers.map(repr), numbers.map(lambda v: f"np.float64({v!r})"), st.text(max_size=10))
console_lines = st.one_of(
    st.builds(lambda step, pairs, prefix: f"{prefix}step:{step} - " + " - ".join(f"{k}:{v}" for k, v in pairs),
              st.integers(min_value=0, max_value=10**25), st.lists(st.tuples(keys, value_texts), max_size=4),
              st.sampled_from(["", "\x1b[36m(TaskRunner pid=1)\x1b[0m ", "(WorkerDict pid=9, ip=10.0.0.1) "])),
    st.text(max_size=40))


@SETTINGS
@given(st.lists(console_lines, max_size=8), st.integers(min_value=5, max_value=80), st.booleans())
def test_console_log(lines, width, wrap):
    if wrap:
        lines = [line[i:i + width] for line in lines for i in range(0, max(len(line), 1), width)]
    _ingests(".log", "\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")


@SETTINGS
@given(st.binary(max_size=600), st.sampled_from([".jsonl", ".log", ".csv", ".txt"]))
def test_any_bytes(data, suffix):
    _ingests(suffix, data)


cells = st.one_of(numbers.map(str), st.text(max_size=6), st.just(""), st.just("x" * 140_000))


@SETTINGS
@given(st.lists(st.sampled_from(["_step", "Step", "step", "_runtime", "r - loss", "loss", "loss__MIN", "a - b"]),
                min_size=1, max_size=4), st.lists(st.lists(cells, max_size=5), max_size=4), st.booleans())
def test_wandb_csv(header, rows, latin1):
    text = "\n".join(",".join(row) for row in [header, *rows]) + "\n"
    _ingests(".csv", text.encode("latin-1", "replace") if latin1 else text.encode())


@pytest.fixture(scope="module")
def event_file(tmp_path_factory) -> bytes:
    from torch.utils.tensorboard import SummaryWriter  # what verl's _TensorboardAdapter uses

    directory = tmp_path_factory.mktemp("tb")
    writer = SummaryWriter(str(directory))
    for step in range(1, 4):
        writer.add_scalar("critic/rewards/mean", 0.1 * step, step)
        writer.add_scalar("actor/pg_loss", math.nan if step == 2 else 0.01, step)
    writer.close()
    (path,) = directory.iterdir()
    return path.read_bytes()


@SETTINGS
@given(st.data())
def test_tensorboard_events(event_file, data):
    raw = bytearray(event_file)
    for _ in range(data.draw(st.integers(min_value=0, max_value=3))):  # flip bytes and/or cut the tail
        raw[data.draw(st.integers(min_value=0, max_value=len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(min_value=0, max_value=len(raw)))
    _ingests(".out.tfevents.1.host", bytes(raw[:cut]))


@pytest.fixture(scope="module")
def golden_doc() -> dict:
    from harness.metrics.baseline import Baseline
    from harness.metrics.run import Run, RunMeta, Series

    steps = tuple(range(1, 11))
    runs = [Run(f"r{i}", {"critic/rewards/mean": Series(steps, tuple(0.1 * s + 0.01 * i for s in steps))},
                RunMeta(extra={"seed": i})) for i in range(3)]
    return Baseline.from_runs(runs, ("critic/rewards/mean",)).to_json()



@SETTINGS
@given(st.data())
def test_golden_files(golden_doc, data):
    doc = with_fields_replaced(golden_doc, data)
    try:
        text = json.dumps(doc)
    except (ValueError, OverflowError):
        return
    with _file(".json", text.encode()) as file:
        try:
            baseline = load_baseline(file)
        except BadInput as exc:
            assert "\n" not in str(exc)
        else:  # what loads must be usable: bands computable, finite
            for metric in baseline.metrics.values():
                assert all(math.isfinite(metric.half_width(i)) for i in range(len(metric.steps)))
                assert all(map(math.isfinite, metric.center))
                assert all(s is None or math.isfinite(s) for s in metric.run_statistics(slope))


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli")
    runs = {}
    for i in range(3):
        path = root / f"r{i}.jsonl"
        path.write_text("".join(json.dumps({"step": s, "data": {
            "critic/rewards/mean": 0.05 * s + 0.01 * i, "timing_s/step": 10.0 + i, "perf/total_num_tokens": 5000.0,
            "perf/throughput": 500.0 / (10.0 + i)}}) + "\n" for s in range(1, 21)))
        runs[f"r{i}"] = str(path)
    # the numeric policy's edges in a log: a subnormal step time (TPS inf passed --target), values near the float
    # limit (their sums overflowed the statistics), a step beyond int64
    extreme = root / "extreme.jsonl"
    extreme.write_text("".join(json.dumps({"step": s, "data": {
        "critic/rewards/mean": 1.7e308 if s % 4 == 0 else 0.01 * s, "timing_s/step": 5e-324 if s == 3 else 10.0,
        "perf/total_num_tokens": 5000.0, "perf/throughput": 50.0}}) + "\n" for s in range(1, 21)))
    runs["extreme"] = str(extreme)
    summary = root / "baseline.txt"
    summary.write_text("critic/rewards/mean: 0.4\nperf/throughput: 48.0\n")
    return {**runs, "summary": str(summary), "dir": str(root), "missing": str(root / "nope" / "x.json"),
            "golden": str(root / "golden.json")}


def _cli(argv: list[str], cwd: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    # in a scratch directory: a drawn `--plot inf` writes ./inf
    with contextlib.chdir(cwd), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
    return code, out.getvalue(), err.getvalue()


option_values = st.one_of(st.sampled_from(["0", "-1", "-5", "nan", "inf", "-inf", "1e400", "1e308", "5e-324",
                                           str(10**30), "1" + "0" * 400, "abc", "", "3", "0.05", "1.5", "256",
                                           "median", "nightly", "critic/rewards/mean:pool=1e309",
                                           "critic/rewards/mean:band_atol=1e308"]), st.text(max_size=6))


@SETTINGS
@given(st.data())
def test_cli_arguments(cli_files, data):
    files = st.sampled_from(list(cli_files.values()))
    command = data.draw(st.sampled_from(["compare", "record", "throughput"]))
    if command == "compare":
        argv = ["compare", data.draw(files), *data.draw(st.lists(files, max_size=3))]
        options = ["--metric", "--plot", "--json", "--lenient", "--allow-partial", "--exact"]
    elif command == "record":
        argv = ["baseline", "record", *data.draw(st.lists(files, min_size=1, max_size=3)), "--out",
                data.draw(st.sampled_from([cli_files["golden"], cli_files["dir"], cli_files["missing"]]))]
        options = ["--metric", "--force", "--keep-flagged", "--lenient", "--tolerance"]
    else:
        argv = ["throughput", data.draw(files), "--hardware", data.draw(st.sampled_from(["a2", "a3", "cpu"]))]
        options = ["--devices", "--sequences", "--warmup", "--target", "--tolerance", "--statistic", "--baseline",
                   "--scale", "--per-step", "--json"]
    for option in data.draw(st.lists(st.sampled_from(options), max_size=3)):
        flag = option in ("--json", "--lenient", "--allow-partial", "--exact", "--force", "--keep-flagged",
                          "--per-step")
        argv += [option] if flag else [option, data.draw(st.one_of(option_values, files))]
    code, out, err = _cli(argv, cli_files["dir"])
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if command == "throughput" and "--json" in argv and code in (0, 1):  # never Infinity/NaN, which is no JSON
        assert "Infinity" not in out and "NaN" not in out, (argv, out[-500:])
    if code == 2 and "usage:" not in err:  # a harness error: one line naming what to fix
        assert len(err.strip().splitlines()) == 1, (argv, err)
