"""`whale report RUN_DIR`: one self-contained HTML file of a run (adapt, search, cotrain,
train-proposer, or a single eval).

The page leads with the answer (report_lead.py builds it per run kind): the held-out reading
before and after as k/n with its 95% Wilson interval (seed -> final; per cotrain schedule base
-> final with the training rollouts it cost), the edits that were kept with their diffs and
hypotheses, and the run's curve. Then the lineage, the other curves, metrics, proposer
compliance, every diff, the audit and the split reads; the raw config and summary.json last,
collapsed. Every float is shown rounded (`report_data.human`: never more than 4 decimals).

The file opens from disk with no server and no network: CSS is inline, every curve is a
matplotlib PNG (Agg canvas, no pyplot) embedded as a data: URI, diffs sit in <details>, and
there is no script and no external URL. Everything quoted from the run (harness sources and
diffs, reasons, hypotheses, config values) is hostile text and goes through `html.escape`, so a
harness holding `</pre><script>` shows as text. What could not be read is a visible note in
its section (report_data.py / report_runs.py collect them), never a crash.

The lineage tree is drawn without recursion and each node once, whatever the parent links
say: nodes no root reaches (a parent cycle, a node naming itself, a parent id that names no
node) are drawn under an "unreachable" root with a note, and a chain deeper than MAX_DEPTH
continues in a flat list. Every `id="node-..."` attribute is unique on the page (a repeat,
e.g. the same round id in two lineages, gets a `-k` suffix).

The audit section is `whale.analysis.audit.audit_run(run_dir).to_json()`, imported lazily; a
caller may pass the audit dict instead (`audit=`), and when the module is missing or fails the
section says so. Not covered: interactive views (no JS by design); images other than the
curves collected for the run's kind.
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any

from whale.analysis.report_data import (
    Curve,
    Lead,
    Lineage,
    Node,
    Reading,
    RunData,
    Table,
    human,
)
from whale.analysis.report_runs import load_run
from whale.records import write_atomic
from whale.stats import wilson_ci

CSS = """
body{font-family:sans-serif;margin:1.5em;max-width:1200px;color:#222}
h1{font-size:1.5em} h2{border-bottom:1px solid #ccc;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3} ul.tree{list-style:none;padding-left:1.2em;border-left:1px dotted #aaa}
.node{font-family:monospace} .valid{color:#17632a} .invalid{color:#a3171b}
.kept{font-weight:bold;background:#fff6bf} .note{color:#8a4b00;background:#fff3e0;padding:2px 6px}
pre{background:#f7f7f7;padding:6px;overflow-x:auto;font-size:.85em;white-space:pre-wrap}
img{max-width:100%;border:1px solid #ddd}
ul.answer{font-size:1.1em} ul.answer li{margin:.3em 0} .what{color:#555}
blockquote.hypothesis{white-space:pre-wrap;border-left:3px solid #9ab;margin:.4em 0;
padding-left:8px}
"""


MAX_DEPTH = 100  # nesting of the lineage tree at most; deeper nodes continue in a flat list
SECTIONS = ("answer", "lineage", "curves", "metrics", "compliance", "diffs", "audit", "reads",
            "config")  # fmt: skip
KEY_CONFIG = ("task.id", "harness", "operator", "schedules", "rollouts", "rounds", "g",
              "iterations", "m", "select", "solver.name", "proposer.name", "proposer", "phases",
              "seed", "train", "search", "eval", "score", "feedback")  # fmt: skip


def e(v: Any) -> str:
    """Escaped text of any value (None shows as "-", floats as `human` rounds them)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return human(v)
    return html.escape(str(v), quote=True)


def _acc(p: float, n: int | None) -> str:
    """An accuracy to 2 decimals (3 from n > 200, where a question moves it by < 0.005)."""
    return f"{p:.3f}" if n is not None and n > 200 else f"{p:.2f}"


def reading_text(r: Reading) -> str:
    """`k/n (accuracy, 95% CI lo–hi)` (Wilson), or the accuracy alone where k is unknown."""
    if r.k is not None and r.n is not None:
        lo, hi = wilson_ci(r.k, r.n)
        return (f"{r.k}/{r.n} ({_acc(r.k / r.n, r.n)}, 95% CI {_acc(lo, r.n)}\u2013"
                f"{_acc(hi, r.n)})")  # fmt: skip
    if r.accuracy is not None:
        return _acc(r.accuracy, r.n) + (f" of {r.n} (k not a whole number)" if r.n else "")
    return "not recorded"


def png_data_uri(curve: Curve) -> str:
    """The curve drawn with the Agg canvas, as a data:image/png;base64 URI."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, pts in curve.series.items():
        style = "o" if name == "candidates" else "o-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name)
    ax.set_xlabel(curve.xlabel)
    ax.set_ylabel(curve.ylabel)
    ax.set_title(curve.title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _notes(data: RunData, section: str) -> str:
    return "".join(f'<p class="note">note: {e(n)}</p>' for n in data.notes.get(section, []))


def _table(t: Table) -> str:
    head = "".join(f"<th>{e(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in t.rows)
    empty = "" if t.rows else '<p class="note">note: no rows</p>'
    return f"<h3>{e(t.title)}</h3><table><tr>{head}</tr>{body}</table>{empty}"


def _html_id(nid: str, used: set[str]) -> str:
    """A page-unique id attribute for node `nid` (whitespace, which ids may not hold, -> _)."""
    base = "node-" + re.sub(r"\s", "_", nid)
    out, k = base, 1
    while out in used:
        k += 1
        out = f"{base}-{k}"
    used.add(out)
    return out


def _node_line(n: Node, mark: str, used: set[str], parent_shown: bool = False) -> str:
    state = ('<span class="valid">valid</span>' if n.valid
             else f'<span class="invalid">invalid: {e(n.reason) or "-"}</span>')  # fmt: skip
    cls = "node kept" if n.kept else "node"
    kept = f" [{e(mark)}]" if n.kept else ""
    parent = f" parent={e(n.parent)}" if parent_shown else ""
    return (f'<span class="{cls}" id="{e(_html_id(n.id, used))}">{e(n.id)} {e(n.hash)} '
            f"score={e(n.score)} ({e(n.label)}){parent}{kept}</span> {state}")  # fmt: skip


def _tree(lin: Lineage, used: set[str] | None = None) -> str:
    """The nested list of `lin` (see the module docstring); `used`: id attributes taken."""
    if not lin.nodes:
        return '<p class="note">note: no candidate</p>'
    used = set() if used is None else used
    ids = {n.id for n in lin.nodes}
    children: dict[str, list[Node]] = {}
    for n in lin.nodes:
        if n.parent is not None:
            children.setdefault(n.parent, []).append(n)
    drawn: set[int] = set()  # id() of the nodes already drawn: each node once
    deferred: list[Node] = []  # reached below MAX_DEPTH: drawn again from a flat list

    def draw(top: list[Node], parent_shown: bool = False) -> str:
        out = ['<ul class="tree">']
        stack = [iter(top)]  # one iterator per open <ul>
        while stack:
            n = next(stack[-1], None)
            if n is None:
                stack.pop()
                out.append("</ul></li>" if stack else "</ul>")
                continue
            if id(n) in drawn:
                continue
            drawn.add(id(n))
            line = _node_line(n, lin.mark, used, parent_shown and len(stack) == 1)
            out.append(f'<li class="lineage-node">{line}')
            kids = [k for k in children.get(n.id, []) if id(k) not in drawn]
            if kids and len(stack) >= MAX_DEPTH:
                deferred.extend(kids)
                kids = []
            if kids:
                out.append('<ul class="tree">')
                stack.append(iter(kids))
            else:
                out.append("</li>")
        return "".join(out)

    def continued() -> str:
        out = []
        while deferred:
            batch, deferred[:] = list(deferred), []
            out.append(f'<p class="note">note: deeper than {MAX_DEPTH} levels, continued '
                       "(each first node with its parent)</p>" + draw(batch, True))  # fmt: skip
        return "".join(out)

    parts = [draw([n for n in lin.nodes if n.parent is None]), continued()]
    lost = [n for n in lin.nodes if id(n) not in drawn]
    if lost:
        missing = sum(n.parent not in ids for n in lost)
        parts.append(
            f'<p class="note">note: {len(lost)} candidate(s) no root reaches ({missing} with a '
            "parent id that names no candidate, the others in a parent cycle or below one): "
            "drawn under the unreachable root</p>"
            '<ul class="tree"><li class="lineage-node"><span class="node">unreachable (parent '
            f"cycle or missing parent)</span>{draw(lost, True)}</li></ul>" + continued()
        )
    return "".join(parts)


def _diffs(lin: Lineage) -> str:
    out: list[str] = []
    for n in lin.nodes:
        if n.parent is None:
            continue
        body = (f'<pre class="diff">{e(n.diff)}</pre>' if n.diff else
                '<p class="note">note: no diff (no source: the edits did not apply, or the '
                "parent's source is missing)</p>")  # fmt: skip
        opened = " open" if not out else ""  # the first diff shows without a click
        out.append(f"<details{opened}><summary>{e(n.id)} ({e(n.label)}) against its parent "
                   f"{e(n.parent)}</summary>{body}</details>")  # fmt: skip
    return "".join(out)


def _audit(run_dir: Path, audit: dict[str, Any] | None) -> str:
    if audit is None:
        import importlib

        try:
            audit_mod = importlib.import_module("whale.analysis.audit")  # may not be installed
        except ImportError:
            return '<p class="note">note: the audit module (whale.analysis.audit) is missing</p>'
        try:
            audit = audit_mod.audit_run(run_dir).to_json()
        except Exception as ex:  # a hostile run may break the audit: say so, keep the report
            return f'<p class="note">note: the audit failed: {e(type(ex).__name__)}: {e(ex)}</p>'
    if not isinstance(audit, dict):
        return '<p class="note">note: the audit is not an object</p>'
    hs = [h for h in audit.get("harnesses") or [] if isinstance(h, dict)]
    parts = [
        _table(
            Table(
                "harness classes",
                ["hash", "family", "class", "structural", "functional", "evidence"],
                [
                    [
                        h.get("hash"),
                        h.get("family"),
                        h.get("class"),
                        ", ".join(map(str, h.get("structural") or [])),
                        h.get("functional"),
                        "; ".join(map(str, h.get("evidence") or [])),
                    ]
                    for h in hs
                ],
            )
        )
    ]
    counts: dict[str, Any] = audit["counts"] if isinstance(audit.get("counts"), dict) else {}
    crow = [[fam, cls, n] for fam, by in counts.items() if isinstance(by, dict)
            for cls, n in by.items()]  # fmt: skip
    parts.append(_table(Table("counts per family", ["family", "class", "n"], crow)))
    sc = [s for s in audit.get("screens") or [] if isinstance(s, dict)]
    parts.append(
        _table(
            Table(
                "screens",
                ["hash", "screen", "passed", "evidence"],
                [
                    [
                        s.get("hash"),
                        s.get("screen"),
                        s.get("passed"),
                        "; ".join(map(str, s.get("evidence") or [])),
                    ]
                    for s in sc
                ],
            )
        )
    )
    return "".join(parts)  # fmt: skip


def _figure(c: Curve) -> str:
    return (f'<figure><img class="curve" alt="{e(c.title)}" src="{png_data_uri(c)}">'
            f"<figcaption>{e(c.title)}</figcaption></figure>")  # fmt: skip


def _answer(data: RunData, lead: Lead) -> str:
    """The lead: what was read, a line per reading, the kept edits, the lead's curves."""
    p = [f'<p class="what">{e(lead.what)}</p>']
    if lead.context:
        p.append("<p>" + " &middot; ".join(f"{e(k)} <b>{e(v)}</b>" for k, v in lead.context)
                 + "</p>")  # fmt: skip
    items = []
    for line in lead.lines:
        steps = " &rarr; ".join(f"{e(name)} <b>{e(reading_text(r))}</b>" for name, r in line.steps)
        extra = "".join(f"; {e(x)}" for x in line.extra)
        items.append(f"<li><b>{e(line.label)}</b>{': ' + steps if steps else ''}{extra}</li>")
    if items:
        p.append('<ul class="answer">' + "".join(items) + "</ul>")
    p += [f'<p class="note">note: {e(n)}</p>' for n in lead.notes] + [_notes(data, "answer")]
    if lead.changes:
        p.append(f"<h3>{e(lead.changes_title)}</h3>")
    for c in lead.changes:
        p.append(f'<div class="change"><h4>{e(c.title)}</h4>')
        p.append(
            f'<blockquote class="hypothesis">hypothesis: {e(c.hypothesis)}</blockquote>'
            if c.hypothesis
            else '<p class="note">note: no hypothesis recorded</p>'
            if c.proposed
            else ""
        )
        if c.why:
            p.append(f"<p>kept because: {e(c.why)}</p>")
        p.append(f'<details open><summary>diff</summary><pre class="diff">{e(c.diff)}</pre>'
                 "</details></div>" if c.diff else
                 '<p class="note">note: no diff (a source is missing)</p></div>')  # fmt: skip
    if lead.curves:
        p.append("<h3>Curve</h3>")
        p += [_figure(data.curves[i]) for i in lead.curves]
    return "".join(p)


def _records(data: RunData) -> str:
    """The raw config and summary.json, collapsed: last on the page, for who needs them."""
    p = ['<h2 id="config">Config and records</h2>' + _notes(data, "config")]
    if data.config:
        key = [list(kv) for kv in data.config if kv[0] in KEY_CONFIG]
        whole = [list(kv) for kv in data.config]
        p.append(
            "<details><summary>config.toml: the main keys</summary>"
            + _table(Table("config (main keys)", ["key", "value"], key))
            + "</details>"
            "<details><summary>the whole config.toml</summary>"
            + _table(Table("config.toml", ["key", "value"], whole))
            + "</details>"
        )
    if data.summary:
        rows = [list(kv) for kv in data.summary]
        p.append(
            "<details><summary>summary.json (numbers rounded)</summary>"
            + _table(Table("summary.json", ["key", "value"], rows))
            + "</details>"
        )
    return "".join(p)


def render_html(data: RunData, audit_html: str) -> str:
    """The whole page of `data` (audit section already rendered): the answer first, then the
    lineage, curves, metrics, compliance, diffs, audit and split reads, the raw records last."""
    p = [f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>whale report: "
         f"{e(data.run_dir.name)}</title><style>{CSS}</style></head><body>",
         f"<h1>whale report: {e(data.run_dir)}</h1><p>run kind: <b id=\"run-kind\">"
         f"{e(data.kind)}</b></p>"]  # fmt: skip
    p.append("<p>" + " | ".join(f'<a href="#{a}">{a}</a>' for a in SECTIONS) + "</p>")
    p.append('<h2 id="answer">Result</h2>')
    if data.lead is not None:
        p.append(_answer(data, data.lead))
    else:
        p.append('<p class="note">note: no result: the run kind is unknown</p>'
                 + _notes(data, "answer"))  # fmt: skip
    p.append('<h2 id="lineage">Lineage</h2>' + _notes(data, "lineage"))
    used: set[str] = set()  # id attributes of the page's nodes, unique across lineages
    for lin in data.lineages:
        p.append(f'<h3>{e(lin.title)}</h3><div class="lineage">{_tree(lin, used)}</div>')
    p.append('<h2 id="curves">Curves</h2>' + _notes(data, "curves"))
    in_lead = set(data.lead.curves) if data.lead is not None else set()
    if in_lead:
        p.append('<p>The result\'s curve is drawn in <a href="#answer">the result</a>.</p>')
    p += [_figure(c) for i, c in enumerate(data.curves) if i not in in_lead]
    if not data.curves:
        p.append('<p class="note">note: no curve could be drawn from this run</p>')
    p.append('<h2 id="metrics">Capability metrics</h2>' + _notes(data, "metrics"))
    p += [_table(t) for t in data.metrics]
    p.append('<h2 id="compliance">Proposer format compliance</h2>' + _notes(data, "compliance"))
    p += [_table(t) for t in data.compliance]
    if not data.compliance:
        p.append('<p class="note">note: no proposal record in this run</p>')
    p.append('<h2 id="diffs">Diffs against the parent</h2>')
    for lin in data.lineages:
        p.append(f"<h3>{e(lin.title)}</h3>{_diffs(lin)}")
    p.append(f'<h2 id="audit">Audit and screens</h2>{audit_html}')
    p.append('<h2 id="reads">Split audit: what was read when</h2>' + _notes(data, "reads"))
    if data.reads is not None:
        p.append(_table(data.reads))
    p.append(_records(data))
    p.append("</body></html>\n")
    return "\n".join(p)


def build_report(run_dir: Path, *, out: Path | None = None,
                 audit: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """Write the report of `run_dir` to `out` (default RUN_DIR/report.html), atomically; return
    its path. `audit`: the audit dict to show instead of running audit_run."""
    data = load_run(run_dir)
    page = render_html(data, _audit(run_dir, audit))
    path = out or run_dir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, page, errors="backslashreplace")
    return path
