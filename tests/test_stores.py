"""Trend stores keep every night: nights that share a name each keep their page, page names stay within the file
system's limit, and an entry written by a newer harness is skipped with that reason -- never renamed `.corrupt`,
which would hide it from the version that can read it."""
from __future__ import annotations

import json

from faults import cli

from fixtures.report import make_report
from harness.report.schema import SCHEMA_VERSION, write_report


def test_nights_with_one_name_each_keep_their_page(tmp_path):
    # seeded: pages keyed by name collapsed nights sharing one (3 of 70 nights kept)
    store = tmp_path / "store"
    for i in range(5):
        write_report(make_report("tiny-20261101T020000", f"2026-11-0{i + 1}T02:00:00+00:00", tps=120.0 + i),
                     store / f"n{i}.json")
    proc = cli("report", store, "-o", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pages = sorted(p.name for p in (tmp_path / "out").glob("*.html") if p.name != "trend.html")
    assert len(pages) == 5, pages
    created = {json.loads(p.read_text())["created"] for p in store.glob("*.json")}
    shown = {c for c in created for page in pages if c in (tmp_path / "out" / page).read_text()}
    assert shown == created
    trend = (tmp_path / "out" / "trend.html").read_text()
    assert all(f'href="{page}"' in trend for page in pages)


def test_page_names_are_unique_and_bounded():
    # seeded: 70 names sharing a 120-character prefix grew "-1-1-1..." suffixes into ENAMETOOLONG
    from harness.report.publish import page_stems

    names = ["n" * 130 + str(i) for i in range(70)] + ["same"] * 70 + ["../../etc/passwd", ""]
    stems = page_stems(names)
    assert len(set(stems)) == len(names) and all(len(s) + len(".html") <= 255 for s in stems)
    assert all("/" not in s and not s.startswith(".") for s in stems)


def test_an_entry_of_a_newer_schema_is_skipped_not_quarantined(tmp_path):
    # seeded: a read-only command renamed a schema_version 3 entry `.corrupt`
    store = tmp_path / "store"
    for i in range(2):
        write_report(make_report(f"night-{i}", f"2026-11-0{i + 1}T02:00:00+00:00", tps=120.0), store / f"n{i}.json")
    doc = json.loads((store / "n1.json").read_text())
    doc["schema_version"] = SCHEMA_VERSION + 1
    (store / "future.json").write_text(json.dumps(doc))
    proc = cli("report", store, "-o", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "future.json" in proc.stdout and "newer version" in proc.stdout, proc.stdout
    assert (store / "future.json").is_file() and not list(store.glob("*.corrupt"))


def test_report_names_are_unique_by_construction():
    # two sessions in one second named their reports alike, and the trend keyed pages by that name
    from harness.report.schema import report_name

    created = "2026-11-01T02:00:00+00:00"
    assert len({report_name("tiny", created) for _ in range(50)}) == 50
    assert report_name("tiny", created).startswith("tiny-2026-11-01T020000")
