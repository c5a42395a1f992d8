"""Render a RunReport to one self-contained HTML page (plots as base64 PNG, matplotlib Agg; no external
URL, so it opens offline and in CI artifacts) and to a Markdown summary for CI comments. Never computes a
verdict: those are the report's and harness.report.trend's.

The page reads top-down as an on-call engineer needs it (issue 33: the first failure sat at y = 920 px under the
Versions and Machine tables): verdict, then one block per failure (harness.report.failures: the E line, where,
the known bug, the rerun command, the traceback from its E line, the log's warnings and errors), then the tests
collapsed by suite with their counts (sortable/filterable tables with a delta column against the previous
report), the versions and machine behind a one-line summary, then the measurements as tables and plots (raw
JSON behind a disclosure).
Everything goes through jinja2 autoescape (harness.report.page); matplotlib labels escape `$` so a metric name
is never parsed as mathtext (`$\\undefinedcmd$` once crashed the renderer).

Sections appear when their measurements are present (see harness.report.schema for the property names). A
measurement of the wrong shape is shown as raw JSON with a one-line note; `strict=True` (the `report`
command) raises BadInput naming the test and property instead.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import statistics

from markupsafe import Markup

from harness.errors import BadInput
from harness.redact import redact_argv
from harness.report.failures import briefs, rerun_failed
from harness.report.page import Cell, Row, img, page, render, table
from harness.report.schema import OUTCOMES, RunReport, TestVerdict, finite
from harness.report.tiles import with_sparklines
from harness.report.trend import Metric, Step, first_judged, version_changes, versions

DPI = 90
FIGSIZE = (8, 3.6)  # inches: 720 x 324 px at DPI
KNOWN = ("throughput", "throughput.graph_mode", "curves.verdicts", "curves.series", "memory.phases", "sync.phases",
         "rollout_corr.verdicts", "routing.agreement", "routing.replay", "consistency.batch_invariance")
# what a drawing of a malformed measurement raises: caught per section, never a traceback
SHAPE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError, OverflowError)


def _tex(text) -> str:
    """A label matplotlib will not parse as mathtext (a metric name `$\\undefinedcmd$` once crashed the page)."""
    return str(text).replace("$", r"\$")


def plt_subplots(figsize=FIGSIZE):
    import matplotlib

    matplotlib.use("Agg", force=True)  # headless: no display on CI or the cluster head node
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize, dpi=DPI)


def _figure():
    return plt_subplots()


def _png(fig, tight: bool = True, zoom: int = 1) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=DPI * zoom, **({"bbox_inches": "tight"} if tight else {}))
    finally:
        plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def span(steps) -> str:
    """A list of steps as a range, not a Python list like `[2, 3]`: 2-9, or 1, 3, 5 when gapped."""
    if not isinstance(steps, (list, tuple)):
        return str(steps)
    if not steps:
        return "none"
    if all(isinstance(s, int) and not isinstance(s, bool) for s in steps) and len(steps) > 1 \
            and list(steps) == list(range(steps[0], steps[0] + len(steps))):
        return f"{steps[0]}\u2013{steps[-1]}"
    return ", ".join(map(str, steps))


def fmt(value, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return span(value)
    return "" if value is None else str(value)


def _raw(value) -> Markup:
    return render("<details><summary>raw JSON</summary><pre>{{ text }}</pre></details>",
                  text=json.dumps(value, indent=1)[:20000])


# ----------------------------------------------------------------------------------------------- plots
def plot_throughput(doc: dict) -> str:
    """TPS/card per step (warm-up marked) with the target and the roofline limit."""
    fig, ax = _figure()
    steps = [p["step"] for p in doc["per_step"]]
    ax.plot(steps, [p["tps_per_card"] for p in doc["per_step"]], "o-", label="TPS/card")
    if doc.get("warmup"):
        ax.axvspan(min(doc["warmup"]) - 0.5, max(doc["warmup"]) + 0.5, color="0.9", label="warm-up (skipped)")
    if doc.get("target"):
        ax.axhline(doc["target"], color="tab:red", ls="--", label=f"target {doc['target']:g}")
    limit = (doc.get("roofline") or {}).get("tps_per_card_limit")
    if limit:
        ax.axhline(limit, color="tab:gray", ls=":", label=f"roofline {limit:.0f}")
    ax.set_xlabel("step")
    ax.set_ylabel(_tex(f"tokens/s per card ({doc.get('hardware', '')})"))
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def plot_phases(phases: list[dict]) -> str:
    """The step's phase times (median seconds) as one stacked horizontal bar: where a step's time goes."""
    fig, ax = plt_subplots(figsize=(FIGSIZE[0], 1.3))
    left = 0.0
    for p in phases:
        ax.barh([0], [float(p["seconds"])], left=left, label=_tex(f"{p['name']} {float(p['seconds']):.3g} s"))
        left += float(p["seconds"])
    ax.set_yticks([])
    ax.set_xlabel("seconds per step (median)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=min(len(phases), 6), fontsize=7, frameon=False)
    return _png(fig)


def plot_graph_mode(doc: dict) -> str:
    """Decode tokens/s of every round, eager vs graph mode."""
    fig, ax = _figure()
    for x, mode in enumerate(("eager", "graph")):
        rounds = doc[mode]
        tps = [rounds["tokens_per_round"] / s for s in rounds["seconds"]]
        ax.plot([x] * len(tps), tps, "o", alpha=0.6, label=f"{mode}: median {statistics.median(tps):.0f} tok/s")
    ax.set_xticks([0, 1], ["eager", "graph"])
    ax.set_xlim(-0.5, 1.5)
    ax.set_ylabel("decode tokens/s per round")
    ax.set_title(_tex(f"speedup {doc['speedup']:.2f}x ({doc.get('platform', '')})"), fontsize=9)
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


ZOOM = 2  # curve plots are drawn at twice the pixels they are shown at, so the full-size view (click) is sharp


def _nan(values) -> list[float]:
    return [math.nan if v is None else v for v in values]


def plot_curve(metric: str, series: dict) -> tuple[str, list[tuple[int, float, float, float]]]:
    """One metric per step, drawn as people compare curves in TensorBoard or wandb: the golden's reference runs as
    thin lines, its band (lo..hi) and centre, this run on top and its steps outside the band
    (harness.metrics.curves.band_series). Returns the PNG (ZOOM x the shown size) and each finite candidate
    point's (step, value, x, y) in shown pixels, for the image map that gives its value on hover."""
    fig, ax = _figure()
    baseline = _tex(series.get("baseline_name") or "baseline")
    runs = series.get("reference_runs") or []
    total = series.get("n_reference_runs") or len(runs)
    for k, run in enumerate(runs):
        ax.plot(run["steps"], _nan(run["values"]), color="0.45", lw=0.6, alpha=0.6, zorder=1,
                label=f"reference runs ({len(runs)}{f' of {total}' if total > len(runs) else ''})" if not k else None)
    if series.get("steps") and series.get("lo") and series.get("hi"):
        ax.fill_between(series["steps"], _nan(series["lo"]), _nan(series["hi"]), color="tab:blue", alpha=0.2,
                        lw=0, zorder=2, label=f"{baseline} band")
    if series.get("steps") and series.get("center"):
        ax.plot(series["steps"], _nan(series["center"]), color="tab:blue", lw=1.2, zorder=3,
                label=f"{baseline} center")
    steps = series.get("candidate_steps", [])
    values = _nan(series.get("candidate", []))
    ax.plot(steps, values, "o-", color="tab:orange", ms=3, zorder=5,
            label=_tex(series.get("candidate_name") or "this run"))
    outside = set(series.get("outside_steps") or ())
    if outside:
        ax.plot([s for s in steps if s in outside], [v for s, v in zip(steps, values, strict=True) if s in outside],
                "x", color="tab:red", ms=8, zorder=6, label="outside the band")
    ax.set_xlabel("step")
    ax.set_ylabel(_tex(metric))
    ax.set_title(_tex(f"{metric}: {series['verdict']}" if series.get("verdict") else metric), fontsize=9)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.canvas.draw()
    shown = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
    height = fig.bbox.height
    points = [(s, v, float(px), float(height - py)) for (s, v), (px, py) in
              zip(shown, ax.transData.transform(shown), strict=True)] if shown else []
    return _png(fig, tight=False, zoom=ZOOM), points  # not tight: the pixel positions above must stay put


def plot_memory(phases: list[dict]) -> str:
    """Peak GiB per phase (stacked components when given) against the device budget."""
    fig, ax = _figure()
    labels = [_tex(f"{p.get('scale', '')}\n{p.get('phase', '?')}") for p in phases]
    xs = range(len(phases))
    components = sorted({str(c) for p in phases for c in (p.get("components_gib") or {})})
    if components:
        bottom = [0.0] * len(phases)
        for comp in components:
            vals = [float((p.get("components_gib") or {}).get(comp, 0.0)) for p in phases]
            ax.bar(xs, vals, bottom=bottom, label=_tex(comp))
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    else:
        ax.bar(xs, [float(p.get("peak_gib", 0.0)) for p in phases], label="peak")
    for x, p in zip(xs, phases, strict=True):
        if p.get("budget_gib") is not None:
            ax.hlines(float(p["budget_gib"]), x - 0.4, x + 0.4, colors="tab:red", linestyles="--")
    ax.plot([], [], "r--", label="budget")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("GiB per device")
    ax.legend(loc="best", fontsize=7)
    return _png(fig)


def plot_agreement(docs: list[tuple[str, dict]]) -> str:
    """Per MoE layer, the share of tokens whose top-k expert sets agree between rollout and trainer, one bar group
    per test (e.g. per dtype)."""
    fig, ax = _figure()
    layers = sorted({la["layer"] for _, doc in docs for la in doc["layers"]})
    width = 0.8 / max(len(docs), 1)
    for k, (label, doc) in enumerate(docs):
        share = {la["layer"]: 100 * float(la["share"]) for la in doc["layers"]}
        xs = [i + k * width for i in range(len(layers))]
        ax.bar(xs, [share.get(layer, math.nan) for layer in layers], width, label=_tex(label))
    ax.set_xticks([i + width * (len(docs) - 1) / 2 for i in range(len(layers))], [f"layer {la}" for la in layers])
    ax.set_ylabel("top-k sets agreeing (%)")
    ax.set_ylim(min([80.0] + [100 * float(la["share"]) - 5 for _, d in docs for la in d["layers"]]), 100.5)
    ax.legend(loc="lower left", fontsize=7)
    return _png(fig)


# --------------------------------------------------------------------------------------------- sections
def _consistency(report: RunReport) -> list[Markup]:
    """Routing agreement per MoE layer (table + plot), router replay's log-prob gaps, batch-invariance cases."""
    out = []
    agreement = list(report.properties("routing.agreement"))
    if agreement:
        rows = [[nodeid, la["layer"], f"{100 * la['share']:.1f} % ({la['agreed']}/{la['tokens']})",
                 la["first_flips"], la["downstream"], fmt(la["max_first_gap"])]
                for nodeid, doc in agreement for la in doc["layers"]]
        out += [render("<h3>Routing agreement (rollout vs trainer, per MoE layer)</h3>"),
                table(["test", "layer", "top-k sets agree", "first flips (near ties)", "flips downstream",
                       "widest first-flip gap"], rows),
                img(plot_agreement([(nodeid.rsplit("[", 1)[-1].rstrip("]"), doc) for nodeid, doc in agreement]),
                    "routing agreement per layer")]
    replay = list(report.properties("routing.replay"))
    if replay:
        out += [render("<h3>Router replay</h3>"),
                table(["test", "log-prob gap with replay", "without", "agreement with replay"],
                      [[n, fmt(d["gap_with"]), fmt(d["gap_without"]),
                        ", ".join(f"layer {la['layer']} {100 * la['share']:.1f} %" for la in d["agreement"]["layers"])]
                       for n, d in replay])]
    invariance = list(report.properties("consistency.batch_invariance"))
    if invariance:
        rows = [[n, d["engine"], "yes" if d["claimed"] else "no", c["case"],
                 Cell("bit-equal", cls="ok") if c["equal"] else Cell("differs", cls="FAIL" if c["judged"] else
                                                                      "skipped"),
                 fmt(c["first_token"]), fmt(c["first_bits"]), fmt(c["max_abs"])]
                for n, d in invariance for c in d["cases"]]
        rows += [[n, d["engine"], "", note, "not measured", "", "", ""] for n, d in invariance
                 for note in d.get("not_measured", [])]
        out += [render("<h3>Batch invariance (greedy prompt vs alone)</h3>"),
                table(["test", "engine", "claims invariance", "case", "bits", "first divergent token",
                       "first divergent log-prob bits", "max |d log-prob|"], rows)]
    return out


def _sync_phases(report: RunReport) -> list[Markup]:
    """Each timed weight sync: its phases in ms against the platform's budget (harness.report.sync_phases)."""
    from harness.config.platforms import SYNC_PHASES
    from harness.report.sync_phases import sync_verdicts

    verdicts = sync_verdicts(report)
    if not verdicts:
        return []
    rows = [[v.test, v.engine, v.exporter, v.layout, v.sync,
             *(fmt(1000 * v.phases[p]) if p in v.phases else "" for p in SYNC_PHASES),
             Cell(v.state, cls="FAIL" if v.late else ("ok" if v.budget else "skipped"))] for v in verdicts]
    return [table(["test", "engine", "exporter", "layout", "sync", *(f"{p} ms" for p in SYNC_PHASES),
                   "budget"], rows, "sync-phases", sortable=True)]


def _throughput(nodeid: str, doc: dict) -> list[Markup]:
    roof = doc.get("roofline") or {}
    rows = [[label, value] for label, value in (
        ("TPS/card (median, steady window)", fmt(doc.get("tps_per_card"))),
        ("TPS/device (verl perf/throughput)", fmt(doc.get("tps_per_device"))),
        ("devices / cards", f"{fmt(doc.get('devices'))} / {fmt(doc.get('cards'))} ({fmt(doc.get('hardware'))})"),
        ("steady window (steps)", fmt(doc.get("window"))), ("warm-up (steps, skipped)", fmt(doc.get("warmup"))),
        ("step time s (median)", fmt(doc.get("step_time_s")))) if value.strip(" /()")]
    if doc.get("target") is not None:
        rows.append(["target TPS/card", fmt(doc["target"])])
    if roof.get("tps_per_card_limit") and doc.get("tps_per_card"):
        rows.append(["roofline TPS/card", f"{roof['tps_per_card_limit']:.1f} (measured "
                     f"{doc['tps_per_card'] / roof['tps_per_card_limit']:.1%} of it; peak "
                     f"{fmt(roof.get('peak_tflops_per_card'))} TFLOPS/card: {fmt(roof.get('peak_source'))})"])
    out = [render("<h3>{{ n }}</h3>", n=nodeid), table(["figure", "value"], rows)]
    if doc.get("phases"):
        out.append(table(["phase", "seconds (median)", "share of step"],
                         [[p["name"], fmt(p["seconds"]), f"{p['share']:.1%}"] for p in doc["phases"]]))
        out.append(img(plot_phases(doc["phases"]), f"step phases {nodeid}"))
    if doc.get("per_step"):
        out.append(img(plot_throughput(doc), f"TPS per step {nodeid}"))
    return out


def _graph_mode(nodeid: str, doc: dict) -> list[Markup]:
    rows = [[mode, fmt(doc[mode].get("median_tps")), fmt(doc[mode].get("best_tps")), len(doc[mode]["seconds"])]
            for mode in ("eager", "graph")]
    interval = doc.get("speedup_interval")  # paired rounds' interval (the verdict's statistic); absent in older reports
    bound = (f"{interval['confidence']:.0%} interval {interval['low']:.2f}-{interval['high']:.2f}x over "
             f"{interval['n']} pairs") if isinstance(interval, dict) and all(
        finite(interval.get(k)) for k in ("low", "high", "confidence", "n")) else ""
    rows.append(["speedup (graph / eager)", f"{doc['speedup']:.2f}x", bound, ""])
    return [render("<h3>{{ n }} ({{ p }})</h3>", n=nodeid, p=doc.get("platform", "")),
            table(["mode", "median tok/s", "best tok/s", "rounds"], rows),
            img(plot_graph_mode(doc), f"graph vs eager {nodeid}")]


def curve_state(v: dict) -> tuple[str, str]:
    """(text, css class) of one curve verdict: ok, FAIL or not judged (reports written before every N of
    reference runs was judged also say "uncalibrated": floors only, fewer than 3 runs)."""
    if v.get("passed") is True:
        return "ok", "ok"
    if v.get("passed") is False:
        return "FAIL", "FAIL"
    return ("uncalibrated", "uncalibrated") if v.get("calibrated") is False else ("not judged", "skipped")


def _curve_verdicts(nodeid: str, verdicts) -> list[Markup]:
    rows = []
    for v in verdicts if isinstance(verdicts, list) else [verdicts]:
        text, cls = curve_state(v)
        rows.append([v.get("metric", ""), v.get("statistic", ""), Cell(text, cls=cls), fmt(v.get("where", "")),
                     fmt(v.get("detail", ""))])
    return [render("<h3>{{ n }}</h3>", n=nodeid), table(["metric", "statistic", "verdict", "where", "detail"], rows)]


def _curve_failed(data: dict) -> bool:
    return bool(data.get("outside_steps")) or "FAIL" in str(data.get("verdict", ""))


def _curve_series(nodeid: str, series: dict) -> list[Markup]:
    """One plot per metric; hovering a point of this run shows its step, value and the band there (an HTML image
    map: no script, no network)."""
    out = []
    # failures first (the newcomer review found the failing curve among 26 plots titled "ok")
    for metric, data in sorted(series.items(), key=lambda kv: not _curve_failed(kv[1])):
        if not data.get("candidate_steps"):
            continue
        png, points = plot_curve(metric, data)
        band = {s: (lo, c, hi) for s, lo, c, hi in zip(data.get("steps") or (), data.get("lo") or (),
                                                       data.get("center") or (), data.get("hi") or (), strict=False)}
        name = data.get("candidate_name") or "this run"
        areas = [(f"{x:.0f},{y:.0f},5", f"{name} step {s}: {fmt(v, 6)}" + (
            f" (band {fmt(band[s][0])}\u2013{fmt(band[s][2])}, center {fmt(band[s][1])})"
            if s in band and None not in band[s] else "")) for s, v, x, y in points]
        key = hashlib.sha256(f"{nodeid}\0{metric}".encode()).hexdigest()[:12]
        out.append(img(png, f"{metric} {nodeid}", size=(round(DPI * FIGSIZE[0]), round(DPI * FIGSIZE[1])),
                       areas=areas, name=f"curve-{key}"))
    return out


def _memory(phases: list) -> list[Markup]:
    rows = [[p.get("scale", ""), p.get("phase", ""), fmt(p.get("peak_gib", "")), fmt(p.get("budget_gib", "")),
             Cell("fits", cls="ok") if p.get("fits") else Cell("exceeds", cls="FAIL")] for p in phases]
    return [table(["scale", "phase", "peak GiB", "budget GiB", "verdict"], rows), img(plot_memory(phases),
                                                                                    "memory per phase")]


def _drawn(report: RunReport, name: str, draw, strict: bool) -> list[Markup]:
    """Every test's `name` measurement drawn by `draw(nodeid, value)`; a wrong shape becomes a note and the raw
    JSON (or, strict, one BadInput line)."""
    out = []
    for nodeid, value in report.properties(name):
        try:
            out += draw(nodeid, value)
        except SHAPE_ERRORS as exc:
            if strict:
                raise BadInput(f"report {report.name}: test {nodeid} property {name!r} has the wrong shape "
                               f"({type(exc).__name__}: {str(exc)[:80]}); regenerate it") from None
            out += [render('<p class="warn">{{ n }}: {{ p }} is not in the expected shape ({{ e }}); raw JSON:</p>'
                           "<pre>{{ raw }}</pre>", n=nodeid, p=name, e=f"{type(exc).__name__}: {exc}",
                           raw=json.dumps(value, indent=1)[:4000])]
            continue
        out.append(_raw(value))
    return out


def _scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


GIB = 1 << 30


def _bytes(value) -> str | None:
    """A byte count (or {name: count}) in GiB, the unit of every memory figure of the report; None if it is none."""
    if finite(value):
        return f"{value / GIB:.3f} GiB"
    if isinstance(value, dict) and value and all(finite(x) for x in value.values()):
        return ", ".join(f"{k} {x / GIB:.3f} GiB" for k, x in value.items())
    return None


def _field(key: str, value) -> str:
    """One measurement field as a reader wants it: a `*_bytes` field in GiB (the sleep test's 1200185344 was shown
    as raw bytes), anything else by `fmt`."""
    return (_bytes(value) if str(key).endswith("_bytes") else None) or fmt(value)


def _flat(key: str, x) -> bool:
    return _scalar(x) or (isinstance(x, list) and len(x) <= 20 and all(_scalar(y) for y in x)) or (
        str(key).endswith("_bytes") and _bytes(x) is not None)


def _value(v, key: str = "") -> Markup | str:
    """A measurement readably: a scalar as text, a flat object as a small table (byte counts in GiB), anything else
    as raw JSON."""
    if _scalar(v):
        return _field(key, v)
    if isinstance(v, list) and len(v) <= 20 and all(_scalar(x) for x in v):
        return fmt(v)
    if isinstance(v, dict) and len(v) <= 30 and all(_flat(k, x) for k, x in v.items()):
        return table(["field", "value"], [[k, _field(k, x)] for k, x in v.items()]) + _raw(v)
    return _raw(v)


def _benchmarks_rows(report: RunReport) -> list[list[str]]:
    rows = []
    for t in report.tests:
        if t.benchmark:
            s = t.benchmark["stats"]
            rows.append([t.benchmark["fullname"], f"{s['median'] * 1e3:.3f}", f"{s['mean'] * 1e3:.3f}",
                         f"{s['stddev'] * 1e3:.3f}", str(s["rounds"]), f"{s['ops']:.2f}"])
    return rows


def _delta(t: TestVerdict, previous: dict[str, TestVerdict] | None) -> Cell:
    """Against the same test in the previous report of the store: outcome change first, else the time change."""
    before = (previous or {}).get(t.nodeid)
    if before is None:
        return Cell("new", v=0, cls="muted nowrap")
    if before.outcome != t.outcome:
        return Cell(f"was {before.outcome}", v=0, cls="FAIL nowrap" if t.failing else "ok nowrap")
    dt = t.duration_s - before.duration_s
    return Cell(f"{dt:+.2f} s", v=f"{dt:.3f}", cls="muted nowrap")


BODY = """<h1>{{ r.name }} <span class="badge {{ verdict }}" id="verdict">{{ verdict }}</span></h1>
<div class="tiles" id="tiles">{% for t, spark in tiles %}
<a class="tile tile-{{ t.state }}" id="tile-{{ t.key }}"{% if t.anchor in anchors %} href="#{{ t.anchor }}"{% endif %}>
<span class="tile-title">{{ t.title }}</span> <span class="{{ t.state }}">{{ t.verdict }}</span><br>
<b class="tile-number">{{ t.number }}</b>{% if spark %} {{ spark }}{% endif %}<br>
<span class="muted">{{ t.detail }}</span></a>{% endfor %}</div>
<p>{{ summary }}</p>
{% if job %}<p class="job" id="job">job: {{ job }}</p>{% endif %}
{% if failing %}<p class="rerun-all">rerun what failed: <code class="rerun">{{ rerun_all }}</code></p>{% endif %}
<h2 id="failures">Failures ({{ failing|length }})</h2>
{% for f in failing %}
<div class="failure" id="failure-{{ loop.index }}">
<p class="eline"><span class="{{ f.outcome }}">{{ f.outcome }}</span> <code>E {{ f.e_line }}</code></p>
<p class="where"><code class="nodeid">{{ f.nodeid }}</code>{% if f.test_at %} &middot; test
<code class="test-at">{{ f.test_at }}</code>{% endif %}{% if f.call_at and f.call_at != f.test_at %} &middot;
failing call <code class="call-at">{{ f.call_at }}</code>{% endif %}</p>
{% for b in f.bugs %}<p class="known">{{ b.label }} <a class="known-bug" href="#bug-{{ b.id }}">{{ b.id }}</a>:
fix: {{ b.fix }}</p>{% endfor %}
<p class="rerun-one">rerun: <code class="rerun">{{ f.rerun }}</code></p>
{% if f.traceback %}<pre class="excerpt">{{ f.excerpt }}</pre>
<details class="traceback"><summary>full traceback ({{ f.traceback.splitlines()|length }} lines)</summary>
<pre>{{ f.traceback }}</pre></details>{% endif %}
{% if f.log %}<details class="log"><summary>captured log: {{ f.log_hits }} warning/error lines of
{{ f.log_total }}</summary>{% if f.log_lines %}<pre>{{ f.log_lines|join("\n") }}</pre>{% endif %}
<details class="full-log"><summary>full captured log</summary><pre>{{ f.log }}</pre></details></details>{% endif %}
{% if findings.get(f.nodeid) %}{{ findings[f.nodeid] }}{% endif %}
{% if run_dirs.get(f.nodeid) %}<p>run directory: <a href="{{ run_dirs[f.nodeid] }}">{{ run_dirs[f.nodeid] }}</a>
</p>{% endif %}
{% if not f.traceback and not f.log %}<p class="muted">no traceback recorded (a schema 1 report, or pytest gave
none)</p>{% endif %}
</div>
{% else %}<p class="ok">none</p>{% endfor %}
<p>created {{ r.created }} &middot; commit {{ r.commit or "unknown" }}{% if r.dirty %} (dirty){% endif %}
 &middot; scale {{ r.scale or "none" }} &middot; pytest exit status {{ r.exit_status }}
{% for label, href in links %} &middot; <a href="{{ href }}">{{ label }}</a>{% endfor %}</p>
<h2 id="tests">Tests by suite</h2>
{% for s in suites %}<details class="suite"><summary>
<code{% if s.failing %} class="FAIL"{% endif %}>{{ s.name }}</code>:
{{ s.counts }}</summary>
{{ s.table }}</details>
{% endfor %}
{% if bugs %}<h2 id="known-bugs">Known bugs these failures match</h2>
{% for b in bugs %}<div class="bug" id="bug-{{ b.id }}"><h3>{{ b.id }} ({{ b.label }})</h3>
<p>{{ b.symptom }}</p><p><b>fix:</b> {{ b.fix }}</p><p class="muted">caught by {{ b.suite }}; matched: {{ b.why }};
source: {{ b.source }}; <code>ascend-rl-harness doctor</code> checks a stack and recipe for it</p></div>
{% endfor %}{% endif %}
<details class="environment" id="environment"><summary><h2>Versions and machine</h2> {{ env_line }}</summary>
<div class="grid"><div><h3>Versions</h3>{{ versions }}</div><div><h3>Machine</h3>{{ machine }}</div></div></details>
{% for title, anchor, section in sections %}{% if title in collapsed %}<details id="{{ anchor }}"><summary>
<h2>{{ title }}</h2></summary>{% else %}<h2 id="{{ anchor }}">{{ title }}</h2>{% endif %}
{% for part in section %}{{ part }}
{% endfor %}{% if title in collapsed %}</details>{% endif %}{% endfor %}
"""


def _suites(report: RunReport, previous: RunReport | None, prev_tests) -> list[dict]:
    """The test table collapsed by suite (the test's file), each with its counts: 64 rows of passes were 5.2k px of
    a 19.7k px page, above nothing a reader needed (issue 33). Every suite starts closed (its failures lead the
page already); one with a failure is listed first and in red."""
    by_file: dict[str, list[TestVerdict]] = {}
    for t in sorted(report.tests, key=lambda t: (not t.failing, t.nodeid)):
        by_file.setdefault(t.nodeid.partition("::")[0], []).append(t)
    out = []
    for name in sorted(by_file, key=lambda n: (not any(t.failing for t in by_file[n]), n)):
        tests = by_file[name]
        counts = {o: sum(t.outcome == o for t in tests) for o in OUTCOMES}
        text = ", ".join(f"{n} {o}" for o, n in counts.items() if n) + f" ({sum(t.duration_s for t in tests):.1f} s)"
        # outcome, seconds and delta never break inside a word ("pass|ed" at 1400 px): only names and reasons wrap
        rows = [Row([t.nodeid, Cell(t.outcome, cls=f"{t.outcome} nowrap"),
                     Cell(f"{t.duration_s:.2f}", v=t.duration_s, cls="nowrap"),
                     *([_delta(t, prev_tests)] if previous else []), t.reason]) for t in tests]
        out.append({"name": name, "counts": text, "failing": any(t.failing for t in tests),
                    "table": table(["test", "outcome", "seconds", *([f"\u0394 vs {previous.name}"] if previous
                                                                     else []), "reason"],
                                   rows, sortable=True, cls="verdicts")})
    return out


def render_html(report: RunReport, previous: RunReport | None = None, links: dict[str, str] | None = None,
                strict: bool = False, history=()) -> str:
    """The whole report as one HTML document (no external resources). `previous`: the report before it in the
    store (the delta column); `links`: label -> relative address (pytest.log, run directories, the trend);
    `history`: the earlier nights, oldest first (the tiles' sparklines, harness.report.tiles).

    Failures first (harness.report.failures): under the badge one block per failure with its E line, where the
    test and the failing call are, the known bug it matches, the command that reruns it, the traceback from the E
    line and the log's warnings and errors; then the tests collapsed by suite, the environment and the
    measurements."""
    verdict = "PASS" if report.passed else "FAIL"
    m = report.machine
    before = versions(previous) if previous is not None else {}
    version_rows = [Row([k, Cell(v or "-"), Cell(f"was {before[k] or '-'}" if k in before and before[k] != v else "")],
                        cls="changed" if k in before and before[k] != v else "")
                    for k, v in versions(report).items()]
    version_rows += [[p, v or "-", ""] for p, v in m.packages.items()
                     if p not in ("verl", "vllm", "vllm_ascend", "torch_npu", "mindspeed")]
    machine = table(["field", "value"], [
        ["host", m.hostname], ["platform", m.platform], ["python", m.python],
        ["device", f"{m.device_kind}: {m.device_name} x{m.device_count} (profile {m.hardware_profile})"],
        ["driver", m.driver or "-"], ["CPUs", m.cpu_count], ["command", " ".join(redact_argv(report.command))]])
    prev_tests = {t.nodeid: t for t in previous.tests} if previous is not None else None
    failing = briefs(report)
    bugs = list({b.id: b for f in failing for b in f.bugs}.values())
    findings = {t.nodeid: table(["check", "metric", "where", "message"],
                                [[f.get("check", ""), f.get("metric", ""), f.get("where", ""), f.get("message", "")]
                                 for f in t.findings if isinstance(f, dict)]) for t in report.tests
                if t.failing and t.findings}
    run_dirs = {t.nodeid: t.properties["run_dir"] for t in report.tests
                if t.failing and isinstance(t.properties.get("run_dir"), str)}
    memory = [p for _, value in report.properties("memory.phases") for p in (value if isinstance(value, list)
                                                                             else [value])]
    sections = [("Throughput", _drawn(report, "throughput", _throughput, strict)),
                ("Graph mode vs eager", _drawn(report, "throughput.graph_mode", _graph_mode, strict)),
                ("Curves", _drawn(report, "curves.verdicts", _curve_verdicts, strict)
                 + _drawn(report, "curves.series", _curve_series, strict)),
                ("Rollout correction", _drawn(report, "rollout_corr.verdicts", _curve_verdicts, strict)),
                ("Weight sync phases", _sync_phases(report))]
    try:
        sections.append(("Train-inference consistency (MoE)", _consistency(report)))
    except SHAPE_ERRORS as exc:
        if strict:
            raise BadInput(f"report {report.name}: a consistency measurement has the wrong shape ({exc}); "
                           "regenerate it") from None
        sections.append(("Train-inference consistency (MoE)", [_raw(dict(report.properties("routing.agreement")))]))
    if memory:
        try:
            sections.append(("Memory per phase", _memory(memory)))
        except SHAPE_ERRORS as exc:
            if strict:
                raise BadInput(f"report {report.name}: memory.phases has the wrong shape ({exc}); regenerate it") \
                    from None
            sections.append(("Memory per phase", [_raw(memory)]))
    bench = _benchmarks_rows(report)
    if bench:
        sections.append(("Benchmarks", [table(["benchmark", "median ms", "mean ms", "stddev ms", "rounds", "ops/s"],
                                              bench, "benchmarks", sortable=True)]))
    other = [(t.nodeid, k, v) for t in report.tests for k, v in t.properties.items() if k not in KNOWN + ("findings",)]
    if other:
        sections.append(("Other measurements", [table(["test", "property", "value"], [
            [n, k, _value(v, k)] for n, k, v in other])]))
    summary = counts_text(report) + ("" if report.tests else "; no test ran: a run without tests is a failure")
    body = render(BODY, r=report, verdict=verdict, summary=summary, job=job_text(report),
                  links=list((links or {}).items()),
                  versions=table(["package", "version", "\u0394 previous" if previous else ""], version_rows,
                                 "versions"),
                  machine=machine, failing=failing, findings=findings, run_dirs=run_dirs, bugs=bugs,
                  rerun_all=rerun_failed(report),
                  suites=_suites(report, previous, prev_tests),
                  env_line=" \u00b7 ".join([*(f"{k} {v}" for k, v in versions(report).items() if v),
                                             f"{m.device_kind}: {m.device_name}", m.hostname]),
                  sections=[(title, _anchor(title), parts) for title, parts in sections if parts],
                  collapsed=COLLAPSED, tiles=[(t, Markup(spark) if spark else None) for t, spark in
                                              with_sparklines(report, history, previous)],
                  anchors={_anchor(title) for title, parts in sections if parts})
    return page(f"{report.name}: {verdict}", body)


COLLAPSED = ("Other measurements",)  # 8.8k px of a 17.9k px green page (newcomer review, round 5)


def _anchor(title: str) -> str:
    """A section's id, the tiles' link target: `Memory per phase` -> sec-memory-per-phase."""
    return "sec-" + "-".join("".join(c if c.isalnum() else " " for c in title.lower()).split())


def _md(text) -> str:
    """A Markdown table cell or code span that cannot break out: pipes, newlines, backticks and HTML escaped
    (names reach CI comments, which render inline HTML)."""
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            .replace("`", "'").replace("\n", " "))


def _code(text, table: bool = False) -> str:
    """A Markdown code span: its text is literal (CommonMark decodes no entity inside backticks, so _md's `&gt;`
    showed as `-&gt;` in report.md, newcomer review round 5) and safe as it is (no HTML is read inside one); only a
    backtick or a newline could end it, and in a table cell a pipe."""
    text = str(text).replace("`", "'").replace("\n", " ")
    return f"`{text.replace('|', chr(92) + '|') if table else text}`"


def counts_text(report: RunReport) -> str:
    """Every outcome counted, and of how many: the page said 3 xfailed where report.md left them out (39 + 1 + 4
    of 47). One text for the page, the Markdown and the console."""
    c = report.counts
    return (f"{c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped, "
            f"{c['xfailed']} xfailed, {c['xpassed']} xpassed of {len(report.tests)} in {report.duration_s:.1f} s")


def job_text(report: RunReport) -> str | None:
    """One line naming the job a night ran and the golden it was judged against (issue 45), or None for the
    scale's own job and golden."""
    job = report.job
    if not job:
        return None

    def named(path, digest) -> str:
        return f"{path} (sha256 {digest[:12]})" if digest else str(path)

    parts = [f"recipe {named(job['recipe'], job.get('recipe_sha256'))}" if job.get("recipe")
             else f"the {report.scale or 'scale'}'s own job"]
    parts += [f"with {', '.join(job['recipe_env'])} set"] if job.get("recipe_env") else []
    parts += [f"model {job['model_path']}"] if job.get("model_path") else []
    parts += [f"golden {named(job['golden'], job.get('golden_sha256'))}" if job.get("golden")
              else "no golden given (the tier's built-in golden, where it has one)"]
    return " \u00b7 ".join(parts)


def render_markdown(report: RunReport) -> str:
    """A short summary for a CI comment: verdict, then one block per failure (E line, where, known bug, rerun),
    throughput, benchmarks."""
    lines = [f"## ascend-rl-harness {_md(report.name)}: {'✅ PASS' if report.passed else '❌ FAIL'}", "",
             f"{counts_text(report)} · scale {_code(report.scale)} · "
             f"commit {_code((report.commit or 'unknown')[:12])} · "
             f"{_md(report.machine.device_kind)} {_md(report.machine.device_name)}", ""]
    if report.job:
        lines += [_md(f"job: {job_text(report)}"), ""]
    failing = briefs(report)
    if failing:  # the page's failure blocks lead the CI summary too: the E line, where, the known bug, the rerun
        lines.append(f"rerun what failed: {_code(rerun_failed(report))}")
        lines.append("")
    for f in failing:
        where = " · ".join(part for part in (f"test {_code(f.test_at)}" if f.test_at else "",
                                             f"failing call {_code(f.call_at)}"
                                             if f.call_at and f.call_at != f.test_at else "") if part)
        # inline code through _md, not a fence: CI comments render inline HTML, and a fence's text is not escaped
        lines += [f"### {_md(f.outcome)}: {_code(f.nodeid)}", "", _code('E ' + f.e_line), ""]
        lines += [f"- {where}"] if where else []
        lines += [f"- {b.label} {_code(b.id)}: fix: {_md(b.fix)}" for b in f.bugs]
        lines += [f"- rerun: {_code(f.rerun)}", ""]
    for nodeid, doc in report.properties("throughput"):
        if not isinstance(doc, dict) or not finite(doc.get("tps_per_card")):
            continue
        roof = (doc.get("roofline") or {}).get("tps_per_card_limit") if isinstance(doc.get("roofline"), dict) else None
        lines.append(f"- throughput {_code(nodeid)}: **{doc['tps_per_card']:.1f} TPS/card**"
                     + (f" ({_md(fmt(doc['tps_per_device']))} per device, {_md(doc['devices'])} devices on "
                        f"{_md(doc['hardware'])})" if {"tps_per_device", "devices", "hardware"} <= doc.keys() else "")
                     + (f", target {_md(fmt(doc['target']))}" if doc.get("target") is not None else "")
                     + (f", roofline {_md(fmt(roof))}" if roof else ""))
    for nodeid, doc in report.properties("throughput.graph_mode"):
        if isinstance(doc, dict) and finite(doc.get("speedup")):
            lines.append(f"- graph mode vs eager {_code(nodeid)}: **{doc['speedup']:.2f}x** decode throughput")
    bench = _benchmarks_rows(report)
    if bench:
        lines += ["", "| benchmark | median ms | mean ms | stddev ms | rounds | ops/s |", "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_md(x) for x in row) + " |" for row in bench]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------------------------- trend
def _tick(r: RunReport) -> str:
    return _tex(f"{r.created[5:16].replace('T', ' ')}\n{(r.commit or '?')[:7]}")


def plot_trend(metric: Metric, reports: list[RunReport], steps: list[Step], changes: list[tuple[str, ...]],
               shrank: tuple[int, ...] = ()) -> tuple[str, list[tuple[int, float, float]]]:
    """One metric across reports (x: creation time and commit), the detected step drawn as its two segment
    medians, a dotted line where the versions changed; a night without the metric is a red x on the axis (a
    missing point was silently left out), a night that lost tests (`shrank`, report indices) a red band. Returns
    the PNG and each point's (report index, x, y) in image pixels, for the links."""
    fig, ax = _figure()
    xs = [i for i, v in enumerate(metric.values) if v is not None]
    ys = [metric.values[i] for i in xs]
    ax.plot(xs, ys, "o-", ms=4)
    missing = [i for i, v in enumerate(metric.values) if v is None]
    if missing:
        ax.plot(missing, [0.02] * len(missing), "x", color="tab:red", ms=8, transform=ax.get_xaxis_transform(),
                label="night without this metric")
    for k, i in enumerate(shrank):
        ax.axvspan(i - 0.4, i + 0.4, color="tab:red", alpha=0.12, lw=0, label=None if k else "night that lost tests")
    if missing or shrank:
        ax.legend(loc="best", fontsize=7)
    for s in steps:
        if s.metric == metric.name:
            color = "tab:red" if s.regression else "tab:green"
            ax.hlines([s.before], 0, s.index - 0.5, colors=color, linestyles=":")
            ax.hlines([s.after], s.index - 0.5, len(reports) - 1, colors=color, linestyles="--")
            ax.axvline(s.index - 0.5, color=color, alpha=0.4)
    for i, changed in enumerate(changes):
        if changed:
            ax.axvline(i - 0.5, color="tab:purple", ls=":", lw=1)
            ax.annotate(_tex(", ".join(changed)), (i - 0.5, 1), xycoords=("data", "axes fraction"), fontsize=6,
                        color="tab:purple", rotation=90, va="top", ha="right")
    every = max(1, len(reports) // 15)  # a label per night up to 15 nights, then every k-th (the links keep all)
    ticks = [i for i in range(len(reports)) if (len(reports) - 1 - i) % every == 0]  # the newest always labelled
    ax.set_xticks(ticks, [_tick(reports[i]) for i in ticks], rotation=45, fontsize=6, ha="right")
    ax.set_xlim(-0.5, len(reports) - 0.5)
    ax.set_title(_tex(metric.name), fontsize=9)
    fig.tight_layout()
    fig.canvas.draw()
    height = fig.bbox.height
    points = [(i, float(px), float(height - py)) for i, (px, py) in
              zip(xs, ax.transData.transform(list(zip(xs, ys, strict=True))), strict=True)] if xs else []
    return _png(fig, tight=False), points  # not tight: the pixel positions above must stay where they are


TREND = """<h1>trend over {{ reports|length }} nights
<span class="badge {{ verdict }}" id="verdict">{{ verdict }}</span></h1>
<p id="newest">Newest night: <b>{{ newest.name }}</b> ({{ newest.created }}, commit {{ (newest.commit or "?")[:12] }}):
<span class="{{ 'ok' if newest.passed else 'FAIL' }}">{{ "PASS" if newest.passed else "FAIL" }}</span>.
{% for reason in reasons %}<br><span class="FAIL">{{ reason }}</span>{% endfor %}</p>
<p class="muted" id="method">What is compared: a night fails when any of its tests failed (one failing test is enough),
and when it lacks a test, a suite or a metric the night before had (a red band and red crosses in the plots).
Per metric (TPS/card, wall time, each benchmark's fastest round) the best single step across the nights
is found; it is a
regression when the newer segment's median is worse than the older one's by more than {{ tolerance }} and by more
than {{ mads }} robust standard deviations of the nights' scatter (median absolute deviation), so a noisy series is
not flagged. A step needs {{ min_history }} earlier nights:
{% if judged %}
regressions are judged from night {{ min_history + 1 }} ({{ judged.name }}, {{ judged.created }}) on.
{% else %}
no night can be judged yet (that needs {{ min_history + 1 }} nights).
{% endif %}
A purple dotted line in a plot marks a change of versions.</p>
<h2>Steps</h2>{{ steps }}
<h2>Nights</h2>{{ nights }}
{% for m in plots %}<h3>{{ m.name }}</h3>
<map name="points-{{ loop.index }}">{% for a in m.areas %}
<area shape="circle" coords="{{ a.coords }}" href="{{ a.href }}" alt="{{ a.title }}" title="{{ a.title }}">
{% endfor %}</map>
<img class="trend" alt="{{ m.name }}" usemap="#points-{{ loop.index }}" src="data:image/png;base64,{{ m.png }}">
{% endfor %}
"""


def render_trend_html(reports: list[RunReport], metrics: list[Metric], steps: list[Step],
                      pages: dict[str, str] | None = None, tolerance: float = 0.05) -> str:
    """Trend page across stored reports (oldest first): the newest night's verdict, what is compared and from
    which night on, the steps, one row per night with its versions (changes marked) and one plot per metric
    whose points link to the nights' pages (`pages`: report name -> address)."""
    from harness.report.trend import MIN_HISTORY, NOISE_MADS, VERSION_COLUMNS, lost
    from harness.report.trend import verdict as trend_verdict

    pages = pages or {}
    passed, reasons = trend_verdict(reports, steps)
    verdict = "PASS" if passed else "FAIL"
    changes = version_changes(reports)
    losses = lost(reports, metrics)
    shrank = tuple(i for i, loss in enumerate(losses) if loss and loss.tests)
    step_rows = [[s.metric, s.report, fmt(s.before), fmt(s.after), f"{s.change:+.1%}", fmt(s.threshold),
                  Cell("regression" if s.regression else "improvement",
                       cls="regression" if s.regression else "improvement")] for s in steps]
    night_rows = []
    for r, changed, loss in zip(reports, changes, losses, strict=True):
        failing = sum(t.failing for t in r.tests)
        name = render('<a href="{{ h }}">{{ n }}</a>', h=pages[r.name], n=r.name) if r.name in pages else r.name
        gone = Cell(f"{len(loss.tests)} tests, {len(loss.metrics)} metrics" if loss else "",
                    v=len(loss.tests) + len(loss.metrics) if loss else 0, cls="FAIL" if loss else "")
        if loss:
            gone.text = render('<span title="{{ t }}">{{ s }}</span>', t="; ".join(loss.reasons(limit=20)), s=gone.text)
        cells = [name, r.created, (r.commit or "?")[:12], Cell("PASS" if r.passed else "FAIL",
                                                               cls="ok" if r.passed else "FAIL"),
                 Cell(len(r.tests), v=len(r.tests)), failing, gone]
        cells += [Cell(("\u25b2 " if k in changed else "") + (v or "-"), cls="changed" if k in changed else "")
                  for k, v in versions(r).items()]
        night_rows.append(Row(cells))
    plots = []
    for m in metrics:
        png, points = plot_trend(m, reports, steps, changes, shrank)
        areas = [{"coords": f"{x:.0f},{y:.0f},7", "href": pages[reports[i].name],
                  "title": f"{reports[i].name}: {fmt(m.values[i])}"} for i, x, y in points if reports[i].name in pages]
        plots.append({"name": m.name, "png": png, "areas": areas})
    body = render(TREND, reports=reports, verdict=verdict, newest=reports[-1], reasons=reasons,
                  tolerance=f"{tolerance:.0%}", mads=f"{NOISE_MADS:g}", min_history=MIN_HISTORY,
                  judged=first_judged(reports),
                  steps=table(["metric", "from night", "before", "after", "change", "counted beyond", "kind"],
                              step_rows, "steps") if steps else Markup('<p class="ok">no step beyond the noise</p>'),
                  nights=table(["night", "created", "commit", "verdict", "tests", "failing tests",
                                "lost vs the night before", *(label for label, _ in VERSION_COLUMNS)], night_rows,
                               "nights", sortable=True),
                  plots=plots)
    return page(f"trend: {verdict}", body)


def render_trend_markdown(reports: list[RunReport], steps: list[Step]) -> str:
    from harness.report.trend import verdict as trend_verdict

    passed, reasons = trend_verdict(reports, steps)
    lines = [f"## ascend-rl-harness trend over {len(reports)} reports: "
             f"{'✅ PASS' if passed else '❌ FAIL'}", ""]
    lines += [f"- {_md(r)}" for r in reasons]
    regressed = [s for s in steps if s.regression]
    lines.append("no regression" if not regressed else f"{len(regressed)} regression(s)")
    if steps:
        lines += ["", "| metric | from report | before | after | change | kind |", "|---|---|---|---|---|---|"]
        lines += [f"| {_code(s.metric, table=True)} | {_md(s.report)} | {s.before:.4g} | {s.after:.4g} | "
                  f"{s.change:+.1%} | {'regression' if s.regression else 'improvement'} |" for s in steps]
    return "\n".join(lines).rstrip() + "\n"
