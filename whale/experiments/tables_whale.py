"""WHALE's tables, from cotrain run directories: per run, the schedules' summary (base, final,
best by validation, where each passes stagewise's final accuracy, phase lengths:
`whale.schedule.curves.markdown_table`), every eval read (the curve, with its binomial SE),
the phases with their capability metrics (`phase_table`), the adaptive schedule's phases one
by one, and the plot cotrain drew; then, per task, each schedule's final accuracy across the
seeds with its mean and SE over seeds."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from whale import stats
from whale.experiments.cells import binomial_se, field, fmt
from whale.experiments.records import StepRecord
from whale.experiments.spec import Spec, Step
from whale.records import RecordError, iter_jsonl, read_json
from whale.schedule.curves import curve_rows, markdown_table, phase_table

CAPABILITIES = ("format_compliance", "truncation_rate", "retrieval_accuracy", "answer_extraction")


def cotrain_tables(step: Step, rec: StepRecord, d: Path, target: Path) -> list[str]:
    f = rec.config.get("fields", {})
    summary = read_json(d / "summary.json") if (d / "summary.json").is_file() else {}
    point = summary.get("stagewise")
    lines = [f"Task `{field(f, 'task.id')}`, seed harness `{field(f, 'harness')}`, solver "
             f"`{field(f, 'solver.name')}`, proposer `{field(f, 'proposer.name')}` (operator "
             f"`{field(f, 'operator', 'search')}`); seed {field(f, 'seed', 0)}; training rollouts "
             f"per schedule {field(f, 'rollouts')}; splits: train {field(f, 'train')}, search "
             f"{field(f, 'search')}, eval n = {field(f, 'eval')}, validation n = "
             f"{field(f, 'validation')}; fixed (E, I) = ({field(f, 'weight_epochs')}, "
             f"{field(f, 'harness_iters')}); (E*, I*) = "
             + (f"({point['e_star']}, {point['i_star']}) from {point['from']}" if point else "-")
             + "."]  # fmt: skip
    try:
        table, curves, phases = markdown_table(d), curve_rows(d), phase_table(d)
    except RecordError as e:
        return [*lines, "", f"No schedule records to table yet ({e})."]
    lines += ["", "Per schedule (`whale.schedule.curves`; accuracies are the eval split's):", "",
              table.rstrip(), "", "Every eval read (the curves; SE = √(p(1−p)/n)):", "",
              "| schedule | cycle | boundary | training rollouts | eval accuracy | n | SE | "
              "validation accuracy |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in curves:
        lines.append(f"| {r['schedule']} | {r['cycle']} | {r['boundary']} | "
                     f"{r['training_rollouts']} | {fmt(r['accuracy'])} | {r['n']} | "
                     f"{fmt(binomial_se(r['accuracy'], r['n']))} | "
                     f"{fmt(r['validation_accuracy'])} |")  # fmt: skip
    lines += _plot(step, d, target)
    lines += ["", "Phases and the capability metrics of their training rollouts (`phases.csv`):",
              "", "| schedule | cycle | phase | rollouts | cumulative | "
              + " | ".join(CAPABILITIES) + " | eval accuracy after | eval top answer share |",
              "|---|---|---|---|---|" + "---|" * len(CAPABILITIES) + "---|---|"]  # fmt: skip
    for p in phases:
        lines.append(f"| {p['schedule']} | {p['cycle']} | {p['phase']} | {p['rollouts']} | "
                     f"{p['cum_rollouts']} | " + " | ".join(fmt(p[c]) for c in CAPABILITIES)
                     + f" | {fmt(p['eval_accuracy'])} | "
                     f"{fmt(p['eval_top_answer_share'])} |")  # fmt: skip
    lines += _adaptive(d)
    return lines


def _plot(step: Step, d: Path, target: Path) -> list[str]:
    png = d / "curves.png"
    if not png.is_file():
        return ["", "No curves.png (the run has not finished)."]
    name = f"{target.stem}-{step.name}.png"
    shutil.copyfile(png, target.parent / name)
    return ["", f"![{step.name}: eval accuracy against training rollouts]({name})"]


def _adaptive(d: Path) -> list[str]:
    path = d / "adaptive" / "phases.jsonl"
    if not path.is_file():
        return []
    lines = ["", "Adaptive phases (`adaptive/phases.jsonl`):", "",
             "| cycle | phase | length | stopped by |", "|---|---|---|---|"]  # fmt: skip
    for _, r in iter_jsonl(path):
        length = f"{r['epochs']:g} epochs" if r["phase"] == "weight" else f"{r['steps']} iterations"
        lines.append(f"| {r['cycle']} | {r['phase']} | {length} | {r['stopped']} |")
    return lines


def seed_tables(spec: Spec, records: Mapping[str, StepRecord | None], root: Path) -> list[str]:
    """Per task, the final eval accuracy of every schedule in each finished cotrain step (one
    per seed), with the mean and its SE over seeds (sample SD / √seeds; none for one seed)."""
    by_task: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
    for step in spec.steps:
        rec = records.get(step.name)
        path = root / step.name / "summary.json"
        if step.kind != "cotrain" or rec is None or rec.state != "finished" or not path.is_file():
            continue
        f = rec.config.get("fields", {})
        by_task.setdefault(str(field(f, "task.id")), []).append(
            (step.name, int(field(f, "seed", 0)), read_json(path))
        )
    lines: list[str] = []
    for task, runs in by_task.items():
        scheds = list(dict.fromkeys(r["schedule"] for _, _, s in runs for r in s["summary"]))
        lines += ["", f"## Across seeds: `{task}`", "",
                  f"Final eval accuracy per seed ({', '.join(f'{n}: seed {k}' for n, k, _ in runs)}"
                  "); "
                  "mean and SE over seeds; where each run first passes its stagewise's final "
                  "accuracy (training rollouts).", "",
                  "| schedule | final per seed | mean | SE | passes stagewise final at |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name in scheds:
            rows = [next((r for r in s["summary"] if r["schedule"] == name), None)
                    for _, _, s in runs]  # fmt: skip
            finals = [r["final"] for r in rows if r is not None and r["final"] is not None]
            p = stats.paired(finals) if finals else None
            cross = ", ".join("-" if r is None else fmt(r["crossing_rollouts"]) for r in rows)
            lines.append(
                f"| {name} | {', '.join(fmt(x) for x in finals) or '-'} | "
                f"{fmt(p.mean) if p else '-'} | {fmt(p.se) if p else '-'} | {cross} |"
            )
    return lines
