"""`whale experiment table`: every results table of an experiment, made from its run directories.

Nothing here computes a reading its operator computed already: the proposer readings and their
paired differences are train-proposer evaluate's (`evaluate/summary.json`; the pairs it did not
take are computed by the same `paired`), the schedules' summary, curves and phases are
`whale.schedule.curves`' over the cotrain run directory, a diagnosis is diagnose's own
`diagnosis.md`, a selection is `selection.json`. The file opens with where it came from: the
experiment's config hash (as last run), each step's config hash and the whale commits the
steps ran under, and the commit that made the table. A step not finished is shown as far as
its records go, and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from whale.experiments.cells import binomial_se, field, fmt
from whale.experiments.records import StepRecord, read_experiment, read_step, whale_commit
from whale.experiments.runner import scale_root
from whale.experiments.select import SELECTION
from whale.experiments.spec import BASE_SCALE, Spec, Step, load_spec
from whale.experiments.tables_hl import train_proposer_tables
from whale.experiments.tables_whale import cotrain_tables, seed_tables
from whale.records import read_json, write_atomic

TABLES = "tables.md"
Render = Callable[[Step, StepRecord, Path, Path], list[str]]


def experiment_tables(directory: str | Path, runs: str | Path | None = None,
                      scale: str = BASE_SCALE, out: str | Path | None = None) -> Path:  # fmt: skip
    """Write the experiment's tables (Markdown, plots beside it) to `out` (default
    ROOT/<name>/<scale>/tables.md); returns the path. RecordError when a record is bad."""
    spec = load_spec(directory, scale)
    root = scale_root(spec, runs)
    target = Path(out) if out is not None else root / TABLES
    target.parent.mkdir(parents=True, exist_ok=True)
    records = {s.name: read_step(root, s.name) for s in spec.steps}
    lines = _header(spec, root, records)
    render: dict[str, Render] = {"select": _select, "diagnose": _diagnose,
                                 "train_proposer": train_proposer_tables,
                                 "cotrain": cotrain_tables}  # fmt: skip
    for step in spec.steps:
        rec = records[step.name]
        lines += ["", f"## {step.name} ({step.kind})", ""]
        if rec is None:
            lines.append("Not run yet: no table.")
            continue
        lines += [
            f"Step config sha256 `{rec.hash}`; whale commit(s) "
            f"{', '.join(f'`{c}`' for c in rec.commits)}; wall {rec.wall_s:,.0f} s.",
            "",
        ]
        if rec.state != "finished":
            lines += ["**Not finished** (its record says started): what its records hold so "
                      "far.", ""]  # fmt: skip
        lines += render.get(step.kind, _summary_only)(step, rec, root / step.name, target)
    lines += seed_tables(spec, records, root)
    write_atomic(target, "\n".join(lines).rstrip() + "\n")
    return target


def _header(spec: Spec, root: Path, records: Mapping[str, StepRecord | None]) -> list[str]:
    exp = read_experiment(root) if (root / "_experiment.json").exists() else {}
    commits = sorted({c for r in records.values() if r is not None for c in r.commits})
    total = sum(r.wall_s for r in records.values() if r is not None)
    lines = [f"# Experiment `{spec.name}`, scale `{spec.scale}`", "",
             f"Made by `whale experiment table` from the run directories in `{root}`; not "
             "written by hand.", "",
             f"- experiment config sha256: `{exp.get('config_sha256', 'not run')}` (as last "
             f"run from `{exp.get('source', spec.path)}`); the file now: `{spec.sha256}`",
             f"- whale commit of the runs: {', '.join(f'`{c}`' for c in commits) or '-'}; of "
             f"this table: `{whale_commit()}`",
             f"- wall time of the steps, summed over invocations: {total:,.0f} s "
             f"({total / 3600:.2f} h)", "",
             "| step | kind | state | config sha256 | wall (s) | commits |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for step in spec.steps:
        r = records[step.name]
        if r is None:
            lines.append(f"| {step.name} | {step.kind} | not run | - | - | - |")
            continue
        lines.append(f"| {step.name} | {step.kind} | {r.state} | `{r.hash}` | {r.wall_s:,.0f} | "
                     f"{', '.join(c[:12] for c in r.commits)} |")  # fmt: skip
    return lines


def _select(step: Step, rec: StepRecord, d: Path, target: Path) -> list[str]:
    path = d / SELECTION
    if not path.is_file():
        return ["No selection.json yet."]
    sel = read_json(path)
    rule = sel["rule"]
    lo, hi = rule["accuracy"]
    lines = [f"Rule (written before any result): the seed harness `{rule['harness']}` with "
             f"`{rule['model']}`, accuracy in [{lo}, {hi}] on n = {rule['n']} questions per "
             f"family of task seed {rule['task_seed']}; lists "
             f"{', '.join(f'{k} {v}' for k, v in rule['lists'].items())}"
             + "".join(f" ({k} must offer `{v}`)" for k, v in rule["require"].items())
             + f"; shuffle seed {rule['seed']}; generator twins kept in one list.", "",
             "| family | correct / n | accuracy | SE | passed | list | variants |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sel["families"]:
        lines.append(f"| {r['family']} | {r['correct']}/{r['n']} | {fmt(r['accuracy'])} | "
                     f"{fmt(binomial_se(r['accuracy'], r['n']))} | {'yes' if r['passed'] else 'no'}"
                     f" | {r['list'] or '-'} | {', '.join(r['offers'])} |")  # fmt: skip
    lines += ["", f"Passed: {len(sel['passed'])} of {len(sel['families'])}. Assignment: " +
              "; ".join(f"{k}: {', '.join(v) or '-'}" for k, v in sel["assignment"].items()) +
              f". Passed, in no list: {', '.join(sel['unassigned']) or '-'}."]  # fmt: skip
    if sel.get("short"):
        lines += ["", f"**Short:** {sel['short']}"]
    return lines


def _diagnose(step: Step, rec: StepRecord, d: Path, target: Path) -> list[str]:
    path = d / "diagnosis.md"
    if not path.is_file():
        return ["No diagnosis.md yet."]
    body = path.read_text().splitlines()
    if body and body[0].startswith("# "):
        body = body[1:]
    fields = rec.config.get("fields", {})
    return [f"Task `{field(fields, 'task.id')}`, seed harness `{field(fields, 'harness')}`, "
            f"solver `{field(fields, 'solver.name')}`, proposer `{field(fields, 'proposer.name')}`"
            f"; `{path.relative_to(d.parent)}`, as diagnose wrote it:", *body]  # fmt: skip


def _summary_only(step: Step, rec: StepRecord, d: Path, target: Path) -> list[str]:
    """Kinds no experiment here tables (evaluate, adapt, search, rsft): their held-out figures
    from summary.json."""
    path = d / "summary.json"
    if not path.is_file():
        return ["No summary.json yet."]
    s = read_json(path)
    keys = ("task", "harness", "model", "n", "accuracy", "seed_eval", "final_eval")
    return [f"- {k}: {s[k]}" for k in keys if k in s] or [f"See `{path}`."]
