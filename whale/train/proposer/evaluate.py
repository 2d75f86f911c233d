"""`evaluate`: proposers on unseen families, the paper's three readings, paired across families.

For each unseen family one revision context is built from the seed harness (the report of the
seed on a Q_fb draw of the dev feedback pool). Each proposer then
1. makes `g` single-step proposals for it (seeds 0..g-1, the same for every proposer);
2. runs a `rounds`-round ratchet from the seed (G = 1 per round, `revise.loop.revise`: Q_fb
   redrawn from the feedback pool each round, Select on the dev scoring set).
Only then is the family's sealed held-out split opened, once, for every harness at once, and
each harness is scored on it. The readings per (proposer, family):
- `mean`: the mean held-out score over the g proposals (an edit that does not apply, or that a
  screen stops, makes no harness and counts 0: the paper's mean over every sampled proposal);
- `oracle`: the best held-out score of the g (chosen after the fact, on the held-out split:
  a ceiling, not a protocol);
- `ratchet`: the held-out score of the harness the ratchet kept after `rounds` rounds;
plus `valid` (applicable, screened edits of the g) and the seed's own held-out score.
Paired differences (subject minus each other proposer) per family, their mean over families and
the standard error of that mean (sample SD / sqrt(n); none with one family).

Nothing here chooses anything: the held-out split is read after every harness is fixed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale import stats
from whale.harness import Runtime, load_harness
from whale.models import ChatModel
from whale.records import RecordError, record_dir, write_atomic
from whale.revise.loop import LoopSettings, revise
from whale.revise.proposer import Proposer, ProposerConfig
from whale.train.proposer.contexts import ContextSettings, Family, RevisionContext, make_context
from whale.train.proposer.reward import candidate_of, echo_screen
from whale.train.proposer.teacher import stored_proposals

READINGS = ("mean", "oracle", "ratchet")


@dataclass
class EvaluateSettings:
    # "trained" (grpo's adapter, else sft's), "sft", "grpo", "base", "teacher", or a model
    subject: str = "trained"
    against: list[str] = field(default_factory=lambda: ["base"])
    g: int = 8
    rounds: int = 5
    seed: int = 0
    # Read only these eval families (default: all): what a record holds is the same either
    # way, so it may change on resume (the held-out split of a family is still read once).
    only: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.g < 1 or self.rounds < 0:
            raise ValueError("g must be >= 1 and rounds >= 0")
        if self.subject in self.against:
            raise ValueError(f"against: {self.subject!r} is the subject itself")


@dataclass
class FamilyReading:
    proposer: str
    family: str
    seed_score: float
    scores: list[float]  # held-out score per proposal (0 for an edit that made no harness)
    valid: int
    ratchet: float
    ratchet_kept: int  # rounds whose candidate was kept
    reasons: list[str] = field(default_factory=list)  # why each invalid proposal was invalid

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    @property
    def oracle(self) -> float:
        return max(self.scores) if self.scores else 0.0

    def reading(self, name: str) -> float:
        return {"mean": self.mean, "oracle": self.oracle, "ratchet": self.ratchet}[name]


def paired(subject: Sequence[FamilyReading], other: Sequence[FamilyReading],
           reading: str) -> dict[str, Any]:  # fmt: skip
    """Mean and standard error of subject − other over the families both were read on."""
    theirs = {r.family: r.reading(reading) for r in other}
    diffs = [r.reading(reading) - theirs[r.family] for r in subject if r.family in theirs]
    p = stats.paired(diffs)
    return {"reading": reading, "n_families": p.n, "mean_diff": p.mean, "se": p.se, "diffs": diffs}


@dataclass
class _Plan:
    ctx: RevisionContext
    sources: dict[int, str]  # proposal index -> candidate source (valid ones)
    reasons: dict[int, str]
    ratchet_hash: str
    ratchet_kept: int


def _plan(name: str, model: ChatModel, fam: Family, runtime: Runtime, cs: ContextSettings,
          pcfg: ProposerConfig, es: EvaluateSettings, workers: int, out: Path,
          say: Callable[[str], None]) -> _Plan:  # fmt: skip
    seed_src = load_harness(cs.seeds[0])
    import random

    from whale.revise.proposer import load_template

    rng = random.Random(f"{cs.seed}:{fam.id}:evaluate")
    q_fb = rng.sample(fam.feedback_pool, min(cs.feedback, len(fam.feedback_pool)))
    ctx = make_context(fam, runtime, seed_src, q_fb, load_template(cs.template), cs.report,
                       workers, "evaluate")  # fmt: skip
    proposer = Proposer(model, pcfg)
    # by the model's identity too (a served adapter's name carries its digest): "trained"
    # after a later grpo is another model, and its proposals are not the stored ones
    ident = hashlib.sha256(model.name.encode()).hexdigest()[:10]
    d = out / f"{name}-{ident}" / fam.id.replace(":", "_")
    record_dir(out)  # never through a link (whale.records), at each level
    record_dir(d.parent)
    record_dir(d)
    props = stored_proposals(d / "proposals.json", proposer, ctx, es.g, es.seed * 1000)
    echo = echo_screen(fam, seed_src)
    sources, reasons = {}, {}
    failed = [p for p in props if p.error is not None]
    if failed:  # a timeout is not a bad edit: the reading would mix the two
        raise RecordError(f"evaluate {name} on {fam.id}: {len(failed)} proposal(s) failed "
                          f"({failed[0].error}); run evaluate again to ask for them")  # fmt: skip
    for i, p in enumerate(props):
        src, bad = candidate_of(ctx, p.text, echo)
        if src is None:
            reasons[i] = bad.reason if bad is not None else "invalid"
        else:
            sources[i] = src
    say(f"evaluate {name} on {fam.id}: {len(sources)}/{es.g} proposals applicable")
    rounds: list[Any] = []
    h = fam.store.save_harness(seed_src)
    if es.rounds:
        settings = LoopSettings(rounds=es.rounds, g=1, select="ratchet", feedback=cs.feedback,
                                seed=es.seed, workers=workers,
                                report=cs.report)  # fmt: skip
        h, rounds = revise(fam.task, seed_src, fam.feedback_pool, fam.scoring, runtime, proposer,
                           fam.store, settings, rounds_dir=d / "ratchet")  # fmt: skip
    kept = sum(r.decision.chosen is not None for r in rounds)
    say(f"evaluate {name} on {fam.id}: ratchet kept {kept}/{es.rounds} rounds")
    return _Plan(ctx, sources, reasons, h, kept)


def evaluate_proposers(models: Mapping[str, Callable[[], ChatModel]], families: Sequence[Family],
                       runtime: Runtime, cs: ContextSettings, pcfg: ProposerConfig,
                       es: EvaluateSettings, workers: int, out: Path,
                       say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:  # fmt: skip
    """`models`: proposer name -> a factory of its ChatModel (made, used and closed in turn,
    subject first). Writes readings.json and summary.json under `out`."""
    from whale.models import close_model

    plans: dict[tuple[str, str], _Plan] = {}
    for name, make in models.items():
        model = make()
        try:
            for fam in families:
                plans[(name, fam.id)] = _plan(name, model, fam, runtime, cs, pcfg, es, workers,
                                              out, say)  # fmt: skip
        finally:
            close_model(model)
    readings: list[FamilyReading] = []
    seed_src = load_harness(cs.seeds[0])
    for fam in families:
        mine = {k: p for k, p in plans.items() if k[1] == fam.id}
        hashes = {fam.store.save_harness(seed_src)}
        for p in mine.values():
            hashes |= {fam.store.save_harness(s) for s in p.sources.values()} | {p.ratchet_hash}
        held = fam.held_out.open(f"train-proposer evaluate: {', '.join(models)}", sorted(hashes))
        say(f"evaluate: {fam.id}: {len(hashes)} harnesses on {len(held)} held-out questions")

        def score(h: str, fam: Family = fam, held: list[Any] = held) -> float:
            ev = fam.store.evaluate(runtime, fam.store.harness(h), fam.task, held, "eval", workers)
            return ev.score

        seed_score = score(fam.store.save_harness(seed_src))
        for (name, _), p in mine.items():
            scores = [score(fam.store.save_harness(p.sources[i])) if i in p.sources else 0.0
                      for i in range(es.g)]  # fmt: skip
            readings.append(FamilyReading(name, fam.id, seed_score, scores, len(p.sources),
                                          score(p.ratchet_hash), p.ratchet_kept,
                                          [p.reasons[i] for i in sorted(p.reasons)]))  # fmt: skip
    names = list(models)
    subject = [r for r in readings if r.proposer == names[0]]
    pairs = {other: [paired(subject, [r for r in readings if r.proposer == other], rd)
                     for rd in READINGS] for other in names[1:]}  # fmt: skip
    rows = [{**asdict(r), "mean": r.mean, "oracle": r.oracle} for r in readings]
    write_atomic(out / "readings.json", json.dumps(rows, indent=1))
    summary = {"subject": names[0], "readings": rows, "paired": pairs,
               "table": markdown(readings, pairs, names)}  # fmt: skip
    write_atomic(out / "summary.json", json.dumps(summary, indent=1, default=str))
    return summary


def markdown(readings: Sequence[FamilyReading], pairs: Mapping[str, list[dict[str, Any]]],
             names: Sequence[str]) -> str:  # fmt: skip
    lines = ["| proposer | family | seed | mean of G | oracle best of G | valid | ratchet |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in readings:
        lines.append(f"| {r.proposer} | {r.family} | {r.seed_score:.3f} | {r.mean:.3f} | "
                     f"{r.oracle:.3f} | {r.valid}/{len(r.scores)} | {r.ratchet:.3f} "
                     f"({r.ratchet_kept} kept) |")  # fmt: skip
    for other, rows in pairs.items():
        lines += ["", f"Paired {names[0]} − {other} over families:", "",
                  "| reading | families | mean diff | SE |", "|---|---|---|---|"]  # fmt: skip
        for p in rows:
            se = "-" if p["se"] is None else f"{p['se']:.3f}"
            lines.append(f"| {p['reading']} | {p['n_families']} | {p['mean_diff']:+.3f} | {se} |")
    return "\n".join(lines) + "\n"
