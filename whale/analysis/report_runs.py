"""Per kind of run directory, what `whale report` collects (see report_data.py for the readers).

- adapt: round_NN/ lineage, ledger capability metrics per split and harness, eval_read.json;
- search: archive/ lineage, the same ledger metrics;
- cotrain: per schedule, the harness phases' lineage (the search's one archive,
  `harness/archive` with `harness/sessions`, or the revision loop's `harness/phase_NN/` round
  folders; older runs' `harness/phase_NN` archives too), eval
  accuracy against cumulative training rollouts (`whale.schedule.curves`, which checks each
  read against the ledger; on a RecordError the reads are drawn unchecked, with a note), weight
  step rewards, capability metrics per phase;
- train-proposer: the ratchet lineages of `evaluate/`, the GRPO reward per update, the
  evaluation readings per family, teacher acceptance and proposals that applied;
- eval: the ledger metrics of one `whale eval` run.

Each kind also gets its lead, the answer the page opens with (report_lead.py), built from what
its loader read (the ledger rows, the lineage, the reads, schedule_summary's costs).

`whale.schedule.curves` reads the cotrain ledgers and reads with its own (trusting) reader, so
before calling it every file it would open is checked with `unsafe_reason`; when one is a link
out of the run, a FIFO or over the size limit, curves is not called and the reads are drawn
unchecked from the safe reader, with a note.

Not covered: a cotrain harness phase run by an operator whose folder is neither an archive nor
round folders (noted as such); a file swapped for a FIFO between that check and curves' read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from whale.analysis.report_data import (
    Curve,
    RunData,
    Table,
    json_file,
    jsonl_rows,
    ledger_metrics,
    load_config,
    num,
    run_kind,
    schedule_dirs,
    split_reads,
    unsafe_reason,
)
from whale.analysis.report_lead import (
    adapt_lead,
    cotrain_lead,
    eval_lead,
    proposer_lead,
    search_lead,
)
from whale.analysis.report_lineage import (
    archive_lineage,
    lineage_curve,
    proposer_compliance,
    rounds_lineage,
)


def load_run(run_dir: Path) -> RunData:
    """Everything the report shows of `run_dir`, with a note per part that could not be read."""
    data = RunData(run_dir=run_dir, kind=run_kind(run_dir))
    if not run_dir.is_dir():
        data.note("config", f"{run_dir}: not a folder")
        return data
    load_config(data)
    loader = {"adapt": _adapt, "search": _search, "cotrain": _cotrain,
              "train-proposer": _proposer, "eval": _eval}.get(data.kind)  # fmt: skip
    if loader is None:
        data.note("lineage", "unknown run kind: no round_NN/, archive/, schedule folders or "
                             "train-proposer stages found")  # fmt: skip
    else:
        loader(data)
    split_reads(data)
    compliance_rows = [proposer_compliance(lin) for lin in data.lineages]
    if compliance_rows:
        data.compliance.insert(0, Table("proposals that applied, per lineage",
                                        ["lineage", "proposals", "applied", "valid", "applied %"],
                                        compliance_rows))  # fmt: skip
    return data


def _seed_hash(data: RunData) -> str | None:
    seed = data.run_dir / "seed.json"
    s = json_file(seed, data, "lineage") if seed.exists() else None
    return s.get("hash") if isinstance(s, dict) and isinstance(s.get("hash"), str) else None


def _adapt(data: RunData) -> None:
    d = data.run_dir
    seed = _seed_hash(data)
    lin = rounds_lineage(d, "adapt rounds", [d / "harnesses"], data, seed)
    data.lineages.append(lin)
    if c := lineage_curve(lin, "adapt: candidate scores per round"):
        data.curves.append(c)
    ledger = jsonl_rows(d / "outcomes.jsonl", data, "metrics")
    data.metrics.append(ledger_metrics(d / "outcomes.jsonl", data, "ledger by split and harness",
                                       ("split", "harness"), ledger))  # fmt: skip
    data.lead = adapt_lead(data, lin, ledger, list(range(len(data.curves))), seed)


def _search(data: RunData) -> None:
    d = data.run_dir
    lin = archive_lineage(d / "archive", "search archive", data)
    data.lineages.append(lin)
    if c := lineage_curve(lin, "search: candidate scores per iteration"):
        data.curves.append(c)
    ledger = jsonl_rows(d / "outcomes.jsonl", data, "metrics")
    data.metrics.append(ledger_metrics(d / "outcomes.jsonl", data, "ledger by split and harness",
                                       ("split", "harness"), ledger))  # fmt: skip
    data.lead = search_lead(data, lin, ledger, list(range(len(data.curves))))
    sessions = sorted((d / "sessions").glob("c*.json")) if (d / "sessions").is_dir() else []
    if sessions:
        data.compliance.append(_sessions_table(sessions, data, "search sessions"))


def _sessions_table(paths: list[Path], data: RunData, title: str) -> Table:
    ended: dict[str, int] = {}
    for p in paths:
        if p.name.endswith(".steps.jsonl"):
            continue
        s = json_file(p, data, "compliance")
        key = str(s.get("ended")) if isinstance(s, dict) else "unreadable"
        ended[key] = ended.get(key, 0) + 1
    total = sum(ended.values())
    return Table(f"{title}: how proposer sessions ended", ["ended", "sessions", "share"],
                 [[k, v, f"{v / total:.0%}"] for k, v in sorted(ended.items())])  # fmt: skip


def _cotrain(data: RunData) -> None:
    from whale.records import RecordError
    from whale.schedule.curves import curve_rows, phase_table, schedule_summary

    d = data.run_dir
    refused = _refused_by_curves(d)
    costs: list[dict[str, Any]] = []  # schedule_summary: only of reads the ledger confirms
    try:
        if refused:
            raise RecordError(f"{refused}: not read")
        reads = curve_rows(d)
        costs = schedule_summary(d)
    except RecordError as e:
        data.note("curves", f"reads not checked against the ledger: {e}")
        reads = [r for s in schedule_dirs(d) for r in jsonl_rows(s / "reads.jsonl", data, "curves")]
    series: dict[str, list[tuple[float, float]]] = {}
    for r in reads:
        x, y = num(r.get("training_rollouts")), num(r.get("accuracy"))
        if x is not None and y is not None:
            series.setdefault(str(r.get("schedule")), []).append((x, y))
    if series:
        data.curves.append(Curve("cotrain: eval accuracy vs cumulative training rollouts",
                                 "training rollouts (weight_sample + harness_score)",
                                 "eval accuracy", series))  # fmt: skip
    else:
        data.note("curves", "no eval read to draw")
    data.lead = cotrain_lead(data, reads, costs, [0] if series else [])
    try:
        if refused:
            raise RecordError(f"{refused}: not read")
        phases = phase_table(d)
    except RecordError as e:
        data.note("metrics", f"phase table: {e}")
        phases = []
    cols = ["schedule", "cycle", "phase", "rollouts", "cum_rollouts", "format_compliance",
            "truncation_rate", "retrieval_accuracy", "answer_extraction", "accuracy",
            "eval_accuracy"]  # fmt: skip
    data.metrics.append(Table("capability metrics per phase (training rows; eval read at its end)",
                              cols, [[p.get(c) for c in cols] for p in phases]))  # fmt: skip
    for s in schedule_dirs(d):
        _schedule(data, s)


def _refused_by_curves(run_dir: Path) -> str | None:
    """The first ledger or reads file that `whale.schedule.curves` would open (outcomes.jsonl /
    reads.jsonl of any sub-folder) and `read_untrusted` would refuse, as "<file>: <why>"."""
    for sub in sorted(run_dir.iterdir()):
        if not sub.is_dir():
            continue
        for name in ("outcomes.jsonl", "reads.jsonl"):
            if why := unsafe_reason(sub / name, run_dir):
                return f"{sub.name}/{name}: {why}"
    return None


def _schedule(data: RunData, s: Path) -> None:
    steps = jsonl_rows(s / "weight" / "steps.jsonl", data, "curves") if (
        s / "weight" / "steps.jsonl").exists() else []  # fmt: skip
    pts = [
        (float(i), r) for i, row in enumerate(steps) if (r := num(row.get("reward"))) is not None
    ]
    if pts:
        data.curves.append(Curve(f"{s.name}: weight phase sample reward per step", "step",
                                 "mean reward of the step's samples", {s.name: pts}))  # fmt: skip
    harness = s / "harness"
    per_phase: dict[str, list[tuple[float, float]]] = {}  # one figure per schedule
    # The search operator's one archive for all harness phases (harness/archive + sessions);
    # the revision loop's phase_NN/ round folders (and archives of runs before one archive).
    folders = [harness / "archive"] if (harness / "archive").is_dir() else []
    folders += sorted(p for p in harness.glob("phase_[0-9]*") if p.is_dir()) \
        if harness.is_dir() else []  # fmt: skip
    for phase in folders:
        if phase.name.endswith("-sessions"):
            continue
        title = f"{s.name} / {phase.name}"
        if any(phase.glob("c[0-9]*")) or (phase / "summary.jsonl").exists():
            lin = archive_lineage(phase, title, data)
        elif any(phase.glob("round_[0-9]*")):
            lin = rounds_lineage(phase, title, [s / "harnesses"], data)
        else:
            data.note("lineage", f"{s.name}/harness/{phase.name}: neither archive nor rounds")
            continue
        data.lineages.append(lin)
        if c := lineage_curve(lin, title):
            per_phase[phase.name] = c.series["candidates"]
        sessions = harness / "sessions" if phase.name == "archive" else \
            phase.with_name(f"{phase.name}-sessions")  # fmt: skip
        if sessions.is_dir():
            data.compliance.append(_sessions_table(sorted(sessions.glob("c*.json")), data, title))
    if per_phase:
        data.curves.append(Curve(f"{s.name}: harness candidates' search accuracy per iteration",
                                 "iteration (of the archive; of the phase for round folders)",
                                 "accuracy on the search split", per_phase))  # fmt: skip


def _proposer(data: RunData) -> None:
    d = data.run_dir
    ev = d / "evaluate"
    for sub in sorted(p for p in ev.iterdir() if p.is_dir()) if ev.is_dir() else []:
        for fam in sorted(p for p in sub.iterdir() if (p / "ratchet").is_dir()):
            srcs = [d / "rollouts" / fam.name / "harnesses"]
            data.lineages.append(rounds_lineage(fam / "ratchet", f"{sub.name} / {fam.name}",
                                                srcs, data))  # fmt: skip
    if not data.lineages:
        data.note("lineage", "no evaluate/<proposer>/<family>/ratchet/ folder")
    for phase in sorted((d / "grpo").glob("phase_*")) if (d / "grpo").is_dir() else []:
        ups = jsonl_rows(phase / "updates.jsonl", data, "curves")
        pts = [(u, r) for row in ups if (u := num(row.get("update"))) is not None
               and (r := num(row.get("reward_mean"))) is not None]  # fmt: skip
        if pts:
            data.curves.append(Curve(f"GRPO {phase.name}: mean reward per update", "update",
                                     "mean execution reward", {phase.name: pts}))  # fmt: skip
    readings = ev / "readings.json"
    rs = json_file(readings, data, "metrics") if ev.is_dir() else None
    if isinstance(rs, list):
        cols = ["proposer", "family", "seed_score", "mean", "ratchet", "oracle", "valid",
                "proposals"]  # fmt: skip
        rows = [[r.get(c) for c in cols[:-1]]
                + [len(r["scores"]) if isinstance(r.get("scores"), list) else None]
                for r in rs if isinstance(r, dict)]  # fmt: skip
        data.metrics.append(Table("evaluation readings per family", cols, rows))
        data.compliance.append(Table("proposals that applied (evaluation readings)",
                                     ["proposer", "family", "valid", "proposals", "share"],
                                     [[r[0], r[1], r[6], r[7], _share(r[6], r[7])]
                                      for r in rows]))  # fmt: skip
    data.lead = proposer_lead(data, [r for r in rs if isinstance(r, dict)] if isinstance(
        rs, list) else [], list(range(len(data.curves))))  # fmt: skip
    teacher = d / "teacher" / "summary.json"
    t = json_file(teacher, data, "compliance") if teacher.exists() else None
    if isinstance(t, dict):
        rej: dict[str, Any] = t["rejected"] if isinstance(t.get("rejected"), dict) else {}
        rows2: list[list[Any]] = [["kept", t.get("kept")], ["proposals", t.get("proposals")]]
        rows2 += [[f"rejected: {k}", v] for k, v in rej.items()]
        data.compliance.append(Table("teacher proposals", ["", "n"], rows2))


def _share(a: Any, b: Any) -> str:
    return f"{a / b:.0%}" if isinstance(a, int) and isinstance(b, int) and b else "-"


def _eval(data: RunData) -> None:
    ledger = jsonl_rows(data.run_dir / "outcomes.jsonl", data, "metrics")
    data.metrics.append(ledger_metrics(data.run_dir / "outcomes.jsonl", data, "eval outcomes",
                                       ("harness",), ledger))  # fmt: skip
    data.lead = eval_lead(data, ledger)
    data.note("lineage", "a single eval: no candidates")
