"""The HTML frame every report page shares: jinja2 with autoescape (once `created`, a test's outcome,
machine.python, a benchmark's fullname and throughput fields reached the page unescaped and a script ran in
Chromium), a Content-Security-Policy that allows only this module's own style and script (by hash: an injected
<script> would not run even if escaping ever failed), and the small dependency-free script that sorts and
filters tables and opens plots full size. Without the script the page reads the same, minus those.
"""
from __future__ import annotations

import base64
import hashlib

from jinja2 import Environment, StrictUndefined
from markupsafe import Markup

CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1300px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0;max-width:100%}td,th{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top;overflow-wrap:anywhere}th{background:#f3f3f3}
.passed,.ok,.improvement{color:#1a7f37}.failed,.error,.xpassed,.FAIL,.regression{color:#cf222e;font-weight:bold}
.skipped,.xfailed,.uncalibrated,.warn{color:#9a6700}.badge{padding:3px 12px;border-radius:4px;color:#fff}
span.badge.PASS{background:#1a7f37}span.badge.FAIL{background:#cf222e;color:#fff}
pre{background:#f6f8fa;padding:8px;white-space:pre-wrap;overflow-wrap:anywhere;max-height:40em;overflow-y:auto}
img.plot{max-width:100%;cursor:zoom-in}img.plot.full{position:fixed;inset:0;margin:auto;max-width:98vw;
max-height:98vh;width:auto;height:auto;background:#fff;box-shadow:0 0 0 100vmax rgba(0,0,0,.6);cursor:zoom-out;
z-index:9}
details{margin:.4em 0}summary{cursor:pointer}.changed{background:#fff3c4}.muted{color:#666}
th.sort{cursor:pointer}th.sort:after{content:" \\2195";color:#999}input.filter{margin:.4em 0;width:20em}
.grid{display:flex;flex-wrap:wrap;gap:0 2em}.nowrap,.verdicts th{white-space:nowrap;overflow-wrap:normal}
div.failure{border-left:4px solid #cf222e;padding:.1em .8em;margin:.6em 0;background:#fff8f8}
div.failure p{margin:.25em 0}p.eline code{font-weight:bold;color:#82071e;overflow-wrap:anywhere}
pre.excerpt{max-height:16em;margin:.3em 0}code.rerun{background:#f3f3f3;padding:1px 4px;user-select:all}
summary h2{display:inline}details.suite summary code{font-weight:bold}
.tiles{display:flex;gap:.5em;margin:.4em 0}a.tile{flex:1 1 0;min-width:0;border:1px solid #ccc;border-left:6px solid
#999;border-radius:4px;padding:.3em .6em;color:#222;text-decoration:none;font-size:.9em;line-height:1.35}
a.tile-ok{border-left-color:#1a7f37}a.tile-FAIL{border-left-color:#cf222e;background:#fff8f8}
a.tile-skipped{border-left-color:#bbb}.tile-title{font-weight:600}b.tile-number{font-size:1.35em}
svg.spark{vertical-align:middle}"""

# Sorting (click a header; numbers by value via data-v), filtering (a box the script adds, so a page read
# without scripts shows no dead control) and full-size plots (click toggles; a plot's image map is scaled with it:
# the browser never scales an image map's coordinates with the image).
SCRIPT = """(function(){
function key(c){var v=c.getAttribute('data-v');return v===null?c.textContent.trim():v;}
document.querySelectorAll('table.sortable').forEach(function(t){
 var body=t.tBodies[0];
 Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){
  th.className+=' sort';th.tabIndex=0;
  th.addEventListener('click',function(){
   var asc=th.getAttribute('data-dir')!=='asc';th.setAttribute('data-dir',asc?'asc':'desc');
   Array.prototype.slice.call(body.rows).sort(function(a,b){
    var x=key(a.cells[i]),y=key(b.cells[i]),nx=parseFloat(x),ny=parseFloat(y);
    var c=(isNaN(nx)||isNaN(ny))?x.localeCompare(y):nx-ny;return asc?c:-c;
   }).forEach(function(r){body.appendChild(r);});
  });
 });
 var f=document.createElement('input');f.type='search';f.className='filter';
 f.placeholder='filter rows (text or outcome)';
 f.addEventListener('input',function(){var q=f.value.toLowerCase();
  Array.prototype.forEach.call(body.rows,function(r){r.hidden=!!q&&r.textContent.toLowerCase().indexOf(q)<0;});});
 t.parentNode.insertBefore(f,t);
});
function map(i){return i.useMap&&i.getAttribute('width')&&document.querySelector('map[name="'+i.useMap.slice(1)+'"]');}
function fit(i){var m=map(i);if(!m)return;var k=i.getBoundingClientRect().width/i.getAttribute('width');
 Array.prototype.forEach.call(m.areas,function(a){if(!a.hasAttribute('data-c'))a.setAttribute('data-c',a.coords);
  a.coords=a.getAttribute('data-c').split(',').map(function(x){return Math.round(x*k);}).join(',');});}
var plots=document.querySelectorAll('img.plot');
plots.forEach(function(i){
 function zoom(e){e.preventDefault();i.classList.toggle('full');fit(i);}
 i.addEventListener('click',zoom);fit(i);
 var m=map(i);
 if(m)Array.prototype.forEach.call(m.areas,function(a){a.addEventListener('click',zoom);});});
window.addEventListener('resize',function(){plots.forEach(fit);});
})();"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# Nothing loads from anywhere (default-src 'none'); plots are data: PNGs; only this module's style and script
# run. Links (pytest.log, report pages) are navigations, which CSP leaves alone.
CSP = (f"default-src 'none'; img-src data:; style-src {_sha256(CSS)}; script-src {_sha256(SCRIPT)}; "
       "base-uri 'none'; form-action 'none'")

FRAME = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title><style>{{ css }}</style></head>
<body>
{{ body }}
<script>{{ script }}</script>
</body></html>
"""

ENV = Environment(autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def render(template: str, **context) -> Markup:
    """A fragment rendered with autoescape: every value is escaped unless it is Markup built here."""
    return Markup(ENV.from_string(template).render(**context))


def page(title: str, body: Markup) -> str:
    """The whole self-contained document around `body`."""
    return ENV.from_string(FRAME).render(csp=CSP, title=title, css=Markup(CSS), script=Markup(SCRIPT), body=body)


IMG = """{% if areas %}<map name="{{ name }}">{% for coords, title in areas %}
<area shape="circle" coords="{{ coords }}" href="#{{ name }}" alt="{{ title }}" title="{{ title }}">
{% endfor %}</map>{% endif %}
<img class="plot"{% if name %} id="{{ name }}"{% endif %} alt="{{ alt }}" title="click: full size"
{% if size %} width="{{ size[0] }}" height="{{ size[1] }}"{% endif %}{% if areas %} usemap="#{{ name }}"{% endif %}
 src="data:image/png;base64,{{ b64 }}">"""


def img(b64: str, alt: str, *, size: tuple[int, int] | None = None, areas=(), name: str = "") -> Markup:
    """A plot. `size`: the CSS pixels it is shown at (a PNG drawn at more pixels is sharp at full size); `areas`:
    (coords "x,y,r" in those pixels, title) of points whose value shows on hover, as an image map named `name`
    (its links lead back to the plot: the page works without script)."""
    return render(IMG, alt=alt, b64=b64, size=size, areas=list(areas), name=name)


TABLE = """<table{% if id %} id="{{ id }}"{% endif %} class="{{ cls }}"><thead><tr>
{% for h in headers %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row in rows %}<tr{% if row.cls %} class="{{ row.cls }}"{% endif %}>{% for c in row.cells %}
<td{% if c.v is not none %} data-v="{{ c.v }}"{% endif %}{% if c.cls %} class="{{ c.cls }}"{% endif %}>{{ c.text }}</td>
{% endfor %}</tr>
{% endfor %}</tbody></table>"""


class Cell:
    """One table cell: `text` (escaped unless Markup), `v` the sort key, `cls` a CSS class."""

    __slots__ = ("text", "v", "cls")

    def __init__(self, text, v=None, cls: str = ""):
        self.text, self.v, self.cls = text, v, cls


class Row:
    __slots__ = ("cells", "cls")

    def __init__(self, cells, cls: str = ""):
        self.cells = [c if isinstance(c, Cell) else Cell(c) for c in cells]
        self.cls = cls


def table(headers: list[str], rows: list, table_id: str = "", sortable: bool = False, cls: str = "") -> Markup:
    rows = [r if isinstance(r, Row) else Row(r) for r in rows]
    return render(TABLE, headers=headers, rows=rows, id=table_id,
                  cls=" ".join(c for c in (cls, "sortable" if sortable else "") if c))
