"""Render a RunReport to one self-contained HTML page (plots as base64 PNG, matplotlib Agg; no external
URL, so it opens offline and in CI artifacts) and to a Markdown summary for CI comments.

Sections appear when their measurements are present (see harness.report.schema for the property names):
pass/fail table with each failure's reason, TPS per step with target and roofline, reward and
response-length curves with the baseline band, memory per phase against the budget, benchmark stats.
"""
from __future__ import annotations

import base64
import html
import io
import json

from harness.report.schema import RunReport
from harness.report.trend import Metric, Step

CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f3f3f3}.passed{color:#1a7f37}.failed,.error,.xpassed{color:#cf222e;
font-weight:bold}.skipped,.xfailed{color:#9a6700}.badge{padding:4px 12px;border-radius:4px;color:#fff}
.PASS{background:#1a7f37}.FAIL{background:#cf222e}pre{background:#f6f8fa;padding:8px;overflow:auto}
img{max-width:100%}"""


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=True)  # headless: no display on CI or the cluster head node
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(8, 3.6))


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


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
    ax.set_ylabel(f"tokens/s per card ({doc.get('hardware', '')})")
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def plot_graph_mode(doc: dict) -> str:
    """Decode tokens/s of every round, eager vs graph mode (the best round decides the verdict)."""
    fig, ax = _figure()
    for x, mode in enumerate(("eager", "graph")):
        rounds = doc[mode]
        tps = [rounds["tokens_per_round"] / s for s in rounds["seconds"]]
        ax.plot([x] * len(tps), tps, "o", alpha=0.6, label=f"{mode}: best {max(tps):.0f} tok/s")
    ax.set_xticks([0, 1], ["eager", "graph"])
    ax.set_xlim(-0.5, 1.5)
    ax.set_ylabel("decode tokens/s per round")
    ax.set_title(f"speedup {doc['speedup']:.2f}x ({doc.get('platform', '')})", fontsize=9)
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def plot_curve(metric: str, series: dict) -> str:
    """One metric per step: the baseline band (lo..hi) and center, and this run (harness.metrics.curves.band_series)."""
    fig, ax = _figure()
    if series.get("steps") and series.get("lo") and series.get("hi"):
        ax.fill_between(series["steps"], series["lo"], series["hi"], color="tab:blue", alpha=0.2, label="baseline band")
    if series.get("steps") and series.get("center"):
        ax.plot(series["steps"], series["center"], color="tab:blue", lw=1, label="baseline center")
    values = [float("nan") if v is None else v for v in series.get("candidate", [])]
    ax.plot(series.get("candidate_steps", []), values, "o-", color="tab:orange", ms=3, label="this run")
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def plot_memory(phases: list[dict]) -> str:
    """Peak GiB per phase (stacked components when given) against the device budget."""
    fig, ax = _figure()
    labels = [f"{p.get('scale', '')}\n{p.get('phase', '?')}" for p in phases]
    xs = range(len(phases))
    components = sorted({c for p in phases for c in (p.get("components_gib") or {})})
    if components:
        bottom = [0.0] * len(phases)
        for comp in components:
            vals = [float((p.get("components_gib") or {}).get(comp, 0.0)) for p in phases]
            ax.bar(xs, vals, bottom=bottom, label=comp)
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


def _table(headers: list[str], rows: list[list[str]], table_id: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value, digits: int = 4) -> str:
    return f"{value:.{digits}g}" if isinstance(value, float) else html.escape(str(value))


def _throughput_html(report: RunReport) -> list[str]:
    out = []
    for nodeid, doc in report.properties("throughput"):
        if not isinstance(doc, dict):
            continue
        out.append(f"<h3>{html.escape(nodeid)}</h3>")
        roof = doc.get("roofline") or {}
        rows = [[label, value] for label, value in (
            ("TPS/card (median, steady window)", _fmt(doc.get("tps_per_card", ""))),
            ("TPS/device (verl perf/throughput)", _fmt(doc.get("tps_per_device", ""))),
            ("devices / cards", f"{doc.get('devices', '')} / {doc.get('cards', '')} "
                                f"({html.escape(str(doc.get('hardware', '')))})"),
            ("window / warm-up steps", f"{doc.get('window', '')} / {doc.get('warmup', '')}"),
            ("step time s (median)", _fmt(doc.get("step_time_s", "")))) if value.strip(" /()[]")]
        if doc.get("target") is not None:
            rows.append(["target TPS/card", _fmt(doc["target"])])
        if roof.get("tps_per_card_limit") and doc.get("tps_per_card"):
            rows.append(["roofline TPS/card", f"{roof['tps_per_card_limit']:.1f} (measured "
                         f"{doc['tps_per_card'] / roof['tps_per_card_limit']:.1%} of it; peak "
                         f"{roof['peak_tflops_per_card']:g} TFLOPS/card: {html.escape(roof['peak_source'])})"])
        out.append(_table(["figure", "value"], rows))
        if doc.get("phases"):
            out.append(_table(["phase", "seconds (median)", "share of step"],
                              [[html.escape(p["name"]), _fmt(p["seconds"]), f"{p['share']:.1%}"]
                               for p in doc["phases"]]))
        if doc.get("per_step"):
            out.append(_img(plot_throughput(doc), f"TPS per step {nodeid}"))
    return out


def _graph_mode_html(report: RunReport) -> list[str]:
    rows = []
    for nodeid, doc in report.properties("throughput.graph_mode"):
        if isinstance(doc, dict) and {"eager", "graph", "speedup"} <= doc.keys():
            rows.append([html.escape(nodeid), html.escape(str(doc.get("platform", ""))),
                         f"{doc['eager']['best_tps']:.1f} / {doc['eager']['median_tps']:.1f}",
                         f"{doc['graph']['best_tps']:.1f} / {doc['graph']['median_tps']:.1f}",
                         f"{doc['speedup']:.2f}x"])
            rows[-1].append(_img(plot_graph_mode(doc), f"graph vs eager {nodeid}"))
    return [_table(["test", "platform", "eager tok/s best / median", "graph tok/s best / median", "speedup",
                    "rounds"], rows, "graph-mode")] if rows else []


def _curves_html(report: RunReport) -> list[str]:
    out = []
    for nodeid, verdicts in report.properties("curves.verdicts"):
        rows = [[html.escape(str(v.get("metric", ""))), html.escape(str(v.get("statistic", ""))),
                 {True: '<span class="passed">ok</span>', False: '<span class="failed">FAIL</span>'}.get(
                     v.get("passed"), '<span class="skipped">not evaluated</span>'),
                 html.escape(str(v.get("where", ""))), html.escape(str(v.get("detail", "")))]
                for v in (verdicts if isinstance(verdicts, list) else [verdicts]) if isinstance(v, dict)]
        if rows:
            out += [f"<h3>{html.escape(nodeid)}</h3>",
                    _table(["metric", "statistic", "verdict", "where", "detail"], rows)]
    for nodeid, series in report.properties("curves.series"):
        for metric, data in (series.items() if isinstance(series, dict) else ()):
            if isinstance(data, dict) and data.get("candidate_steps"):
                out.append(_img(plot_curve(metric, data), f"{metric} {nodeid}"))
    return out


def _memory_html(report: RunReport) -> list[str]:
    phases = [p for _, value in report.properties("memory.phases")
              for p in (value if isinstance(value, list) else [value])]
    if not phases:
        return []
    rows = [[html.escape(str(p.get("scale", ""))), html.escape(str(p.get("phase", ""))), _fmt(p.get("peak_gib", "")),
             _fmt(p.get("budget_gib", "")), '<span class="passed">fits</span>' if p.get("fits") else
             '<span class="failed">exceeds</span>'] for p in phases]
    return [_table(["scale", "phase", "peak GiB", "budget GiB", "verdict"], rows),
            _img(plot_memory(phases), "memory per phase")]


def _benchmarks_rows(report: RunReport) -> list[list[str]]:
    rows = []
    for t in report.tests:
        if t.benchmark:
            s = t.benchmark["stats"]
            rows.append([t.benchmark["fullname"], f"{s['median'] * 1e3:.3f}", f"{s['mean'] * 1e3:.3f}",
                         f"{s['stddev'] * 1e3:.3f}", str(s["rounds"]), f"{s['ops']:.2f}"])
    return rows


def render_html(report: RunReport) -> str:
    """The whole report as one HTML document (no external resources)."""
    verdict = "PASS" if report.passed else "FAIL"
    c = report.counts
    m = report.machine
    parts = [f"<h1>ascend-rl-harness report: {html.escape(report.name)} "
             f'<span class="badge {verdict}" id="verdict">{verdict}</span></h1>',
             f"<p>{c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped, "
             f"{c['xfailed']} xfailed, {c['xpassed']} xpassed in {report.duration_s:.1f} s; created {report.created}; "
             f"commit {html.escape(str(report.commit))}{' (dirty)' if report.dirty else ''}; scale "
             f"{html.escape(str(report.scale))}; pytest exit status {report.exit_status}</p>",
             "<h2>Verdicts</h2>",
             _table(["test", "outcome", "seconds", "reason"],
                    [[html.escape(t.nodeid), f'<span class="{t.outcome}">{t.outcome}</span>', f"{t.duration_s:.2f}",
                      html.escape(t.reason)] for t in sorted(report.tests, key=lambda t: (not t.failing, t.nodeid))],
                    "verdicts")]
    for title, section in (("Throughput", _throughput_html(report)), ("Graph mode vs eager", _graph_mode_html(report)),
                           ("Curves", _curves_html(report)),
                           ("Memory per phase", _memory_html(report))):
        if section:
            parts += [f"<h2>{title}</h2>", *section]
    bench = _benchmarks_rows(report)
    if bench:
        parts += ["<h2>Benchmarks</h2>", _table(["benchmark", "median ms", "mean ms", "stddev ms", "rounds", "ops/s"],
                                                 bench, "benchmarks")]
    known = {"throughput", "throughput.graph_mode", "curves.verdicts", "curves.series", "memory.phases"}
    other = [[html.escape(t.nodeid), html.escape(k), f"<pre>{html.escape(json.dumps(v, indent=1)[:4000])}</pre>"]
             for t in report.tests for k, v in t.properties.items() if k not in known]
    if other:
        parts += ["<h2>Other measurements</h2>", _table(["test", "property", "value"], other)]
    parts += ["<h2>Machine</h2>", _table(["field", "value"], [
        ["host", html.escape(m.hostname)], ["platform", html.escape(m.platform)], ["python", m.python],
        ["device", html.escape(f"{m.device_kind}: {m.device_name} x{m.device_count} (profile {m.hardware_profile})")],
        ["driver", html.escape(str(m.driver))], ["CANN", html.escape(str(m.cann))],
        *[[html.escape(p), html.escape(str(v))] for p, v in m.packages.items()]])]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(report.name)}: {verdict}</title><style>{CSS}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: RunReport) -> str:
    """A short summary for a CI comment: verdict, failures with reasons, throughput, benchmarks."""
    c = report.counts
    lines = [f"## ascend-rl-harness {report.name}: {'✅ PASS' if report.passed else '❌ FAIL'}", "",
             f"{c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped in "
             f"{report.duration_s:.1f} s · scale `{report.scale}` · commit `{(report.commit or 'unknown')[:12]}` · "
             f"{report.machine.device_kind} {report.machine.device_name}", ""]
    failing = [t for t in report.tests if t.failing]
    if failing:
        lines += ["| failing test | outcome | reason |", "|---|---|---|"]
        lines += [f"| `{_md_cell(t.nodeid)}` | {t.outcome} | {_md_cell(t.reason)} |" for t in failing]
        lines.append("")
    for nodeid, doc in report.properties("throughput"):
        roof = (doc.get("roofline") or {}).get("tps_per_card_limit")
        if not isinstance(doc.get("tps_per_card"), (int, float)):
            continue
        lines.append(f"- throughput `{_md_cell(nodeid)}`: **{doc['tps_per_card']:.1f} TPS/card**"
                     + (f" ({doc['tps_per_device']:.1f} per device, {doc['devices']} devices on {doc['hardware']})"
                        if {"tps_per_device", "devices", "hardware"} <= doc.keys() else "")
                     + (f", target {doc['target']:g}" if doc.get("target") is not None else "")
                     + (f", roofline {roof:.0f}" if roof else ""))
    for nodeid, doc in report.properties("throughput.graph_mode"):
        if isinstance(doc, dict) and "speedup" in doc:
            lines.append(f"- graph mode vs eager `{_md_cell(nodeid)}`: **{doc['speedup']:.2f}x** decode throughput")
    bench = _benchmarks_rows(report)
    if bench:
        lines += ["", "| benchmark | median ms | mean ms | stddev ms | rounds | ops/s |", "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_md_cell(x) for x in row) + " |" for row in bench]
    return "\n".join(lines).rstrip() + "\n"


def plot_trend(metric: Metric, reports: list[RunReport], steps: list[Step]) -> str:
    """One metric across reports, the detected step drawn as its two segment medians."""
    fig, ax = _figure()
    xs = [i for i, v in enumerate(metric.values) if v is not None]
    ax.plot(xs, [metric.values[i] for i in xs], "o-", ms=3)
    for s in steps:
        if s.metric == metric.name:
            color = "tab:red" if s.regression else "tab:green"
            ax.hlines([s.before], 0, s.index - 0.5, colors=color, linestyles=":")
            ax.hlines([s.after], s.index - 0.5, len(reports) - 1, colors=color, linestyles="--")
            ax.axvline(s.index - 0.5, color=color, alpha=0.4)
    ax.set_xticks(range(len(reports)), [r.created[:10] for r in reports], rotation=45, fontsize=7)
    ax.set_title(metric.name, fontsize=9)
    return _png(fig)


def render_trend_html(reports: list[RunReport], metrics: list[Metric], steps: list[Step]) -> str:
    """Trend page across stored reports (oldest first): step table and one plot per metric (computed by
    harness.report.trend)."""
    regressed = [s for s in steps if s.regression]
    verdict = "FAIL" if regressed else "PASS"
    rows = [[html.escape(s.metric), html.escape(s.report), _fmt(s.before), _fmt(s.after), f"{s.change:+.1%}",
             '<span class="failed">regression</span>' if s.regression else '<span class="passed">improvement</span>']
            for s in steps]
    parts = [f'<h1>ascend-rl-harness trend over {len(reports)} reports <span class="badge {verdict}" id="verdict">'
             f"{verdict}</span></h1>",
             "<h2>Steps</h2>", _table(["metric", "from report", "before", "after", "change", "kind"], rows, "verdicts"),
             "<h2>Reports</h2>", _table(["report", "created", "commit", "verdict"], [
                 [html.escape(r.name), r.created, html.escape(str(r.commit)[:12]), "PASS" if r.passed else "FAIL"]
                 for r in reports])]
    for m in metrics:
        parts.append(_img(plot_trend(m, reports, steps), m.name))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>trend: "
            f"{verdict}</title><style>{CSS}</style></head><body>" + "\n".join(parts) + "</body></html>\n")


def render_trend_markdown(reports: list[RunReport], steps: list[Step]) -> str:
    regressed = [s for s in steps if s.regression]
    lines = [f"## ascend-rl-harness trend over {len(reports)} reports: "
             f"{'❌ ' + str(len(regressed)) + ' regression(s)' if regressed else '✅ no regression'}", ""]
    if steps:
        lines += ["| metric | from report | before | after | change | kind |", "|---|---|---|---|---|---|"]
        lines += [f"| `{_md_cell(s.metric)}` | {_md_cell(s.report)} | {s.before:.4g} | {s.after:.4g} | "
                  f"{s.change:+.1%} | {'regression' if s.regression else 'improvement'} |" for s in steps]
    return "\n".join(lines).rstrip() + "\n"
