"""Teacher data: a teacher model's edits, executed, filtered and screened (the paper's SFT data).

For every revision context of the SFT families the teacher (any `ChatModel`, through the same
`Proposer` prompt the student will see) proposes `g` edits. Each one is applied and, unless a
pre-screen stops it (interface violations, answer echo: see `reward.candidate_of`), executed
on the context's scoring questions. It is kept only if

    J(candidate) >= J(parent) + min_gain   and   J(candidate) >= min_score

(the paper's 0.08 and 0.40), J the accuracy on the scoring questions, the fraction the task's
binary verifier accepts (`RevisionContext.parent_score` for the parent; the candidate's mean
partial score is recorded in its row and decides nothing). It then passes the post-screens:
duplicate code against the examples already kept (`code_screens.DuplicateScreen`) and, when a
reviewer model is configured, a reviewer's check for oracle access
(`code_screens.ReviewerScreen`). Every proposal is one row of `candidates.jsonl` with its
outcome and, when rejected, the reason; the kept ones are a `datasets` dataset of (prompt,
completion) in conversational form, saved to `dataset/`.

Resume: proposals are stored per context (`proposals/<n>.json`, finished ones only) and reused;
rollouts come from the family ledgers. Not covered: a teacher whose edits span several rounds
(the paper's teacher proposes once per context, as here).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from whale.harness import Runtime
from whale.records import RecordError, read_json, record_dir, write_atomic
from whale.revise.code_screens import DuplicateScreen, ReviewerScreen
from whale.revise.proposer import (
    Proposal,
    ProposalsFailed,
    Proposer,
    load_template,
    the_proposers_own,
)
from whale.revise.screens import AnswerEchoScreen
from whale.train.proposer.contexts import (
    Family,
    RevisionContext,
    check_no_eval_text,
)
from whale.train.proposer.reward import EditResult, score_edit


@dataclass
class TeacherSettings:
    g: int = 8  # proposals per context
    min_gain: float = 0.08  # accuracy over the parent's (the seed's) on the scoring questions
    min_score: float = 0.40  # absolute accuracy
    duplicate_threshold: float = 0.95
    seed: int = 0

    def validate(self) -> None:
        if self.g < 1:
            raise ValueError("g must be >= 1")
        if not 0.0 <= self.min_score <= 1.0 or not -1.0 <= self.min_gain <= 1.0:
            raise ValueError("min_score must be in [0, 1] and min_gain in [-1, 1]")
        if not 0.0 < self.duplicate_threshold <= 1.0:
            raise ValueError("duplicate_threshold must be in (0, 1]")


@dataclass
class TeacherRow:
    context: str
    family: str
    index: int
    kept: bool
    reason: str  # "" when kept
    parent_accuracy: float  # J(parent) on the context's scoring questions
    result: dict[str, Any]  # the EditResult (its `accuracy` is J, `mean_score` the extra)
    text: str


def filter_reason(res: EditResult, parent_accuracy: float, s: TeacherSettings) -> str | None:
    """Why an executed edit misses the accuracy bars (None when it clears both). Accuracy only:
    a higher mean partial score never lets an edit through."""
    if not res.valid or res.accuracy is None:
        return res.reason or "not scored"
    if res.accuracy < parent_accuracy + s.min_gain - 1e-9:
        return (f"filter: accuracy {res.accuracy:.3f} < parent {parent_accuracy:.3f} + "
                f"{s.min_gain:.2f}")  # fmt: skip
    if res.accuracy < s.min_score - 1e-9:
        return f"filter: accuracy {res.accuracy:.3f} < {s.min_score:.2f} absolute"
    return None


def context_file(ctx: RevisionContext, prompt: str | None = None) -> str:
    """A file name for `ctx`'s proposals: its id made safe, and its prompt's digest (a stored
    proposal answers this very prompt, not one that shares the id)."""
    import hashlib
    import re

    digest = hashlib.sha256((prompt or ctx.prompt).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', ctx.id)}-{digest}"


def stored_proposals(path: Path, proposer: Proposer, ctx: RevisionContext, g: int,
                     seed: int, prompt: str | None = None) -> list[Proposal]:  # fmt: skip
    """The g proposals for `ctx` (asked with `prompt`, default ctx.prompt), proposal i with
    seed `seed + i`, stored ones reused. Those not stored are asked as a resumed round asks them
    (`Proposer.ask_missing`): each run of consecutive indices in one request where the backend
    shares the prompt, the embedded server reading it once and decoding up to its slots at once.
    In the Harness Learning run's evaluate (0.5B proposer with its GRPO adapter, 2 cores, read
    from the files' times), a context of 8 took 4-6 min for 2,745-3,432 tokens one call at a
    time, and 101 s for 2,754 tokens so. They are stored when all have come back; a failed
    proposal is not, so a resume asks it again."""
    done: dict[int, Proposal] = {}
    if path.exists():
        rows = read_json(path)
        if not isinstance(rows, list):
            raise RecordError(f"{path}: not a list of proposals")
        for row in rows:
            try:
                i = int(row.pop("index"))
                p = Proposal(**row)
            except (TypeError, KeyError, ValueError, AttributeError) as e:
                raise RecordError(f"{path}: not a proposal ({e})") from None
            if p.error is None:  # a failed one (stored by whale before 2026-12-05) asked again
                done[i] = p
    missing = [i for i in range(g) if i not in done]
    if missing:
        done.update(proposer.ask_missing(prompt or ctx.prompt, missing, seed, ctx.parent_source))
        write_atomic(path, json.dumps([{"index": k, **asdict(v)} for k, v in sorted(done.items())
                                       if v.error is None]))  # fmt: skip
    return [done[i] for i in range(g)]


def teacher_data(contexts: Sequence[RevisionContext], families: Mapping[str, Family],
                 runtime: Runtime, teacher: Proposer, s: TeacherSettings, out: Path,
                 echo: Mapping[str, AnswerEchoScreen], held_out: Sequence[str],
                 workers: int = 2, reviewer: ReviewerScreen | None = None,
                 say: Callable[[str], None] = lambda m: None,
                 teacher_prompts: Mapping[str, str] | None = None,
                 prior: str = "") -> dict[str, Any]:  # fmt: skip
    """Run the teacher over `contexts`; write candidates.jsonl, kept.jsonl, dataset/ and
    summary.json under `out`; return the summary. `held_out`: normalized held-out prompts of
    every family (the kept set is refused if it holds one: `check_no_eval_text`).
    `teacher_prompts` (context id -> prompt): what the teacher reads where it is not the
    context's own prompt (a human prior for the teacher alone); the kept examples pair the
    teacher's edit with the context's own prompt, the one the trained proposer reads; `prior`
    names their template in the summary."""
    record_dir(out)  # never through a link (whale.records)
    record_dir(out / "proposals")
    dupes = DuplicateScreen(s.duplicate_threshold)
    rows: list[TeacherRow] = []
    for n, ctx in enumerate(contexts):
        fam = families[ctx.family]
        asked = (teacher_prompts or {}).get(ctx.id, ctx.prompt)
        props = stored_proposals(out / "proposals" / f"{context_file(ctx, asked)}.json", teacher,
                                 ctx, s.g, s.seed * 100_000 + n * 100, asked)  # fmt: skip
        kept_here = 0
        for i, p in enumerate(props):
            if p.error is not None:
                kind = "context_overflow" if the_proposers_own(p.error) else "teacher"
                res = EditResult(ctx.id, False, f"{kind}: {p.error}", "teacher", None, False,
                                 False, 0.0, None, 0.0)  # fmt: skip
            else:
                res = score_edit(ctx, p.text, fam, runtime, workers, echo.get(ctx.family))
            why = filter_reason(res, ctx.parent_score, s)
            if why is None:
                source = fam.store.harness(res.hash) if res.hash else ""
                why = dupes.check(source)
                if why is None and reviewer is not None:
                    why = reviewer.check(source, fam.task.description)
                if why is None:
                    dupes.add(f"{ctx.id}#{i}", source)
                    kept_here += 1
            rows.append(TeacherRow(ctx.id, ctx.family, i, why is None, why or "",
                                   ctx.parent_score, asdict(res), p.text))  # fmt: skip
        say(f"teacher: context {n + 1}/{len(contexts)} {ctx.id}: {kept_here}/{len(props)} kept")
    write_atomic(out / "candidates.jsonl",
                 "".join(json.dumps(asdict(r)) + "\n" for r in rows))  # fmt: skip
    overflow = sum(r.reason.startswith("context_overflow") for r in rows)
    if overflow:
        say(f"teacher: {overflow} prompt(s) did not fit the teacher's context (teacher.n_ctx): "
            "counted as rejected edits")  # fmt: skip
    failed = [r.reason.removeprefix("teacher: ") for r in rows if r.reason.startswith("teacher:")]
    if failed:  # no summary: the stage is not finished, and a rerun asks for these again
        raise ProposalsFailed.of("teacher", failed, len(rows))
    kept = [r for r in rows if r.kept]
    prompts = {c.id: c.prompt for c in contexts}
    hint = {c.id: hint_lines((teacher_prompts or {}).get(c.id, c.prompt), c.prompt)
            for c in contexts}  # fmt: skip
    check_no_eval_text([prompts[r.context] + "\n" + r.text for r in kept], held_out)
    records = [sft_record(prompts[r.context], r.text, r.family, r.context) for r in kept]
    write_atomic(out / "kept.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    save_dataset(records, out / "dataset")
    reasons = Counter(_reason_kind(r.reason) for r in rows if not r.kept)
    summary = {
        "contexts": len(contexts), "proposals": len(rows), "kept": len(kept),
        "kept_per_family": dict(Counter(r.family for r in kept)),
        "rejected": dict(sorted(reasons.items())),
        "mean_kept_gain": (sum((r.result["accuracy"] or 0.0) - r.parent_accuracy for r in kept)
                           / len(kept)) if kept else None,  # in accuracy
        # the human prior the teacher alone read (None: it read the contexts' own prompts),
        # its text's digest, and how many kept edits copy one of its lines word for word
        # (the prior reaching the SFT targets as text, not only as a better edit)
        "teacher_template": prior or None,
        "teacher_template_sha256": _sha256(load_template(prior)) if prior else None,
        "kept_copying_hint": sum(any(h in r.text for h in hint[r.context]) for r in kept)
        if prior else None,
    }  # fmt: skip
    write_atomic(out / "summary.json", json.dumps(summary, indent=2))
    return summary


HINT_LINE_CHARS = 25  # shorter lines of a prior ("```python") are not its own words


def hint_lines(asked: str, own: str) -> list[str]:
    """The lines of the prompt the teacher was `asked` that the context's `own` prompt lacks
    (the prior's own words), of HINT_LINE_CHARS or more, stripped."""
    mine = {line.strip() for line in own.splitlines()}
    return sorted({t for line in asked.splitlines()
                   if len(t := line.strip()) >= HINT_LINE_CHARS and t not in mine})  # fmt: skip


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


# "teacher": its call failed (the stage stops; a rerun asks again); "context_overflow": the
# prompt did not fit its context, a rejected edit (asking again would fail the same way)
REASON_KINDS = ("teacher", "context_overflow", "apply", "interface", "answer_echo", "filter",
                "duplicate", "reviewer")  # fmt: skip


def _reason_kind(reason: str) -> str:
    """The screen or filter a rejection reason names (its first word)."""
    return next((k for k in REASON_KINDS if reason.startswith(k)), "other") if reason else "kept"


def sft_record(prompt: str, completion: str, family: str, context: str) -> dict[str, Any]:
    return {"prompt": [{"role": "user", "content": prompt}],
            "completion": [{"role": "assistant", "content": completion}],
            "family": family, "context": context}  # fmt: skip


def save_dataset(records: Sequence[dict[str, Any]], path: Path) -> None:
    from datasets import Dataset

    cols = ("prompt", "completion", "family", "context")
    ds = Dataset.from_dict({c: [r[c] for r in records] for c in cols})
    ds.save_to_disk(str(path))


def load_dataset_dir(path: Path) -> Any:
    from datasets import load_from_disk

    if not path.is_dir():
        raise RecordError(f"{path}: no teacher dataset (run `whale train-proposer sft` first)")
    return load_from_disk(str(path))
