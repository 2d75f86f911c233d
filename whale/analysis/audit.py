"""Structural audit: what kind of program each harness of a run is, from its syntax tree and its
recorded trajectories. Nothing is executed: the source is parsed, and `run` is walked by a
small abstract interpreter that follows where values come from.

The walk starts at `run(question, env)`, steps into calls of functions the module defines
(inlined, up to `audit_flow.MAX_DEPTH` deep, recursion cut), walks every loop body twice (so
that values carried from one iteration to the next are seen) and comprehensions as loops. Each
value carries labels: "llm" (derived from an `x.llm(...)` reply), "ret" (from
`x.tools.retrieve`), "py" (from `x.tools.python`), "summary" (a model reply whose prompt held
retrieved passages), "h:NAME" (the result of a call to NAME, a module function that makes no
`env` call: a helper). Labels flow through assignments, expressions, calls of unknown functions
(arguments to result) and mutation (`messages.append(x)`, `d[k] = x`, `s += x`); they are never
removed. A sink is a call of `.llm`, `.tools.python`, `.tools.retrieve` (or any other
`.tools.X`), recorded with the labels of its arguments and the loops around it (those of the
callers included). An answer check is an `if` whose test carries model or tool output and whose
branch breaks, continues or returns, or a `while` whose test carries such output.

Classes, in priority order (the first that applies):
1. unparseable: the source does not parse, is over `MAX_SOURCE_CHARS`, or cannot be read.
2. no_solver: no model call reachable from `run` (the last top-level `def run`: the one Python
   binds), or trajectories exist and none made a model call. When the AST sees no model call
   but trajectories made some (an alias, a lambda, a method of a class), the trajectories win:
   retry_loop when some run made more than one call, else single_call, with the evidence
   "model called through a path the AST does not see".
3. multihop_summaries: retrieval happens more than once (two call sites, or one in a loop)
   and a model call's prompt holds "summary" text: model-written notes carried between hops.
4. multihop_passages: retrieval happens more than once and retrieved passages ("ret") reach a
   model prompt, with no summary carried.
5. composed_tool_loop: a tool loop (a loop holding a model call and a tool call) calls a helper
   inside it whose result reaches a model prompt in that loop, or a tool call in it when the
   helper's arguments carry no model text (a helper that only cuts code out of a reply is the
   interpreter loop's extractor, not a composed tool). `functional` is then read off the
   trajectories: True when on some trajectory the final answer occurs (`answer_occurs`: as a
   number token of the same value, or as whole words) in a tool result or in a model reply
   after the first tool call (the text the loop composed reached the answer);
   False when it never does; None without trajectories. It is None for every other class.
6. interpreter_loop: a `tools.python` call fed with model output inside a loop that also
   calls the model.
7. retry_loop: a model call inside a loop that holds an answer check; also a model call in a
   loop with no check (fixed repetition, sampling), and a harness whose AST shows one call
   site but whose trajectories made several (evidence says which).
8. single_call: model calls only outside loops. One site is the plain case; several
   straight-line sites (a fixed chain) are single_call too, with "chain:N" in `structural`.

`audit_run(run_dir)` audits every harness of an adapt, search, cotrain, train-proposer or eval
run, as `whale.analysis.run_files.scan_run` finds them; its family is the nearest
`config.toml`'s `[task] id`, else the task part of its trajectories' question ids
"<family>:<seed>:<index>", else "unknown". A harness's identity is the hash of its text
(`whale.harness.harness_hash`), never the file name or meta.json hash a run records (a note
says when they differ), so a second source under a known name is audited and screened too.
Each (family, hash) is audited once and the screens
of `whale.analysis.screens` run on each, in lineage order (`run_files.Lineage.order`: seed and
parents before children, never file times, so a copied run reads the same), and on the
train-proposer teacher's datasets of edits.

Hostile input: every run file is read with `whale.records.read_untrusted` inside the run (no
link out, regular files only, size caps `run_files.MAX_TRAJECTORY_BYTES`, `MAX_TRAJECTORIES`);
a source that cannot be read is unparseable and fails its screens ("source not read"); a
garbage trajectory line is counted in a note and skipped; a config.toml nested too deeply to
parse is a note.
Not covered: the AST walk does not follow calls through aliases (`f = env.llm; f(...)`,
`getattr(env, "llm")`), methods of classes the harness defines, lambdas, data flow through
module-level globals mutated at run time, or code assembled from strings; only recorded
trajectories correct the class then (a harness never run stays no_solver, and the loop
structure of a hidden call is guessed from the call count). The labels over-approximate (a
variable once tainted stays so).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale.analysis import run_files as rf
from whale.analysis.audit_flow import Flow
from whale.harness.bundle import flat_tree
from whale.harness.contract import MAX_SOURCE_CHARS, run_contract_fault
from whale.harness.trajectory import Trajectory

AUDIT_CLASSES = ("single_call", "retry_loop", "interpreter_loop", "composed_tool_loop",
                 "multihop_passages", "multihop_summaries", "no_solver")  # fmt: skip
UNPARSEABLE = "unparseable"  # the recorded outcome for a source that cannot be audited
@dataclass
class HarnessAudit:
    hash: str
    family: str
    cls: str
    structural: list[str] = field(default_factory=list)
    functional: bool | None = None
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"hash": self.hash, "family": self.family, "class": self.cls,
                "structural": list(self.structural), "functional": self.functional,
                "evidence": list(self.evidence)}  # fmt: skip


def classify(
    source: str, trajectories: Iterable[Trajectory] = (), *, key: str = "", family: str = ""
) -> HarnessAudit:
    """The audit of one harness (see the module docstring). Never raises on its input."""
    trajs = list(trajectories)
    out = HarnessAudit(key, family, UNPARSEABLE)
    fault = run_contract_fault(source) if isinstance(source, str) else "is not text"
    tree = None
    if isinstance(source, str) and len(source) <= MAX_SOURCE_CHARS:
        try:
            tree = flat_tree(source)  # a bundle's files as one module
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            out.evidence.append(f"does not parse: {type(e).__name__}: {e}"[:300])
    if tree is None:
        if not out.evidence:
            out.evidence.append(f"harness {fault}")
        return out
    if fault:
        out.evidence.append(f"run contract: harness {fault}")
    # the last top-level `def run` is the one Python binds (an earlier one is a decoy)
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    run = runs[-1] if runs else None
    flow = Flow(tree)
    if run is not None:
        try:
            flow.call(run, [{"question"}, {"env"}], {})
        except RecursionError:
            flow.truncated = True
    if flow.truncated:
        out.evidence.append("analysis cut at its step or depth limit: classes from what was seen")
    _structure(flow, out)
    _trajectory_checks(trajs, out)
    return out


def _structure(flow: Flow, out: HarnessAudit) -> None:
    sinks = list(flow.sinks.values())
    llm = [s for s in sinks if s.kind == "llm"]
    tools = [s for s in sinks if s.kind != "llm"]
    retr = [s for s in sinks if s.kind == "retrieve"]
    llm_sites = sorted({s.line for s in llm})
    for s in sorted(sinks, key=lambda s: s.line):
        where = " in a loop" if s.loops else ""
        out.evidence.append(f"line {s.line}: {_SINK_NAMES.get(s.kind, s.kind)} call{where}")
    out.evidence = list(dict.fromkeys(out.evidence))
    st = out.structural
    st.append(f"model_call_sites:{len(llm_sites)}")
    if not llm:
        out.cls = "no_solver"
        out.evidence.append("no model call is reachable from run")
        return
    loops_llm = {loop for s in llm for loop in s.loops}
    tool_loops = loops_llm & {loop for s in tools for loop in s.loops}
    if loops_llm:
        st.append("model_call_in_loop")
    if tool_loops:
        st.append("tool_loop")
    multihop = len({s.node for s in retr}) >= 2 or any(s.loops for s in retr)
    if retr:
        st.append(f"retrieval_sites:{len({s.node for s in retr})}")
    passages = any("ret" in s.taint for s in llm)
    summaries = any("summary" in s.taint for s in llm)
    if passages:
        st.append("passages_in_prompt")
    if summaries:
        st.append("summaries_carried")
    composed = []
    for name, line, loops, args in flow.helpers:
        for loop in set(loops) & tool_loops:
            tag = f"h:{name}"
            to_llm = any(tag in s.taint and loop in s.loops for s in llm)
            to_tool = "llm" not in args and any(tag in s.taint and loop in s.loops for s in tools)
            if to_llm or to_tool:
                composed.append(f"line {line}: helper {name}() called in the tool loop, its "
                                f"result reaches the {'model' if to_llm else 'tool'}")  # fmt: skip
    composed = list(dict.fromkeys(composed))
    for c in composed:
        st.append(f"helper_in_tool_loop:{c.split('helper ')[1].split('(')[0]}")
    interp = [
        s for s in tools if s.kind == "python" and "llm" in s.taint and set(s.loops) & loops_llm
    ]
    if interp:
        st.append("python_fed_by_model")
    checks = [line for line, loops in flow.checks if set(loops) & loops_llm]
    if checks:
        st.append("answer_check_in_loop")
    out.structural = list(dict.fromkeys(st))
    if multihop and summaries:
        out.cls = "multihop_summaries"
        out.evidence.append("retrieval repeats and model-written summaries reach a later prompt")
    elif multihop and passages:
        out.cls = "multihop_passages"
        out.evidence.append("retrieval repeats and retrieved passages reach the model's prompt")
    elif composed:
        out.cls = "composed_tool_loop"
        out.evidence += composed
    elif interp:
        out.cls = "interpreter_loop"
        out.evidence.append(f"line {interp[0].line}: model output runs in tools.python in a loop")
    elif loops_llm:
        out.cls = "retry_loop"
        out.evidence.append(f"line {checks[0]}: the loop checks the answer" if checks else
                            "no answer check: the loop repeats the model call a fixed number "
                            "of times")  # fmt: skip
    else:
        out.cls = "single_call"
        if len(llm_sites) > 1:
            out.structural.append(f"chain:{len(llm_sites)}")
            out.evidence.append(f"{len(llm_sites)} straight-line model calls (a fixed chain)")


_SINK_NAMES = {"llm": "model", "python": "tools.python", "retrieve": "tools.retrieve"}


def _trajectory_checks(trajs: list[Trajectory], out: HarnessAudit) -> None:
    if not trajs:
        return
    calls = [sum(1 for e in t.events if isinstance(e, dict) and e.get("kind") == "model")
             for t in trajs]  # fmt: skip
    tools: dict[str, int] = {}
    for t in trajs:
        for e in t.events:
            if isinstance(e, dict) and e.get("kind") == "tool":
                tools[str(e.get("name"))] = tools.get(str(e.get("name")), 0) + 1
    shown = ", ".join(f"{k} {v}" for k, v in sorted(tools.items())) or "none"
    out.evidence.append(f"trajectories: {len(trajs)}, model calls per run {min(calls)}-"
                        f"{max(calls)}, tool calls: {shown}")  # fmt: skip
    if out.cls == UNPARSEABLE:
        return
    if max(calls) == 0:
        out.cls = "no_solver"
        out.evidence.append("no trajectory made a model call")
    elif out.cls == "no_solver":  # an alias, a lambda, a method: the runs say the model ran
        q = trajs[calls.index(max(calls))].question_id
        out.cls = "retry_loop" if max(calls) > 1 else "single_call"
        out.evidence.append(f"model called through a path the AST does not see: {q} made "
                            f"{max(calls)} model call(s)")  # fmt: skip
    elif out.cls == "single_call" and "chain:" not in " ".join(out.structural) and max(calls) > 1:
        q = trajs[calls.index(max(calls))].question_id
        out.cls = "retry_loop"
        out.evidence.append(f"one call site in the source, but {q} made {max(calls)} model calls")
    if out.cls == "composed_tool_loop":
        out.functional = any(_answer_via_loop(t) for t in trajs)


def _answer_via_loop(t: Trajectory) -> bool:
    answer = (t.answer or "").strip() if isinstance(t.answer, str) else ""
    if not answer:
        return False
    seen_tool = False
    for e in t.events:
        if not isinstance(e, dict):
            continue
        if e.get("kind") == "tool":
            seen_tool = True
            if answer_occurs(answer, str(e.get("result", ""))):
                return True
        elif e.get("kind") == "model" and seen_tool:
            if answer_occurs(answer, str(e.get("text", ""))):
                return True
    return False


_NUMBER = re.compile(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?")
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?![\w]|\.\d)")


def answer_occurs(answer: str, text: str) -> bool:
    """Whether `answer` occurs in `text` as a whole: a number as a number token of the same
    value ("4" is in "x = 4.0" but not in "line 14"), any other answer case- and
    space-insensitively at word boundaries ("Paris" is not in "Parisian")."""
    answer = " ".join(answer.split())
    if not answer:
        return False
    text = text[:1_000_000]
    if _NUMBER.fullmatch(answer):
        want = float(answer.replace(",", ""))
        return any(abs(float(m.group(0).replace(",", "")) - want) <= 1e-9 * max(1.0, abs(want))
                   for m in _NUMBER_IN_TEXT.finditer(text))  # fmt: skip
    pattern = r"\s+".join(re.escape(w) for w in answer.split(" "))
    pattern = (r"(?<!\w)" if answer[0].isalnum() else "") + pattern
    pattern += r"(?!\w)" if answer[-1].isalnum() else ""
    return re.search(pattern, text, re.IGNORECASE) is not None


# --- run directories -------------------------------------------------------------------------


@dataclass
class RunAudit:
    """Every harness of a run audited once per (family, hash), the counts per family and
    class, every screen's verdict, and notes on what could not be read or checked."""

    run_dir: Path
    harnesses: list[HarnessAudit] = field(default_factory=list)
    screens: list[Any] = field(default_factory=list)  # whale.analysis.screens.ScreenResult
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for h in self.harnesses:
            fam = out.setdefault(h.family, {})
            fam[h.cls] = fam.get(h.cls, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "harnesses": [h.to_json() for h in self.harnesses],
            "counts": self.counts(),
            "screens": [s.to_json() for s in self.screens],
            "notes": list(self.notes),
        }


def audit_run(run_dir: Path, *, echo: bool = True) -> RunAudit:
    """Audit and screen every harness of an adapt, search, cotrain or train-proposer run
    (see the module docstring). `echo` builds the answer-echo screen per family from the task
    and the dev question ids the run's ledgers hold (it loads the task; off, the screen is
    not run and a note says so). Reads only; never executes a harness."""
    from whale.analysis import screens as sc

    run_dir = Path(run_dir)
    audit = RunAudit(run_dir)
    if not run_dir.is_dir():
        audit.notes.append(f"{run_dir}: not a folder")
        return audit
    found = rf.scan_run(run_dir, audit.notes)
    cache: dict[Path, dict[str, Any] | None] = {}
    by_key: dict[tuple[str, str], tuple[str, list[Trajectory], str | None]] = {}
    unread: dict[tuple[str, str], str] = {}  # (family, hash) -> why its source was not read
    dev: dict[str, set[str]] = {}
    task_cfg: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    # per (family, hash): the earliest position its own folders record, and its first file name
    places: dict[tuple[str, str], tuple[rf.Position | None, str]] = {}
    for site in found.sites:
        text, why = rf.read_text(site.source, MAX_SOURCE_CHARS, run_dir)
        if why:
            audit.notes.append(why)
        h = _hash(text) if text is not None else site.hash or site.source.stem
        if site.hash and site.hash != h:  # the text is what runs: its hash is the identity
            where = site.source.relative_to(run_dir).as_posix()
            audit.notes.append(f"{where}: recorded as {site.hash!r}, but its text hashes to "
                               f"{h!r}: audited and screened as {h!r}")  # fmt: skip
        trajs, tnotes = rf.read_trajectories(site.trajectories, h if site.hash else None, run_dir)
        audit.notes += tnotes
        cfg = rf.config_task(site.source.parent, run_dir, cache, audit.notes)
        fam = cfg["id"] if cfg else next((f for t in trajs if (f := rf.family_of(t.question_id))),
                                         None)  # fmt: skip
        ids = rf.dev_ids(site.ledger, run_dir)
        fam = fam or next((f for q in sorted(ids) if (f := rf.family_of(q))), None) or "unknown"
        dev.setdefault(fam, set()).update(ids)
        if cfg:
            task_cfg.setdefault(fam, cfg)
        parent = None
        if site.parent is not None and site.parent.is_file():
            parent, _ = rf.read_text(site.parent, MAX_SOURCE_CHARS, run_dir)
        key = (fam, h)
        own, name = places.get(key, (None, site.source.relative_to(run_dir).as_posix()))
        if site.position is not None:
            own = site.position if own is None else min(own, site.position)
        places[key] = (own, name)
        if key in by_key:
            kept = by_key[key][1]
            kept.extend(trajs[: max(0, rf.MAX_TRAJECTORIES - len(kept))])
            if key in unread and text is not None:  # another copy of it could be read
                by_key[key] = (text, kept, parent)
                del unread[key]
        else:
            by_key[key] = (text if text is not None else "", trajs, parent)
            if text is None:
                unread[key] = why
        if text is not None:
            sources.setdefault(h, text)
    echoes: dict[str, Any] = {}
    datasets = {d: list(sc.edit_rows(d, root=run_dir)) for d in found.datasets}
    edit_families = {r.family for rows in datasets.values() for r in rows}
    for fam in sorted({f for f, _ in by_key} | edit_families):
        if not echo:
            continue
        screen, why = sc.dev_echo_screen(fam, dev.get(fam, set()), task_cfg.get(fam), run_dir)
        if screen is not None:
            echoes[fam] = screen
        else:
            audit.notes.append(f"answer echo not screened for {fam}: {why}")
    if not echo:
        audit.notes.append("answer echo not screened (turned off)")
    for fam in sorted({f for f, _ in by_key}):
        # lineage order, so that a candidate is a duplicate of what it came from, never the
        # reverse (file times would not do: a copied run has them all new)
        order = found.lineage.order({h: places[(f, h)] for f, h in by_key if f == fam})
        group = [(h, *by_key[(fam, h)]) for h in order]
        for h, text, trajs, _ in group:
            if (fam, h) in unread:  # nothing to audit or screen: say so, never pass it
                why = f"source not read: {unread[(fam, h)]}"
                audit.harnesses.append(HarnessAudit(h, fam, UNPARSEABLE, evidence=[why]))
                audit.screens += [sc.ScreenResult(h, "interface", False, [why]),
                                  sc.ScreenResult(h, "oracle_access", False,
                                                  [f"not checked: {why}"])]  # fmt: skip
            else:
                audit.harnesses.append(classify(text, trajs, key=h, family=fam))
        audit.screens += sc.screen_archive(
            [(h, text, parent) for h, text, _, parent in group if (fam, h) not in unread],
            echo=echoes.get(fam),
        )
    for rows in datasets.values():
        audit.screens += sc.screen_edit_rows(rows, sources, echo=echoes)
    return audit


def _hash(text: str) -> str:
    from whale.harness import harness_hash

    return harness_hash(text)


def write_audit(audit: RunAudit, path: Path | None = None) -> Path:
    """RunAudit as JSON into `path` (default RUN_DIR/audit.json), whole or not at all."""
    from whale.records import write_atomic

    path = path or audit.run_dir / "audit.json"
    write_atomic(path, json.dumps(audit.to_json(), indent=2))
    return path
