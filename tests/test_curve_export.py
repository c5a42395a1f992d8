"""`report --export tb|csv`: a report's candidate and reference curves written as TensorBoard event files and in
wandb's CSV export layout, each run read back by the same ingest `compare` uses (harness.metrics.ingest.load_run)
to the values the report holds. The round trip is checked against the report JSON itself, so an export that
shifts the steps by one or swaps two runs fails it (the seeded bugs below)."""
from __future__ import annotations

import dataclasses
import json
import math
import struct
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import BadInput
from harness.metrics import curves
from harness.metrics.baseline import MetricBaseline, ReferenceCurve, default_tolerance, load_baseline
from harness.metrics.ingest import load_run
from harness.metrics.run import Run, Series
from harness.report import export
from harness.report.publish import safe_name
from harness.report.schema import load_report, write_report

GOLDEN = Path(__file__).resolve().parents[1] / "baselines" / "tiny" / "dapo_verl.json"
REWARD = "critic/rewards/mean"
KINDS = {"tb": "tensorboard", "csv": "wandb-csv"}


@pytest.fixture
def curve_report(tmp_path, report_factory):
    """A report whose reward-alignment test recorded band_series of the tiny verl golden (10 real verl runs) against
    a candidate that logged 12 of its 15 steps, one value NaN."""
    golden = load_baseline(GOLDEN)
    cand = {m: Series(ref.runs[0].series.steps[:12], tuple(v * 1.1 + 0.01 for v in ref.runs[0].series.values[:12]))
            for m, ref in golden.metrics.items()}
    values = list(cand[REWARD].values)
    values[4] = math.nan
    cand[REWARD] = Series(cand[REWARD].steps, tuple(values))
    run = Run("night 7 - candidate", cand)  # a " - " in the name must not split the CSV header wrongly
    series = curves.band_series(run, golden, tuple(golden.metrics), curves.compare(run, golden))
    report = report_factory("night-7", "2026-11-07T02:00:00+00:00", properties={"curves.series": series})
    test = dataclasses.replace(report.tests[0], nodeid="suites/precision/test_reward_alignment.py::"
                               "test_reward_curve_aligns_with_baseline[tiny]")
    return write_report(dataclasses.replace(report, tests=(test,)), tmp_path / "report.json")


def tb_scalars(directory, tag: str) -> list[tuple[int, float]]:
    """(step, value) of `tag` as TensorBoard's own loader reads scalar summaries: EventAccumulator.Scalars()."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def test_scalar_check_fails_on_tensor_summaries(tmp_path):
    # seeded: the v2 tensor summaries the export wrote before (add_scalar new_style=True) -- TensorBoard's
    # EventAccumulator.Scalars() sees nothing, so the check above fails on them
    from torch.utils.tensorboard import SummaryWriter

    for style, where in ((True, tmp_path / "tensor"), (False, tmp_path / "scalar")):
        writer = SummaryWriter(str(where))
        writer.add_scalar(REWARD, 0.5, 1, new_style=style)
        writer.close()
    assert tb_scalars(tmp_path / "tensor", REWARD) == [] and tb_scalars(tmp_path / "scalar", REWARD) == [(1, 0.5)]


def mismatches(report_path: Path, root: Path) -> list[str]:
    """What the exported runs under `root` (one directory per report/test/role/run) disagree on with the report's
    `curves.series`, each run read back by load_run: a missing run, a step or value that differs."""
    report = load_report(report_path)
    found, tensorboard = [], root.name == KINDS["tb"]
    for nodeid, series in report.properties("curves.series"):
        test_dir = root / safe_name(report.name) / safe_name(nodeid.rsplit("::", 1)[-1])
        expected: dict[tuple[str, str], dict] = {}
        for metric, data in series.items():
            expected.setdefault(("candidate", data["candidate_name"]), {})[metric] = (
                data["candidate_steps"], data["candidate"])
            for ref in data["reference_runs"]:
                expected.setdefault(("reference", ref["name"]), {})[metric] = (ref["steps"], ref["values"])
        for (role, name), metrics in expected.items():
            path = test_dir / role / safe_name(name)
            path = path if path.is_dir() else path.with_name(path.name + ".csv")
            if not path.exists():
                found.append(f"{role} {name}: not exported ({path})")
                continue
            run = load_run(path)
            for metric, (steps, values) in metrics.items():
                got = run.series.get(metric)
                if tensorboard:  # scalar summaries hold float32 (what TensorBoard's scalar dashboard reads)
                    values = [None if v is None else struct.unpack("f", struct.pack("f", v))[0] for v in values]
                if got is None or list(got.steps) != steps:
                    found.append(f"{role} {name} {metric}: steps {got and list(got.steps)} != {steps}")
                elif any(not (v is None and math.isnan(g)) and g != v for g, v in zip(got.values, values, strict=True)):
                    found.append(f"{role} {name} {metric}: values {list(got.values)} != {values}")
            if set(run.series) != set(metrics):
                found.append(f"{role} {name}: metrics {sorted(run.series)} != {sorted(metrics)}")
    return found


@pytest.mark.parametrize("kind", ["tb", "csv"])
def test_export_reads_back_as_the_report_holds_it(tmp_path, capsys, curve_report, kind):
    out = tmp_path / "out"
    assert main(["report", str(curve_report), "-o", str(out), "--export", kind, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc)[:2] == ["passed", "state"] and doc["passed"] is True and doc["state"] == "EXPORTED"
    assert doc["verdict"] == "PASS"
    runs = doc["export"]["runs"]
    golden = load_baseline(GOLDEN)
    assert doc["export"]["format"] == kind
    assert [r["role"] for r in runs] == ["candidate"] + ["reference"] * golden.n_runs
    n_metrics = len(golden.metrics)  # 12 logged steps of each, less the one NaN
    assert runs[0]["run"] == "night 7 - candidate" and runs[0]["metrics"] == n_metrics
    assert runs[0]["points"] == 12 * n_metrics
    assert (out / "night-7.html").is_file()  # the pages as always: the export comes beside them
    assert mismatches(curve_report, out / KINDS[kind]) == []
    if kind == "tb":  # TensorBoard's own loader sees the same scalars, as scalar summaries (its scalar dashboard's)
        seen = tb_scalars(runs[0]["path"], REWARD)
        report = load_report(curve_report).tests[0].properties["curves.series"][REWARD]
        assert [s for s, _ in seen] == report["candidate_steps"] and math.isnan(seen[4][1])
        assert [v for _, v in seen if not math.isnan(v)] == pytest.approx(
            [v for v in report["candidate"] if v is not None], rel=1e-6)
    files = sorted(p for p in (out / KINDS[kind]).rglob("*") if p.is_file())
    assert len(files) == 1 + golden.n_runs
    assert all(Path(r["path"]) in (f if kind == "csv" else f.parent for f in files) for r in runs)
    assert main(["report", str(curve_report), "-o", str(out), "--export", kind]) == 0  # replaces, adds nothing
    assert sorted(p for p in (out / KINDS[kind]).rglob("*") if p.is_file()) == files
    assert mismatches(curve_report, out / KINDS[kind]) == []


def _shift_steps(c: export.Curves) -> export.Curves:
    return dataclasses.replace(c, metrics={m: (tuple(s + 1 for s in steps), values)
                                           for m, (steps, values) in c.metrics.items()})


def _swap_references(found: list[export.Curves]) -> list[export.Curves]:
    refs = [i for i, c in enumerate(found) if c.role == "reference"]
    a, b = refs[0], refs[1]
    found[a], found[b] = (dataclasses.replace(found[a], metrics=found[b].metrics),
                          dataclasses.replace(found[b], metrics=found[a].metrics))
    return found


@pytest.mark.parametrize("kind", ["tb", "csv"])
@pytest.mark.parametrize("bug", ["steps off by one", "two reference runs swapped", "candidate NaN dropped"])
def test_round_trip_check_fails_on_a_seeded_export_bug(tmp_path, monkeypatch, curve_report, kind, bug):
    collect = export.collect
    seeded = {"steps off by one": lambda found: [_shift_steps(c) if c.role == "candidate" else c for c in found],
              "two reference runs swapped": _swap_references,
              "candidate NaN dropped": lambda found: [dataclasses.replace(c, metrics={
                  m: tuple(zip(*[(s, v) for s, v in zip(*curve, strict=True) if not math.isnan(v)], strict=True))
                  for m, curve in c.metrics.items()}) for c in found]}[bug]
    monkeypatch.setattr(export, "collect", lambda reports: seeded(collect(reports)))
    assert main(["report", str(curve_report), "-o", str(tmp_path / "out"), "--export", kind]) == 0
    assert mismatches(curve_report, tmp_path / "out" / KINDS[kind]) != []


def test_export_of_a_red_report_exits_0_with_the_verdict_as_a_field(tmp_path, capsys, curve_report):
    # the export is a conversion: a red night's curves exported is success (it exited 1, read as a failed export)
    report = load_report(curve_report)
    red = write_report(dataclasses.replace(report, exit_status=1, tests=tuple(
        dataclasses.replace(t, outcome="failed", reason="reward below the band") for t in report.tests)),
        tmp_path / "red.json")
    assert main(["report", str(red), "-o", str(tmp_path / "plain")]) == 1  # no export: the verdict decides
    capsys.readouterr()
    assert main(["report", str(red), "-o", str(tmp_path / "out"), "--export", "csv", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["passed"], doc["state"], doc["verdict"]) == (True, "EXPORTED", "FAIL") and doc["export"]["runs"]
    assert main(["report", str(red), "-o", str(tmp_path / "out"), "--export", "csv"]) == 0
    assert "verdict is FAIL" in capsys.readouterr().out


def test_export_bad_input_is_one_line_exit_2(tmp_path, capsys, curve_report, report_factory):
    plain = write_report(report_factory("plain", "2026-11-01T02:00:00+00:00", tps=120.0), tmp_path / "plain.json")
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "tensorboard").write_text("a file where the export's directory goes")
    cases = [(["report", str(plain), "-o", str(tmp_path / "a"), "--export", "csv"], "no curves in"),
             (["report", str(curve_report), "-o", str(tmp_path / "b"), "--export", "parquet"], "--export"),
             (["report", str(curve_report), "-o", str(blocked), "--export", "tb"], "cannot write")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "a").exists()  # nothing written for a report without curves


def test_a_wrong_shaped_series_is_named(tmp_path, capsys, report_factory):
    series = {REWARD: {"candidate_steps": [1, 2], "candidate": [0.1, 0.2], "candidate_name": "c",
                       "reference_runs": [{"name": "r0", "steps": [2, 1], "values": [0.1, 0.2]}]}}
    path = write_report(report_factory("odd", "2026-11-01T02:00:00+00:00", properties={"curves.series": series}),
                        tmp_path / "odd.json")
    with pytest.raises(BadInput, match="reference run 'r0': steps must be whole numbers >= 0, increasing"):
        export.collect([load_report(path)])


def test_reports_keep_a_bounded_share_of_a_large_golden():
    tol = default_tolerance(REWARD)
    runs = tuple(ReferenceCurve(f"r{i}", i, Series(tuple(range(5000)), tuple(float(s % 7) for s in range(5000))))
                 for i in range(40))
    kept = curves.reference_runs(MetricBaseline(runs, tol))
    assert len(kept) == curves.MAX_REFERENCE_RUNS and [r["name"] for r in kept[:2]] == ["r0", "r1"]
    assert all(len(r["steps"]) == curves.MAX_REFERENCE_POINTS and r["steps"][0] == 0 and r["steps"][-1] == 4999
               and r["values"] == [float(s % 7) for s in r["steps"]] for r in kept)
    small = tuple(dataclasses.replace(r, series=Series(r.series.steps[:15], r.series.values[:15])) for r in runs[:5])
    assert curves.reference_runs(MetricBaseline(small, tol)) == [  # a golden of the tiny one's size is kept whole
        {"name": r.name, "seed": r.seed, "steps": list(range(15)), "values": list(r.series.values)} for r in small]


@pytest.mark.parametrize("kind", ["tb", "csv"])
def test_a_re_export_keeps_no_stale_run_and_follows_no_planted_link(tmp_path, capsys, curve_report, kind):
    # seeded: an export into the same -o kept the previous export's runs (read back as this export's), and a
    # directory symlink planted under -o/<format>/ was followed: the export wrote into its target
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    assert main(["report", str(curve_report), "-o", str(out), "--export", kind]) == 0
    first = sorted(p.relative_to(out) for p in (out / KINDS[kind]).rglob("*") if p.is_file())
    stale = out / KINDS[kind] / "old-report" / "t" / "candidate" / ("gone.csv" if kind == "csv" else "gone")
    stale.parent.mkdir(parents=True)
    stale.write_text("a run of an earlier export")
    (report_dir,) = [p for p in (out / KINDS[kind]).iterdir() if p.name != "old-report"]
    moved = report_dir.with_name(report_dir.name + ".real")
    report_dir.rename(moved)
    report_dir.symlink_to(victim, target_is_directory=True)  # planted where this export writes
    capsys.readouterr()
    assert main(["report", str(curve_report), "-o", str(out), "--export", kind]) == 0
    assert sorted(p.relative_to(out) for p in (out / KINDS[kind]).rglob("*") if p.is_file()) == first
    assert not (out / KINDS[kind] / report_dir.name).is_symlink()
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"] and (victim / "keep.txt").read_text() == "mine"
    assert mismatches(curve_report, out / KINDS[kind]) == []
