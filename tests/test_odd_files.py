"""Inputs are regular files (or directories): a FIFO, a device or a link to one is refused up front instead of
hanging or reading until memory runs out; a whole-file read is bounded; a UTF-8 byte-order mark is accepted in
every text format; a lenient read says which steps it dropped; a wrong --history is refused before the tests run."""
from __future__ import annotations

import json
import os
import resource
import textwrap

import pytest
from faults import cli, one_line_exit_2, suites_tree
from verl_logs import console_line

from fixtures.report import make_report
from harness.errors import BadInput
from harness.metrics.ingest import load_run
from harness.report.schema import write_report

BOM = "\ufeff"


def _limited():
    """A child that reads /dev/zero into memory dies at 4 GiB instead of taking the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.fixture
def store(tmp_path):
    store = tmp_path / "store"
    for i in range(2):
        write_report(make_report(f"night-{i}", f"2026-11-0{i + 1}T02:00:00+00:00", tps=120.0), store / f"n{i}.json")
    return store


def test_a_fifo_given_to_report_is_refused_not_waited_on(tmp_path):
    # seeded: `report FIFO` blocked in open() until a writer came, for ever
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    proc = cli("report", fifo, "-o", tmp_path / "out", cwd=tmp_path, timeout=60)
    assert "FIFO" in one_line_exit_2(proc, str(fifo))


@pytest.mark.parametrize("how", ["given", "linked-in-store"])
def test_dev_zero_is_refused_not_read_until_memory_runs_out(tmp_path, store, how):
    # seeded: read_text() on /dev/zero (or a store entry linking to it) grew until the machine ran out of memory
    if how == "given":
        proc = cli("report", "/dev/zero", "-o", tmp_path / "out", cwd=tmp_path, timeout=60, preexec_fn=_limited)
        assert "device" in one_line_exit_2(proc, "/dev/zero")
        return
    (store / "zero.json").symlink_to("/dev/zero")
    proc = cli("report", store, "-o", tmp_path / "out", cwd=tmp_path, timeout=60, preexec_fn=_limited)
    assert proc.returncode == 0 and "zero.json" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (store / "zero.json").is_symlink()  # skipped with a warning, never renamed: it is no corrupt report


def test_a_fifo_run_log_is_refused(tmp_path):
    fifo = tmp_path / "run.log"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="FIFO"):
        load_run(fifo)
    proc = cli("compare", fifo, cwd=tmp_path, timeout=60)
    one_line_exit_2(proc, str(fifo))


def test_an_oversized_json_is_refused_unread(tmp_path, monkeypatch):
    from harness import io as hio

    monkeypatch.setattr(hio, "MAX_JSON_BYTES", 1000)
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"pad": "x" * 2000}))
    with pytest.raises(BadInput, match="report.json: 2.0 kB, more than"):
        hio.read_json(path, missing="gone")


def test_a_console_log_with_a_bom_keeps_step_1(tmp_path):
    # seeded: "\ufeffstep:1 - ..." did not match, so step 1 was silently dropped and the window shifted
    log = tmp_path / "run.log"
    log.write_text(BOM + "".join(console_line(s) + "\n" for s in range(1, 16)), encoding="utf-8")
    run = load_run(log)
    assert run["critic/rewards/mean"].steps[0] == 1 and len(run["critic/rewards/mean"]) == 15


@pytest.mark.parametrize(("suffix", "text"), [
    (".csv", "_step,critic/rewards/mean\n1,0.5\n2,0.6\n"),
    (".jsonl", '{"step": 1, "data": {"critic/rewards/mean": 0.5}}\n'
               '{"step": 2, "data": {"critic/rewards/mean": 0.6}}\n'),
])
def test_every_text_format_accepts_a_bom(tmp_path, suffix, text):
    # seeded: a wandb CSV with a BOM said "no step column"
    path = tmp_path / f"run{suffix}"
    path.write_text(BOM + text, encoding="utf-8")
    assert load_run(path)["critic/rewards/mean"].steps == (1, 2)


def test_json_documents_and_summaries_accept_a_bom(tmp_path, store):
    from harness.metrics.ingest import load_summary

    summary = tmp_path / "baseline.txt"
    summary.write_text(BOM + "critic/rewards/mean: 0.4\n", encoding="utf-8")
    assert load_summary(summary).values == {"critic/rewards/mean": 0.4}
    entry = store / "n0.json"
    entry.write_bytes(BOM.encode() + entry.read_bytes())
    assert cli("report", entry, "-o", tmp_path / "out", cwd=tmp_path).returncode == 0


def _events(tmp_path, steps=30):
    from torch.utils.tensorboard import SummaryWriter

    directory = tmp_path / "tb"
    writer = SummaryWriter(str(directory))
    for step in range(1, steps + 1):
        writer.add_scalar("critic/rewards/mean", 0.01 * step, step)
    writer.close()
    (path,) = directory.iterdir()
    return path


def test_a_flipped_byte_in_tensorboard_drops_one_record_and_says_which_step(tmp_path):
    # seeded: one byte flipped mid-file, read --lenient, dropped 16 of 30 steps and said "1 line skipped"
    path = _events(tmp_path)
    raw = bytearray(path.read_bytes())
    records = []  # TFRecord framing: length (8), its CRC (4), data, its CRC (4)
    at = 0
    while at < len(raw):
        length = int.from_bytes(raw[at:at + 8], "little")
        records.append((at, length))
        at += 16 + length
    victim_at, victim_len = records[len(records) // 2]
    raw[victim_at + 12 + victim_len // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(BadInput, match="corrupt TensorBoard record"):
        load_run(path)
    run = load_run(path, strict=False)
    steps = run["critic/rewards/mean"].steps
    assert len(steps) == 29, steps
    (dropped,) = sorted(set(range(1, 31)) - set(steps))
    assert any(f"step {dropped}" in w or f"steps {dropped - 1} and {dropped + 1}" in w for w in run.meta.warnings), \
        run.meta.warnings


def test_every_step_a_lenient_read_drops_is_named(tmp_path):
    lines = [json.dumps({"step": s, "data": {"critic/rewards/mean": 0.1 * s}}) for s in range(1, 31)]
    for bad in (4, 11, 12, 25):
        lines[bad - 1] = lines[bad - 1][:-5] + "oops"
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run = load_run(path, strict=False)
    assert run["critic/rewards/mean"].steps == tuple(s for s in range(1, 31) if s not in (4, 11, 12, 25))
    summary = run.meta.warnings[-1]
    assert "4 lines" in summary and "between steps 3 and 5" in summary and "between steps 10 and 13" in summary \
        and "between steps 24 and 26" in summary, summary


def test_run_with_history_a_file_is_refused_before_the_tests_run(tmp_path):
    # seeded: `run --history FILE` ran every test, then crashed writing into the file
    suites_tree(tmp_path, textwrap.dedent('''
        from pathlib import Path
        import pytest

        @pytest.mark.tiny
        def test_marks():
            Path("ran").write_text("x")
    '''))
    (tmp_path / "store.json").write_text("{}")
    proc = cli("run", "--scale", "tiny", "--report-dir", "out", "--history", "store.json", cwd=tmp_path)
    one_line_exit_2(proc, "--history", "store.json")
    assert not (tmp_path / "ran").exists()


def test_a_fifo_in_a_run_directory_is_not_opened(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "data": {"critic/rewards/mean": 0.5}}) + "\n")
    os.mkfifo(run_dir / "console.log")
    assert load_run(run_dir)["critic/rewards/mean"].steps == (1,)


def test_a_huge_tensorboard_length_field_is_a_truncation_not_a_read(tmp_path):
    # tensorboard's own loader (EventFileLoader) trusts a length whose CRC holds and read(2**60): a MemoryError
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    path = _events(tmp_path, steps=3)
    raw = path.read_bytes()
    head = struct.pack("<Q", 1 << 60)
    path.write_bytes(raw + head + struct.pack("<I", masked_crc32c(head)) + b"\0" * 64)
    with pytest.raises(BadInput, match=r"tfevents.*:byte\d+: truncated last record"):
        load_run(path)
    assert load_run(path, strict=False)["critic/rewards/mean"].steps == (1, 2, 3)
