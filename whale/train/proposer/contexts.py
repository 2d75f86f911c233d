"""Family splits and revision contexts: what the proposer is trained and evaluated on.

A *revision context* is the proposer's input at one revision step, as the paper defines it: the
task description, a parent harness and the execution report of that parent on feedback
questions Q_fb; plus what scores an edit of it: the scoring questions Q_score (disjoint from
its Q_fb) and the parent's own score on them. Every stage reads the same record: the teacher's
data, GRPO's prompts and rewards, and the evaluation on unseen families.

Families come in three disjoint lists (`FamilySplits`): SFT families (teacher data), RL
families (GRPO) and unseen evaluation families. Each family's question pool is split into a
dev part (a feedback pool and a scoring set, disjoint) and a sealed held-out part; training
contexts use the dev part only, and `check_no_eval_text` refuses a training corpus that holds
any held-out question text of any family (checked on the text itself, not assumed from the
split code). Not covered: paraphrases of held-out questions (a family's generator may well
produce the same problem in other words; RG families are synthetic and this is rare), and a
held-out prompt shown only in part (cut by the report's clipping).

Generator twins (`TWINS`): two families whose questions come from one generator (gcd and lcm
draw the same integer pairs) are one skill, so a family split that puts them in different
lists would evaluate on a family trained under another name; `FamilySplits.validate` refuses
it, naming the pair. Twinship is taken transitively (`twin_groups`): products and
decimal_chain_sum are both chain_sum's twins, so they are one skill too. `Decoding` is how
every proposer sample of GRPO and of `evaluate` is decoded (the edit grammar on or off), one
setting for both.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from whale.config import ConfigError, at_least, check_choices, one_of
from whale.harness import Runtime, load_harness
from whale.records import RecordError, read_json, write_atomic
from whale.revise.grammar import edit_grammar
from whale.revise.proposer import TEMPLATES, ProposerConfig, load_template, render, task_tools
from whale.revise.report import ReportConfig, build_report
from whale.runs import OutcomeStore, check_splits, outcome_fingerprint
from whale.tasks import (
    VARIANTS,
    Question,
    SealedSplit,
    Task,
    TaskConfig,
    check_disjoint,
    load_task,
    split,
)
from whale.tasks.base import fold_text
from whale.train.proposer.leak import MIN_LEAK_CHARS as MIN_LEAK_CHARS
from whale.train.proposer.leak import EvalLeak as EvalLeak
from whale.train.proposer.leak import check_no_eval_text as check_no_eval_text

# Known generator twins in Reasoning Gym: pairs whose questions one generator makes, read in
# reasoning_gym's source. A split may hold both in one list (SFT, say), never one in each: the
# "unseen" family would then be the other one renamed.
# - gcd / lcm: one generator of integer lists (gcd.py and lcm.py share its code), asked for
#   the gcd or the lcm;
# - chain_sum / decimal_chain_sum: one chain-of-terms generator and one question text, over
#   integers or decimals;
# - chain_sum / products: one chain-of-terms generator, with + and - or with *;
# - mini_sudoku / sudoku: one puzzle and one rule set, on a 4x4 or a 9x9 board.
# Left out, since less sure: basic_arithmetic / decimal_arithmetic (two generators of mixed
# expressions) and game_of_life / game_of_life_halting (one simulator, different questions).
TWINS: tuple[tuple[str, str], ...] = (
    ("rg:gcd", "rg:lcm"),
    ("rg:chain_sum", "rg:decimal_chain_sum"),
    ("rg:chain_sum", "rg:products"),
    ("rg:mini_sudoku", "rg:sudoku"),
)


def twin_groups(pairs: Sequence[tuple[str, str]] = TWINS) -> list[frozenset[str]]:
    """The transitive closure of `pairs`: families joined by any chain of twin pairs are one
    group (products ~ chain_sum ~ decimal_chain_sum), since one generator makes them all."""
    groups: list[set[str]] = []
    for a, b in pairs:
        joined = [g for g in groups if a in g or b in g]
        merged = {a, b}.union(*joined)
        groups = [g for g in groups if g not in joined] + [merged]
    return [frozenset(g) for g in groups]


class FamilyOverlap(ValueError):
    """A family named in two of the SFT / RL / eval lists."""


@dataclass
class FamilySplits:
    sft: list[str] = field(default_factory=list)
    rl: list[str] = field(default_factory=list)
    eval: list[str] = field(default_factory=list)

    def validate(self) -> None:
        seen: dict[str, str] = {}
        for name in ("sft", "rl", "eval"):
            for fam in getattr(self, name):
                if not fam.strip():
                    raise FamilyOverlap(f"{name}: an empty family name")
                if fam in seen:
                    where = seen[fam] if seen[fam] != name else f"{name} twice"
                    raise FamilyOverlap(
                        f"family {fam!r} is in {where} and {name}: the SFT, RL and eval "
                        "families must be disjoint lists (the eval families are unseen)"
                    )
                seen[fam] = name
        for group in twin_groups():
            present = sorted(f for f in group if f in seen)
            for i, a in enumerate(present):
                for b in present[i + 1 :]:
                    if seen[a] != seen[b]:
                        raise ConfigError(
                            f"{seen[a]}/{seen[b]}: {a} and {b} are generator twins (one "
                            "generator makes both; whale.train.proposer.contexts.TWINS, taken "
                            f"transitively: {', '.join(sorted(group))}); put them in one list "
                            "or use one of them"
                        )

    def all(self) -> list[str]:
        return [*self.sft, *self.rl, *self.eval]


@dataclass
class ContextSettings:
    dev: int = 25  # per family: feedback pool + scoring set
    score: int = 12  # of the dev questions, these score edits; the rest are the feedback pool
    eval: int = 75  # per family, sealed
    feedback: int = 8  # |Q_fb| of one context, drawn from the feedback pool
    contexts: int = 4  # contexts per family and seed harness (independent Q_fb draws)
    seeds: list[str] = field(default_factory=lambda: ["single_call"])
    # The x_t template of the whole run: every context (teacher, GRPO, the multistep advance,
    # evaluate's contexts) and evaluate's ratchet rounds. "default" (the paper's x_t, no hint),
    # "hinted" (a human prior), or a path (whale.revise.proposer.load_template).
    template: str = "default"
    # The teacher's template, where it differs ("": contexts.template): a human prior given to
    # the teacher alone (issue 26: a teacher far weaker than the paper's may be helped by a
    # hint). The teacher reads the context rendered with it; its kept edits are stored under
    # the context rendered with `template`, the prompt the trained proposer reads.
    teacher_template: str = ""
    report: ReportConfig = field(default_factory=ReportConfig)
    task_seed: int = 0  # each family's question generator
    # every family's questions: "canonical" or "format" (reworded; whale.tasks.variants)
    variant: str = "canonical"
    seed: int = 0  # splits and draws

    def validate(self) -> None:
        for name in ("dev", "score", "eval", "feedback", "contexts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.score >= self.dev:
            raise ValueError(f"score ({self.score}) must be below dev ({self.dev}): the rest "
                             "of the dev questions are the feedback pool")  # fmt: skip
        if not self.seeds:
            raise ValueError("seeds: name at least one seed harness")
        one_of(self, "variant", VARIANTS)
        for name in ("template", "teacher_template"):
            value = getattr(self, name)
            if name == "teacher_template" and not value:
                continue
            try:
                load_template(value)
            except (OSError, ValueError) as e:
                raise ConfigError(
                    f"{name}: {value!r} is neither a name of "
                    f"{', '.join(TEMPLATES)} nor a readable file ({e})"
                ) from None


DecodingGrammar = Literal["off", "on"]


@dataclass
class Decoding:
    """How a trained proposer's samples are decoded, in GRPO and in `evaluate` alike (one
    object for both, recorded with the readings): `grammar` "off" (default: the paper samples
    freely, so applicability is the proposer's own) or "on" (whale.revise.grammar's edit
    grammar, at most `grammar_blocks` blocks: every SEARCH copies parent lines, so nearly
    every proposal applies and applicability measures the grammar, not the proposer)."""

    grammar: DecodingGrammar = "off"
    grammar_blocks: int = 1

    def validate(self) -> None:
        check_choices(self)
        at_least(self, 1, "grammar_blocks")

    def grammar_for(self, parent: str) -> str | None:
        """The GBNF grammar a proposal for `parent` is decoded under (None: free)."""
        return edit_grammar(parent, max_blocks=self.grammar_blocks) if self.grammar == "on" \
            else None  # fmt: skip

    def proposer(self, cfg: ProposerConfig) -> ProposerConfig:
        """`cfg` with this decoding: a Proposer built on it asks for `grammar_for(parent)`."""
        return dataclasses.replace(cfg, grammar=self.grammar, grammar_blocks=self.grammar_blocks)


# What `RevisionContext.parent_score` measures. Records written before the one-verifier change
# held the mean partial score under the same name; they carry no marker and are refused.
PARENT_MEASURE = "accuracy"


class OldContextRecord(RecordError):
    """A stored context whose parent score is not marked as an accuracy."""


@dataclass(frozen=True)
class RevisionContext:
    id: str  # "<family>/<parent hash>/<draw>"
    family: str
    parent_hash: str
    parent_source: str
    feedback_ids: tuple[str, ...]
    scoring_ids: tuple[str, ...]
    report: str
    prompt: str  # the proposer's user message
    parent_score: float  # J(parent; scoring questions): its accuracy (the binary verifier)
    step: int = 0  # multistep: how many times this parent was advanced
    parent_measure: str = PARENT_MEASURE  # what parent_score is: written with every record

    @staticmethod
    def from_dict(row: dict[str, Any], where: str) -> RevisionContext:
        """The context `row` stores. OldContextRecord when the row does not say its parent
        score is an accuracy: the teacher filter and the advance compare it with accuracies."""
        if not isinstance(row, dict):
            raise RecordError(f"{where}: not a revision context (not a table)")
        if row.get("parent_measure") != PARENT_MEASURE:
            raise OldContextRecord(
                f"{where}: this stored context has no parent_measure = {PARENT_MEASURE!r} "
                f"(it has {row.get('parent_measure')!r}): its run predates the one-verifier "
                "change, when parent_score was the mean partial score, and the teacher filter "
                "and the multistep advance would compare it with accuracies; start a new run "
                "directory"
            )
        try:
            row = dict(row)
            row["feedback_ids"] = tuple(row["feedback_ids"])
            row["scoring_ids"] = tuple(row["scoring_ids"])
            ctx = RevisionContext(**row)
        except (TypeError, KeyError) as e:
            raise RecordError(f"{where}: not a revision context ({e})") from None
        if set(ctx.feedback_ids) & set(ctx.scoring_ids):
            raise RecordError(f"{where}: context {ctx.id} scores on its own feedback questions")
        return ctx


@dataclass
class Family:
    """One family's task, splits and rollout ledger (`rollouts/<family>/` of the run)."""

    id: str
    task: Task
    feedback_pool: list[Question]
    scoring: list[Question]
    held_out: SealedSplit
    store: OutcomeStore
    by_id: dict[str, Question]

    def questions(self, ids: Iterable[str]) -> list[Question]:
        return [self.by_id[i] for i in ids]


def family_dir(run_dir: Path, family: str) -> Path:
    return run_dir / "rollouts" / re.sub(r"[^A-Za-z0-9_.-]+", "_", family)


def open_family(family: str, cfg: ContextSettings, run_dir: Path, solver: Any,
                runtime_cfg: Any) -> Family:  # fmt: skip
    """Load `family` and split it: dev (feedback pool + scoring set) and the sealed held-out
    part, disjoint by id and normalized text. `solver` (a ModelConfig) and `runtime_cfg` go
    into the ledger's fingerprint."""
    # Generated pools repeat some questions (duplicates are dropped by the split): draw more.
    size = (cfg.dev + cfg.eval) * 3 // 2 + 10
    tcfg = TaskConfig(id=family, size=size, seed=cfg.task_seed, variant=cfg.variant)
    task = load_task(family, size=size, seed=cfg.task_seed, variant=cfg.variant)
    fingerprint = outcome_fingerprint(tcfg, solver, runtime_cfg)
    return family_of(family, task, cfg, family_dir(run_dir, family), fingerprint)


def family_of(family: str, task: Task, cfg: ContextSettings, fdir: Path,
              fingerprint: str = "") -> Family:  # fmt: skip
    """Split `task`'s pool: scoring set, feedback pool, sealed held-out part (disjoint)."""
    parts = split(task.questions(), {"dev": cfg.dev, "eval": cfg.eval},
                  random.Random(f"{cfg.seed}:{family}"))  # fmt: skip
    dev, held = parts["dev"], parts["eval"]
    scoring, pool = dev[: cfg.score], dev[cfg.score :]
    check_disjoint({"feedback": pool, "score": scoring, "eval": held})
    store = OutcomeStore(fdir, fingerprint)
    check_splits(fdir, {"feedback": pool, "score": scoring, "eval": held})
    by_id = {q.id: q for q in dev}
    return Family(family, task, pool, scoring, SealedSplit(held, fdir / "eval_read.json"), store,
                  by_id)  # fmt: skip


def held_out_texts(families: Iterable[Family]) -> list[str]:
    """The folded prompt (`fold_text`) of every held-out question of `families` (read without
    opening the sealed split: the texts are only looked for, never shown or scored)."""
    return [fold_text(q.prompt) for f in families for q in f.held_out._questions]


def make_context(family: Family, runtime: Runtime, parent: str, q_fb: Sequence[Question],
                 template: str, report_cfg: ReportConfig, workers: int, draw: str,
                 step: int = 0) -> RevisionContext:  # fmt: skip
    """Run `parent` on Q_fb (the report) and on the scoring set (its score)."""
    store, task = family.store, family.task
    fb = store.evaluate(runtime, parent, task, q_fb, "feedback", workers)
    report = build_report(task, q_fb, fb.outcomes, fb.trajectories, report_cfg)
    prompt = render(template, task.description, parent, report, runtime.budget,
                    task_tools(task, runtime), runtime.package_names())  # fmt: skip
    parent_eval = store.evaluate(runtime, parent, task, family.scoring, "score", workers)
    h = store.save_harness(parent)
    return RevisionContext(
        f"{family.id}/{h}/{draw}", family.id, h, parent, tuple(q.id for q in q_fb),
        tuple(q.id for q in family.scoring), report, prompt, parent_eval.accuracy, step,
    )  # fmt: skip


def rerender(ctx: RevisionContext, family: Family, runtime: Runtime, template: str) -> str:
    """`ctx`'s prompt under another template: the same task description, parent and report
    (what the context measured), as make_context renders them."""
    task = family.task
    return render(template, task.description, ctx.parent_source, ctx.report, runtime.budget,
                  task_tools(task, runtime), runtime.package_names())  # fmt: skip


def possible_draws(pool: int, size: int) -> int:
    """How many different Q_fb draws of `size` a feedback pool of `pool` questions allows."""
    return math.comb(pool, min(size, pool)) if pool > 0 else 0


def feedback_draws(pool: Sequence[Question], size: int, n: int, key: str) -> list[list[Question]]:
    """`n` Q_fb draws of `size` from `pool`, pairwise different as sets, seeded by `key`
    (the same draws on every rerun). RecordError when the pool cannot give `n` of them."""
    if possible_draws(len(pool), size) < n:
        raise RecordError(f"{n} different feedback draws of {size} need a bigger feedback pool "
                          f"than {len(pool)} questions")  # fmt: skip
    rng, draws, seen = random.Random(key), list[list[Question]](), set[frozenset[str]]()
    while len(draws) < n:  # ends: at least n different sets exist, each drawn with p > 0
        q_fb = rng.sample(list(pool), min(size, len(pool)))
        ids = frozenset(q.id for q in q_fb)
        if ids not in seen:
            seen.add(ids)
            draws.append(q_fb)
    return draws


def build_contexts(family: Family, runtime: Runtime, cfg: ContextSettings, workers: int,
                   say: Callable[[str], None] = lambda s: None,
                   ) -> list[RevisionContext]:  # fmt: skip
    """`cfg.contexts` contexts per seed harness: independent Q_fb draws from the feedback pool.
    Draws are seeded by (seed, family, harness, draw), so a rerun makes the same contexts and
    the ledger answers their rollouts."""
    template = load_template(cfg.template)
    out = []
    for name in cfg.seeds:
        parent = load_harness(name)
        for d in range(cfg.contexts):
            # by the harness's file stem, not its path: a moved seed file draws the same Q_fb
            rng = random.Random(f"{cfg.seed}:{family.id}:{Path(name).stem}:{d}")
            q_fb = rng.sample(family.feedback_pool, min(cfg.feedback, len(family.feedback_pool)))
            ctx = make_context(family, runtime, parent, q_fb, template, cfg.report, workers,
                               f"{Path(name).stem}.{d}")  # fmt: skip
            say(f"{family.id}: context {ctx.id} (parent J {ctx.parent_score:.3f})")
            out.append(ctx)
    return out


def save_contexts(path: Path, contexts: Sequence[RevisionContext]) -> None:
    write_atomic(path, json.dumps([asdict(c) for c in contexts], indent=1))


def load_contexts(path: Path) -> list[RevisionContext]:
    rows = read_json(path)
    if not isinstance(rows, list):
        raise RecordError(f"{path}: not a list of contexts")
    return [RevisionContext.from_dict(r, f"{path}[{i}]") for i, r in enumerate(rows)]
