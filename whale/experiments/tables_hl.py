"""Harness Learning's tables, from a train-proposer run directory: the teacher's kept edits per
family, SFT and GRPO as they ran, and `evaluate`'s per-family readings and paired differences
(its own `summary.json` table; the pairs it does not take, between two proposers that are not
its subject, by the same `paired` function over its `readings.json`), and the ratchet curve
with its plot (`ratchet_plot`); while evaluate runs, the families each proposer has done."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

from whale.experiments.cells import field, fmt
from whale.experiments.ratchet_plot import ratchet_lines
from whale.experiments.records import StepRecord
from whale.experiments.spec import Step
from whale.records import read_json
from whale.train.proposer.contexts import family_dir
from whale.train.proposer.evaluate import READINGS, EvaluateSettings, FamilyReading, paired


def train_proposer_tables(step: Step, rec: StepRecord, d: Path, target: Path) -> list[str]:
    f = rec.config.get("fields", {})
    lines = [f"Stages: {', '.join(step.stages)}. Solver `{field(f, 'solver.name')}`, teacher "
             f"`{field(f, 'teacher.name', 'qwen-coder-1.5b')}`, proposer trained "
             f"`{field(f, 'proposer', 'qwen-coder-0.5b')}`; x_t template "
             f"`{field(f, 'contexts.template', 'default')}`; question variant "
             f"`{field(f, 'contexts.variant', 'canonical')}`." + _prior(f), "",
             *(f"- families.{k}: {', '.join(field(f, f'families.{k}', []) or []) or '-'}"
               for k in ("sft", "rl", "eval"))]  # fmt: skip
    lines += _teacher(d) + _sft(d) + _grpo(d) + _evaluate(d, f, target.parent /
                                                         f"{target.stem}-{step.name}-ratchet.png")
    return lines


def _prior(f: dict[str, Any]) -> str:
    """What a reader must know of contexts.teacher_template: who read it, and who did not."""
    prior = field(f, "contexts.teacher_template", "")
    if not prior or prior == field(f, "contexts.template", "default"):
        return ""
    return (f" **The teacher alone read the `{prior}` template** (a human prior) when it wrote "
            "the SFT data, whose prompts are the x_t ones; the proposer named `teacher` in "
            "evaluate reads x_t, not the prior.")  # fmt: skip


def _teacher(d: Path) -> list[str]:
    path = d / "teacher" / "summary.json"
    if not path.is_file():
        return []
    s = read_json(path)
    kept = s.get("kept_per_family", {})
    rejected = ", ".join(f"{k} {v}" for k, v in s["rejected"].items()) or "-"
    lines = ["", "### Teacher data (`teacher/summary.json`)", "",
             f"{s['kept']} of {s['proposals']} teacher proposals kept over {s['contexts']} "
             f"contexts; rejected: {rejected}."
             + (f" The teacher read `{s['teacher_template']}` (sha256 "
                f"{str(s.get('teacher_template_sha256'))[:16]}); kept edits copying a line of "
                f"it word for word: {fmt(s.get('kept_copying_hint'))}."
                if s.get("teacher_template") else ""),
             "", "| family | proposals | kept |", "|---|---|---|"]  # fmt: skip
    proposals = Counter(r["family"] for r in _candidates(d))
    lines += [
        f"| {fam} | {proposals.get(fam, 0)} | {kept.get(fam, 0)} |"
        for fam in sorted({*kept, *proposals})
    ]
    return lines


def _candidates(d: Path) -> list[dict[str, Any]]:
    from whale.records import read_jsonl

    path = d / "teacher" / "candidates.jsonl"
    return read_jsonl(path) if path.is_file() else []


def _sft(d: Path) -> list[str]:
    path = d / "sft" / "summary.json"
    if not path.is_file():
        return []
    s = read_json(path)
    how = "chosen by family-disjoint CV" if s.get("cv") else "no CV (one family kept data)"
    return [
        "",
        "### SFT (`sft/summary.json`)",
        "",
        f"{s['examples']} examples, {s['epochs']} epochs ({how}); {fmt(s.get('wall_s'), 0)} s.",
    ]


def _grpo(d: Path) -> list[str]:
    path = d / "grpo" / "summary.json"
    if not path.is_file():
        return []
    s = read_json(path)
    start = str(s["from"]).replace(str(d.parent) + "/", "")  # STEP/sft/adapter, or "base"
    lines = ["", "### GRPO (`grpo/summary.json`)", "", f"From {start}.", "",
             "| phase | update | samples | mean reward | SD | generation s | gradient s |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for ph in s["phases"]:
        for u in ph["updates"]:
            lines.append(
                f"| {ph['phase']} | {u['update']} | {len(u['rewards'])} | "
                f"{fmt(u['reward_mean'])} | {fmt(u['reward_std'])} | "
                f"{fmt(u['generation_s'], 0)} | {fmt(u['gradient_s'], 0)} |"
            )
    return lines


def _readings(rows: list[dict[str, Any]]) -> list[FamilyReading]:
    names = {f.name for f in dataclasses.fields(FamilyReading)}
    return [FamilyReading(**{k: v for k, v in r.items() if k in names}) for r in rows]


def _held_out_n(d: Path, family: str) -> int | None:
    path = family_dir(d, family) / "eval_read.json"
    if not path.is_file():
        return None
    ids = read_json(path).get("question_ids")
    return len(ids) if isinstance(ids, list) else None


def _evaluate(d: Path, f: dict[str, Any], png: Path) -> list[str]:
    path = d / "evaluate" / "summary.json"
    if not path.is_file():
        return _evaluate_progress(d, f)
    s = read_json(path)
    short = str(d.parent) + "/"  # a proposer named by its adapter folder: STEP/sft/adapter

    def label(name: str) -> str:
        return name.replace(short, "")

    readings = _readings(s["readings"])
    names = list(dict.fromkeys(r.proposer for r in readings))
    fams = list(dict.fromkeys(r.family for r in readings))
    held = {fam: _held_out_n(d, fam) for fam in fams}
    setup = s["setup"]
    lines = ["", "### Evaluate on the unseen families (`evaluate/summary.json`)", "",
             f"n: {len(fams)} families ({', '.join(fams)}); per proposer and family "
             f"{setup['contexts']} contexts × {setup['g']} proposals and a {setup['rounds']}-round "
             f"ratchet; held-out questions per family: "
             f"{', '.join(f'{k} {fmt(v)}' for k, v in held.items())}. Solver "
             f"`{field(f, 'solver.name')}`; proposers: {', '.join(f'`{label(n)}`' for n in names)}"
             f"; template `{setup['template']['name']}` (sha256 {setup['template']['sha256']}); "
             f"temperature {setup['temperature']}, max tokens {setup['max_tokens']}. SE: of the "
             "mean paired difference over families (sample SD / √families).", "",
             label(s["table"]).rstrip()]  # fmt: skip
    lines += ratchet_lines(readings, png, label)
    subject = s["subject"]
    others = [n for n in names if n != subject]
    pairs = [(a, b) for i, a in enumerate(others) for b in others[i + 1 :]]
    if pairs:
        lines += [
            "",
            "Paired differences between the other proposers (the same `paired` as "
            "evaluate's, over its readings.json):",
            "",
            "| pair | reading | families | mean diff | SE |",
            "|---|---|---|---|---|",
        ]
        for a, b in pairs:
            mine = [r for r in readings if r.proposer == a]
            theirs = [r for r in readings if r.proposer == b]
            for reading in READINGS:
                p = paired(mine, theirs, reading)
                lines.append(
                    f"| {label(a)} − {label(b)} | {reading} | {p['n_families']} | "
                    f"{p['mean_diff']:+.3f} | {fmt(p['se'])} |"
                )
    return lines


def _evaluate_progress(d: Path, f: dict[str, Any]) -> list[str]:
    """An evaluate that has not finished (no summary.json): per proposer folder, the families
    whose contexts' proposals and ratchet rounds are all on disk. No reading: evaluate reads
    each family's held-out split once, after every proposer has run."""
    root = d / "evaluate"
    dirs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not dirs:
        return []
    es = EvaluateSettings()
    contexts = int(field(f, "evaluate.contexts", es.contexts))
    rounds = int(field(f, "evaluate.rounds", es.rounds))
    fams = list(field(f, "evaluate.only", []) or field(f, "families.eval", []) or [])

    def done(fam_dir: Path) -> bool:
        props = fam_dir / "proposals"
        n = len(list(props.glob("*.json"))) if props.is_dir() else 0
        last = fam_dir / "ratchet" / f"round_{rounds:02d}" / "decision.json"
        return n >= contexts and (rounds == 0 or last.is_file())

    lines = ["", "### Evaluate, not finished (no `evaluate/summary.json` yet)", "",
             f"Per proposer folder, the families whose {contexts} contexts of proposals and "
             f"{rounds} ratchet rounds are on disk; the held-out readings come after every "
             "proposer has run.", "", "| proposer folder | families done | which |",
             "|---|---|---|"]  # fmt: skip
    for p in dirs:
        fin = [fam for fam in fams if done(p / fam.replace(":", "_"))]
        lines.append(f"| `{p.name}` | {len(fin)} of {len(fams)} | {', '.join(fin) or '-'} |")
    return lines

