"""`evaluate`: proposers on unseen families, the paper's readings and their honest twins.

For each unseen family, `contexts` revision contexts are built from the seed harness, each on
its own Q_fb draw of the family's dev feedback pool (pairwise different sets, seeded: every
proposer answers the same contexts). Each proposer then
1. makes `g` single-step proposals per context (seeds fixed by context and index, the same for
   every proposer), decoded as `Decoding` says: the one setting GRPO sampled under;
2. runs a `rounds`-round ratchet from the seed (G = 1 per round, `revise.loop.revise`: Q_fb
   redrawn from the feedback pool each round, Select on the dev scoring set).
Only then is the family's sealed held-out split opened, once, for every harness at once: the
seed, every proposal's candidate and the harness the ratchet kept after each round. Each
distinct harness is scored on it once. The readings per (proposer, family), over
contexts × g proposals:
- `applicable`: the fraction of proposals whose edit applied (Apply: every block matched once,
  the result parses and keeps `run`), its own column: validity is not mixed into quality;
- `mean`: the mean held-out score, an edit that makes no harness (it does not apply, or a
  screen stops it) counted 0, as the paper scores it;
- `mean_no_change`: the same, such an edit counted as the seed's held-out score (it leaves the
  harness as it was), so a proposer is not paid or docked for format alone;
- `oracle` / `oracle_no_change`: each context's best held-out score of its g, under either
  reading, averaged over contexts (chosen after the fact on the held-out split: a ceiling, not a
  protocol);
- `ratchet`: the held-out score of the harness the ratchet kept after `rounds` rounds, and
  `ratchet_rounds` that score after every round, round 0 being the seed (the paper's Figure 4);
plus the seed's own held-out score. Every held-out score is an accuracy (the task's binary
verifier), never the mean partial score. Paired differences (subject minus each other proposer) per
family, their mean over families and the standard error of that mean (sample SD / sqrt(n);
none with one family). The decoding and the x_t template are recorded with the readings: one
template, `contexts.template`, renders the contexts and every ratchet round's prompt.

Nothing here chooses anything: the held-out split is read after every harness is fixed. A
killed run, rerun, answers from its records: stored proposals, the ratchet's round folders, the
family ledgers and the held-out split's read record (the same harnesses, so the same read).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale import stats
from whale.harness import Runtime, load_harness
from whale.models import ChatModel
from whale.records import record_dir, write_atomic
from whale.revise.loop import LoopSettings, revise
from whale.revise.proposer import (
    ProposalsFailed,
    Proposer,
    ProposerConfig,
    load_template,
    the_proposers_own,
)
from whale.revise.screens import AnswerEchoScreen
from whale.train.proposer.contexts import (
    ContextSettings,
    Decoding,
    Family,
    RevisionContext,
    feedback_draws,
    make_context,
)
from whale.train.proposer.reward import candidate_of, echo_screen
from whale.train.proposer.teacher import context_file, stored_proposals

READINGS = ("applicable", "mean", "mean_no_change", "oracle", "oracle_no_change", "ratchet")


@dataclass
class EvaluateSettings:
    # "trained" (grpo's adapter, else sft's), "sft", "grpo", "base", "teacher", or a model
    subject: str = "trained"
    against: list[str] = field(default_factory=lambda: ["base"])
    g: int = 8  # single-step proposals per context
    contexts: int = 4  # contexts per family, each on its own Q_fb draw
    rounds: int = 5
    seed: int = 0
    # Read only these eval families (default: all): what a record holds is the same either
    # way, so it may change on resume (the held-out split of a family is still read once).
    only: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.g < 1 or self.contexts < 1 or self.rounds < 0:
            raise ValueError("g and contexts must be >= 1 and rounds >= 0")
        if self.subject in self.against:
            raise ValueError(f"against: {self.subject!r} is the subject itself")


@dataclass
class FamilyReading:
    proposer: str
    family: str
    seed_score: float
    # per context, per proposal: the candidate's held-out score; None: the edit made no harness
    held: list[list[float | None]]
    applied: int  # proposals whose edit applied (a screen may still have stopped some)
    ratchet_rounds: list[float]  # the kept harness's held-out score after round 0 (seed), 1, ..
    ratchet_kept: int  # rounds whose candidate was kept
    reasons: list[str] = field(default_factory=list)  # why each invalid proposal was invalid

    @property
    def proposals(self) -> int:
        return sum(len(c) for c in self.held)

    @property
    def valid(self) -> int:
        return sum(s is not None for c in self.held for s in c)

    @property
    def scores(self) -> list[float]:
        """Every proposal's score, the paper's reading (no harness: 0), context by context."""
        return [0.0 if s is None else s for c in self.held for s in c]

    def _filled(self, no_harness: float) -> list[list[float]]:
        return [[no_harness if s is None else s for s in c] for c in self.held if c]

    def _mean(self, no_harness: float) -> float:
        xs = [s for c in self._filled(no_harness) for s in c]
        return sum(xs) / len(xs) if xs else 0.0

    def _oracle(self, no_harness: float) -> float:
        best = [max(c) for c in self._filled(no_harness)]
        return sum(best) / len(best) if best else 0.0

    @property
    def applicable(self) -> float:
        return self.applied / self.proposals if self.proposals else 0.0

    @property
    def mean(self) -> float:
        return self._mean(0.0)

    @property
    def mean_no_change(self) -> float:
        return self._mean(self.seed_score)

    @property
    def oracle(self) -> float:
        return self._oracle(0.0)

    @property
    def oracle_no_change(self) -> float:
        return self._oracle(self.seed_score)

    @property
    def ratchet(self) -> float:
        return self.ratchet_rounds[-1] if self.ratchet_rounds else self.seed_score

    def reading(self, name: str) -> float:
        if name not in READINGS:
            raise ValueError(f"no reading {name!r}; known: {', '.join(READINGS)}")
        return float(getattr(self, name))

    def row(self) -> dict[str, Any]:
        """The record: its fields, every reading, and the flat `scores`/`valid` of old runs."""
        return {**asdict(self), **{r: self.reading(r) for r in READINGS}, "scores": self.scores,
                "valid": self.valid, "proposals": self.proposals}  # fmt: skip


def paired(subject: Sequence[FamilyReading], other: Sequence[FamilyReading],
           reading: str) -> dict[str, Any]:  # fmt: skip
    """Mean and standard error of subject − other over the families both were read on."""
    theirs = {r.family: r.reading(reading) for r in other}
    diffs = [r.reading(reading) - theirs[r.family] for r in subject if r.family in theirs]
    p = stats.paired(diffs)
    return {"reading": reading, "n_families": p.n, "mean_diff": p.mean, "se": p.se, "diffs": diffs}


@dataclass
class _ContextPlan:
    sources: dict[int, str]  # proposal index -> candidate source (valid ones)
    reasons: dict[int, str]  # proposal index -> why it made no harness
    applied: int


@dataclass
class _Plan:
    contexts: list[_ContextPlan]
    rounds: list[str]  # the ratchet's kept harness after round 0 (the seed), 1, ..
    kept: int


def eval_contexts(fam: Family, runtime: Runtime, cs: ContextSettings, es: EvaluateSettings,
                  workers: int) -> list[RevisionContext]:  # fmt: skip
    """`es.contexts` contexts of the seed harness, on pairwise different Q_fb draws."""
    seed_src, template = load_harness(cs.seeds[0]), load_template(cs.template)
    draws = feedback_draws(fam.feedback_pool, cs.feedback, es.contexts,
                           f"{cs.seed}:{fam.id}:evaluate")  # fmt: skip
    return [make_context(fam, runtime, seed_src, q_fb, template, cs.report, workers,
                         f"evaluate.{k}") for k, q_fb in enumerate(draws)]  # fmt: skip


def _single_step(name: str, proposer: Proposer, ctx: RevisionContext, k: int,
                 echo: AnswerEchoScreen, es: EvaluateSettings,
                 d: Path) -> _ContextPlan:  # fmt: skip
    record_dir(d / "proposals")
    props = stored_proposals(d / "proposals" / f"{context_file(ctx)}.json", proposer, ctx, es.g,
                             es.seed * 1_000_000 + k * 1000)  # fmt: skip
    failed = [p.error for p in props if p.error and not the_proposers_own(p.error)]
    if failed:  # a timeout is not a bad edit: the reading would mix the two
        raise ProposalsFailed.of(f"evaluate {name} on {ctx.id}", failed, len(props), "evaluate")
    plan = _ContextPlan({}, {}, 0)
    for i, p in enumerate(props):
        if p.error:  # the prompt does not fit this proposer: an edit that made no harness
            plan.reasons[i] = f"proposer: {p.error}"
            continue
        src, bad = candidate_of(ctx, p.text, echo)
        if src is None:
            plan.reasons[i] = bad.reason if bad is not None else "invalid"
            plan.applied += int(bad is not None and bad.stage != "apply")  # applied, screened
        else:
            plan.sources[i] = src
            plan.applied += 1
    return plan


def _identity(model: ChatModel, decoding: Decoding) -> str:
    """By the model's identity (a served adapter's name carries its digest: "trained" after a
    later grpo is another model) and the decoding: stored proposals answer only these."""
    key = f"{model.name}\n{json.dumps(asdict(decoding), sort_keys=True)}"
    return hashlib.sha256(key.encode()).hexdigest()[:10]


def folder_name(name: str) -> str:
    """A proposer's name as one folder name inside evaluate's directory: a name may be a path
    or a URL (`evaluate.against`), which joined as it is would leave the directory."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[-60:] or "proposer"


def _plan(name: str, model: ChatModel, fam: Family, contexts: Sequence[RevisionContext],
          runtime: Runtime, cs: ContextSettings, pcfg: ProposerConfig, es: EvaluateSettings,
          workers: int, out: Path, decoding: Decoding,
          say: Callable[[str], None]) -> _Plan:  # fmt: skip
    seed_src = load_harness(cs.seeds[0])
    proposer = Proposer(model, decoding.proposer(pcfg))
    d = out / f"{folder_name(name)}-{_identity(model, decoding)}" / fam.id.replace(":", "_")
    record_dir(out)  # never through a link (whale.records), at each level
    record_dir(d.parent)
    record_dir(d)
    echo = echo_screen(fam, seed_src)
    plans = [_single_step(name, proposer, ctx, k, echo, es, d) for k, ctx in enumerate(contexts)]
    say(f"evaluate {name} on {fam.id}: {sum(p.applied for p in plans)}/"
        f"{es.g * len(plans)} proposals applied, {sum(len(p.sources) for p in plans)} made a "
        "harness")  # fmt: skip
    overflow = sum(the_proposers_own(r.removeprefix("proposer: ")) for p in plans
                   for r in p.reasons.values() if r.startswith("proposer: "))  # fmt: skip
    if overflow:
        say(f"evaluate {name} on {fam.id}: {overflow} prompt(s) did not fit the proposer's "
            "context: read as edits that made no harness")  # fmt: skip
    seed_hash = fam.store.save_harness(seed_src)
    kept_after = [seed_hash]
    kept = 0
    if es.rounds:
        settings = LoopSettings(rounds=es.rounds, g=1, select="ratchet", feedback=cs.feedback,
                                seed=es.seed, workers=workers, report=cs.report,
                                stop_on_failed_proposal=True)  # fmt: skip
        _, rounds = revise(fam.task, seed_src, fam.feedback_pool, fam.scoring, runtime, proposer,
                           fam.store, settings, rounds_dir=d / "ratchet")  # fmt: skip
        kept_after += [r.decision.kept_hash for r in rounds]
        kept = sum(r.decision.chosen is not None for r in rounds)
    say(f"evaluate {name} on {fam.id}: ratchet kept {kept}/{es.rounds} rounds")
    return _Plan(plans, kept_after, kept)


def _read_family(fam: Family, plans: Mapping[str, _Plan], seed_src: str, runtime: Runtime,
                 purpose: str, es: EvaluateSettings, workers: int,
                 say: Callable[[str], None]) -> list[FamilyReading]:  # fmt: skip
    """Open `fam`'s held-out split once for every harness of `plans`, score each distinct one
    once, and read every proposer's readings."""
    seed_hash = fam.store.save_harness(seed_src)
    hashes = {seed_hash}
    for p in plans.values():
        hashes |= {fam.store.save_harness(s) for c in p.contexts for s in c.sources.values()}
        hashes |= set(p.rounds)
    held = fam.held_out.open(purpose, sorted(hashes))
    say(f"evaluate: {fam.id}: {len(hashes)} harnesses on {len(held)} held-out questions")
    scored: dict[str, float] = {}

    def score(h: str) -> float:
        if h not in scored:
            ev = fam.store.evaluate(runtime, fam.store.harness(h), fam.task, held, "eval",
                                    workers)  # fmt: skip
            scored[h] = ev.accuracy  # the task's binary verifier, as every decision reads it
        return scored[h]

    seed_score, out = score(seed_hash), []
    for name, p in plans.items():
        held_scores: list[list[float | None]] = [
            [score(fam.store.save_harness(c.sources[i])) if i in c.sources else None
             for i in range(es.g)] for c in p.contexts]  # fmt: skip
        reasons = [c.reasons[i] for c in p.contexts for i in sorted(c.reasons)]
        out.append(FamilyReading(name, fam.id, seed_score, held_scores,
                                 sum(c.applied for c in p.contexts),
                                 [score(h) for h in p.rounds], p.kept, reasons))  # fmt: skip
    return out


def evaluate_proposers(models: Mapping[str, Callable[[], ChatModel]], families: Sequence[Family],
                       runtime: Runtime, cs: ContextSettings, pcfg: ProposerConfig,
                       es: EvaluateSettings, workers: int, out: Path,
                       say: Callable[[str], None] = lambda m: None,
                       decoding: Decoding | None = None) -> dict[str, Any]:  # fmt: skip
    """`models`: proposer name -> a factory of its ChatModel (made, used and closed in turn,
    subject first), each proposing under `decoding` (its grammar replaces `pcfg`'s). Writes
    readings.json and summary.json under `out`."""
    from whale.models import close_model

    decoding = decoding or Decoding()
    # the ratchet's round prompts (Proposer.prompt) use the contexts' template, not pcfg's
    pcfg = dataclasses.replace(pcfg, template=cs.template)
    contexts = {f.id: eval_contexts(f, runtime, cs, es, workers) for f in families}
    plans: dict[str, dict[str, _Plan]] = {f.id: {} for f in families}
    for name, make in models.items():
        model = make()
        try:
            for fam in families:
                plans[fam.id][name] = _plan(name, model, fam, contexts[fam.id], runtime, cs,
                                            pcfg, es, workers, out, decoding,
                                            say)  # fmt: skip
        finally:
            close_model(model)
    seed_src = load_harness(cs.seeds[0])
    purpose = f"train-proposer evaluate: {', '.join(models)}"
    readings = [r for fam in families
                for r in _read_family(fam, plans[fam.id], seed_src, runtime, purpose, es,
                                      workers, say)]  # fmt: skip
    names = list(models)
    subject = [r for r in readings if r.proposer == names[0]]
    pairs = {other: [paired(subject, [r for r in readings if r.proposer == other], rd)
                     for rd in READINGS] for other in names[1:]}  # fmt: skip
    template = template_record(cs.template)
    rows = [{**r.row(), "decoding": asdict(decoding), "template": template} for r in readings]
    write_atomic(out / "readings.json", json.dumps(rows, indent=1))
    setup = {"decoding": asdict(decoding), "contexts": es.contexts, "g": es.g,
             "rounds": es.rounds, "temperature": pcfg.temperature, "max_tokens": pcfg.max_tokens,
             "template": template}  # fmt: skip
    summary = {"subject": names[0], "setup": setup, "readings": rows, "paired": pairs,
               "table": markdown(readings, pairs, names, decoding)}  # fmt: skip
    write_atomic(out / "summary.json", json.dumps(summary, indent=1, default=str))
    return summary


def template_record(name: str) -> dict[str, str]:
    """The x_t template as run: its name (or path) and the digest of its text (a file behind
    a path may change later)."""
    text = load_template(name)
    return {"name": name, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


def markdown(readings: Sequence[FamilyReading], pairs: Mapping[str, list[dict[str, Any]]],
             names: Sequence[str], decoding: Decoding | None = None) -> str:  # fmt: skip
    d = decoding or Decoding()
    grammar = f"on, {d.grammar_blocks} block(s)" if d.grammar == "on" else "off"
    lines = [f"Decoding: edit grammar {grammar} (as in GRPO sampling). An edit that makes no "
             "harness reads 0 (the paper) or the seed's score (no change).", "",
             "| proposer | family | proposals | applicable | seed | mean (0) | "
             "mean (no change) | oracle (0) | oracle (no change) | ratchet |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in readings:
        shape = f"{len(r.held)}×{len(r.held[0]) if r.held else 0}"
        lines.append(f"| {r.proposer} | {r.family} | {shape} | {r.applicable:.0%} "
                     f"({r.applied}/{r.proposals}) | {r.seed_score:.3f} | {r.mean:.3f} | "
                     f"{r.mean_no_change:.3f} | {r.oracle:.3f} | {r.oracle_no_change:.3f} | "
                     f"{r.ratchet:.3f} ({r.ratchet_kept} kept) |")  # fmt: skip
    n = max((len(r.ratchet_rounds) for r in readings), default=0)
    if n > 1:
        lines += ["", "Ratchet: held-out score of the kept harness after each round "
                  "(round 0: the seed):", "",
                  "| proposer | family | " + " | ".join(f"r{t}" for t in range(n)) + " |",
                  "|---|---|" + "---|" * n]  # fmt: skip
        for r in readings:
            cells = [f"{s:.3f}" for s in r.ratchet_rounds] + ["-"] * (n - len(r.ratchet_rounds))
            lines.append(f"| {r.proposer} | {r.family} | " + " | ".join(cells) + " |")
    for other, rows in pairs.items():
        lines += ["", f"Paired {names[0]} − {other} over families:", "",
                  "| reading | families | mean diff | SE |", "|---|---|---|---|"]  # fmt: skip
        for p in rows:
            se = "-" if p["se"] is None else f"{p['se']:.3f}"
            lines.append(f"| {p['reading']} | {p['n_families']} | {p['mean_diff']:+.3f} | {se} |")
    return "\n".join(lines) + "\n"
