"""`adapt`: Harness Learning's test-time loop (the paper's pseudocode, chapter 10).

    h = seed
    for t in 1..T:
        report = execute(h, Q_fb[t])               # Q_fb redrawn every round
        x = (task description, h.source, report)
        candidates = Apply(h, propose(x) × G)
        scored = score(valid candidates, Q_score)   # r = J + v
        h = Select(h, scored)                        # ratchet or best-of-g
    final = score(seed and h, Q_eval)                # the eval split, read once

J is the accuracy on Q_score, the task's binary verifier (`whale.revise.select`); the mean
partial score is recorded beside it (candidates.json, decision.json, the summary) and decides
nothing.

Every rollout goes through the OutcomeStore, so nothing is paid for twice (resume, identical
candidates, the parent's own score). The proposer's weights never change in here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale.evaluation import EvalResult
from whale.harness import Failure, Runtime
from whale.records import RecordError
from whale.revise.edits import apply_edits
from whale.revise.proposer import (
    Proposal,
    ProposalsFailed,
    Proposer,
    task_tools,
    the_proposers_own,
)
from whale.revise.report import ReportConfig, build_report
from whale.revise.screens import AnswerEchoScreen, screen_questions
from whale.revise.select import (
    Candidate,
    Decision,
    SelectRule,
    ValidityWeights,
    apply_noise_check,
    rescored_check,
    reward,
    select,
)
from whale.revise.store import RoundDir, diff
from whale.runs import OutcomeStore
from whale.tasks import Question, SealedSplit, Task


@dataclass(frozen=True)
class LoopSettings:
    rounds: int = 3
    g: int = 1
    select: SelectRule = "ratchet"
    feedback: int = 8  # |Q_fb|, redrawn each round from the feedback pool
    seed: int = 0
    workers: int = 4
    report: ReportConfig = field(default_factory=ReportConfig)
    weights: ValidityWeights = field(default_factory=ValidityWeights)
    # Noise-aware Select (whale.revise.select): rescore parent and kept candidate k more times,
    # fresh (sampling seeds + 1..k); 0 off
    noise_k: int = 0
    # A round whose proposal call failed (a timeout, an unreachable server): False (adapt,
    # cotrain) keeps it as a candidate that failed and goes on, and the failure is stored with
    # the round's proposals, so a resume replays the round as it was decided; True stops
    # before the round is decided (ProposalsFailed, caused by the model error: a runner resumes
    # it), and a rerun asks for it again. train-proposer's evaluate sets it: its ratchet
    # reading would otherwise count a slow server as a rejected edit. A prompt the proposer
    # cannot hold (`the_proposers_own`) is a failed candidate either way.
    stop_on_failed_proposal: bool = False


@dataclass
class RoundRecord:
    round: int
    parent_accuracy: float  # J of the round's parent on Q_score
    candidates: list[Candidate]
    decision: Decision
    rollouts: int
    parent_mean_score: float | None = None  # its mean partial score: shown, never decides


@dataclass
class AdaptResult:
    seed_hash: str
    final_hash: str
    rounds: list[RoundRecord]
    seed_eval: EvalResult
    final_eval: EvalResult
    proposals: int
    applicable: int

    @property
    def format_compliance(self) -> float:
        return self.applicable / self.proposals if self.proposals else 0.0


def adapt(
    task: Task,
    seed_source: str,
    feedback_pool: Sequence[Question],
    score_set: Sequence[Question],
    eval_split: SealedSplit,
    runtime: Runtime,
    proposer: Proposer,
    store: OutcomeStore,
    cfg: LoopSettings,
    say: Callable[[str], None] = lambda s: None,
) -> AdaptResult:
    seed_hash = store.save_harness(seed_source)
    h, rounds = revise(task, seed_source, feedback_pool, score_set, runtime, proposer, store, cfg,
                       say)  # fmt: skip
    q_eval = eval_split.open("final eval: seed and final harness", [seed_hash, h])
    say(f"final eval on {len(q_eval)} held-out questions")
    seed_eval = store.evaluate(runtime, seed_source, task, q_eval, "eval", cfg.workers)
    final_eval = store.evaluate(runtime, store.harness(h), task, q_eval, "eval", cfg.workers)
    n_prop = sum(len(r.candidates) for r in rounds)
    n_ok = sum(c.valid for r in rounds for c in r.candidates)
    return AdaptResult(seed_hash, h, rounds, seed_eval, final_eval, n_prop, n_ok)


def revise(
    task: Task,
    seed_source: str,
    feedback_pool: Sequence[Question],
    score_set: Sequence[Question],
    runtime: Runtime,
    proposer: Proposer,
    store: OutcomeStore,
    cfg: LoopSettings,
    say: Callable[[str], None] = lambda s: None,
    max_rollouts: int | None = None,
    rounds_dir: Path | None = None,
) -> tuple[str, list[RoundRecord]]:
    """The rounds alone (no eval split): the kept harness's hash and the round records. With
    `max_rollouts`, a hard cap on the store's rollouts: a round starts only when its worst
    case fits. Round folders go under `rounds_dir` (default: the store's run directory)."""
    h = store.save_harness(seed_source)
    rounds: list[RoundRecord] = []
    # Select's answer-echo screen guards every dev question the proposer or Select sees. It
    # compares with the seed, not the parent: echoes added a few per round, each step under the
    # screen's threshold, still add up against the seed.
    screen = (
        AnswerEchoScreen(task, screen_questions(feedback_pool, score_set), baseline=seed_source)
        if cfg.report.answer_echo_screen
        else None
    )
    for t in range(1, cfg.rounds + 1):
        rd = RoundDir(rounds_dir or store.dir, t)
        before = store.used
        rng = random.Random(cfg.seed * 100_003 + t)
        q_fb = rng.sample(list(feedback_pool), min(cfg.feedback, len(feedback_pool)))
        if max_rollouts is not None:
            # A hard cap: a round starts only if its most expensive outcome fits (the parent's
            # feedback and scoring not yet in the ledger, G candidates scored in full, and
            # Select's noise check: parent and kept candidate rescored k times, 2·k·|Q_score|).
            noise = 2 * cfg.noise_k * len(score_set) if cfg.noise_k >= 2 else 0
            worst = (store.unused(h, [q.id for q in q_fb])
                     + store.unused(h, [q.id for q in score_set]) + cfg.g * len(score_set)
                     + noise)
            if store.used + worst > max_rollouts:
                say(f"round {t}: not started: it may cost {worst} rollouts, "
                    f"{max(0, max_rollouts - store.used)} of the budget left")
                break
        fb = store.evaluate(runtime, store.harness(h), task, q_fb, "feedback", cfg.workers)
        report = build_report(task, q_fb, fb.outcomes, fb.trajectories, cfg.report)
        prompt = proposer.prompt(
            task.description,
            store.harness(h),
            report,
            runtime.budget,
            task_tools(task, runtime),
            runtime.package_names(),
        )
        _settle_older_rows(rd, prompt)  # before prompt.txt, which tells what they answer
        rd.write_text("report.md", report)
        rd.write_text("prompt.txt", prompt)
        seed = cfg.seed * 100_000 + t * 1000
        proposals = _proposals(rd, proposer, prompt, cfg.g, seed, store.harness(h),
                               not cfg.stop_on_failed_proposal)  # fmt: skip
        stop = [p.error for p in proposals if p.error and not the_proposers_own(p.error)]
        if stop and cfg.stop_on_failed_proposal:
            raise ProposalsFailed.of(f"round {t}", stop, cfg.g)
        say(
            f"round {t}: feedback {sum(o.correct for o in fb.outcomes)}/{len(q_fb)} correct; "
            f"{len(proposals)} proposal(s)"
        )
        parent = store.evaluate(runtime, store.harness(h), task, score_set, "score", cfg.workers)
        candidates = [
            _candidate(t, i, h, p, task, score_set, runtime, store, rd, cfg, screen)
            for i, p in enumerate(proposals)
        ]
        decision = select(cfg.select, h, parent.accuracy, candidates, parent.score)
        if cfg.noise_k >= 2 and decision.chosen is not None:
            decision = _noise_select(decision, task, score_set, runtime, store, cfg)
        rd.write_json("candidates.json", [asdict(c) for c in candidates])
        rd.write_json("decision.json", asdict(decision))
        say(
            f"round {t}: {sum(c.valid for c in candidates)}/{len(candidates)} applicable; "
            f"{decision.why}"
        )
        rounds.append(RoundRecord(t, parent.accuracy, candidates, decision, store.used - before,
                                  parent.score))  # fmt: skip
        h = decision.kept_hash
        if max_rollouts is not None and store.used >= max_rollouts:
            say(f"round {t}: rollout budget {max_rollouts} spent")
            break
    return h, rounds


def _noise_select(
    d: Decision,
    task: Task,
    score_set: Sequence[Question],
    runtime: Runtime,
    store: OutcomeStore,
    cfg: LoopSettings,
) -> Decision:
    """Select's noise check (the rule: whale.revise.select). Rescoring j = 1..k of the parent
    and of the candidate runs under the solver's sampling seed + j (unchanged when the runtime
    has no seed) and is keyed in the ledger by the fingerprint + ":rescore<j>" (split
    "rescore"); the round's own scoring (seed + 0, on which the candidate won Select) is not
    one of the k samples. They are real rollouts, 2·k·|Q_score| of them, counted by
    `store.used` like any other, and a resumed run (or a parent rescored in an earlier round
    as a candidate) answers them from the ledger."""
    assert d.chosen is not None
    fp, tags, used = store.fingerprint, dict(store.tags), store.used

    def rescore(j: int) -> tuple[float, float]:
        seed = None if runtime.seed is None else runtime.seed + j
        rt = dataclasses.replace(runtime, seed=seed)
        store.rebind(f"{fp}:rescore{j}", **tags)
        try:
            p, c = [store.evaluate(rt, store.harness(h), task, score_set, "rescore", cfg.workers)
                    for h in (d.parent_hash, d.kept_hash)]  # fmt: skip
            return p.accuracy, c.accuracy  # J: the verifier's, as Select's
        finally:
            rt.close()

    try:
        check = rescored_check(cfg.noise_k, rescore)
    finally:
        store.rebind(fp, **tags)
    return apply_noise_check(d, dataclasses.replace(check, rollouts=store.used - used))


def _prompt_key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8", "replace")).hexdigest()


def _stored_rows(rd: RoundDir) -> list[dict[str, Any]]:
    """proposals.json's rows, each with its index (an older file's: its position)."""
    if not rd.has("proposals.json"):
        return []
    rows, where = rd.read_json("proposals.json"), rd.path / "proposals.json"
    if not isinstance(rows, list):
        raise RecordError(f"{where}: not a list of proposals")
    for pos, row in enumerate(rows):
        if not isinstance(row, dict):
            raise RecordError(f"{where}: entry {pos} is not a proposal")
    return [{"index": pos, **row} for pos, row in enumerate(rows)]


def _settle_older_rows(rd: RoundDir, prompt: str) -> None:
    """Rows an older whale wrote name no prompt (`prompt_sha256`): the round's prompt.txt, not
    yet rewritten, is the one they answer. Those that answer `prompt` are named by it, the
    rest (and their failures, which were never final) dropped, before anything is asked: a
    resume killed while asking finds only named rows."""
    rows = _stored_rows(rd)
    if all("prompt_sha256" in r for r in rows):
        return
    key = _prompt_key(prompt)
    same = rd.read_bytes("prompt.txt") == prompt.encode("utf-8", "backslashreplace")  # as written
    rd.write_json("proposals.json", [
        r if "prompt_sha256" in r else {**r, "prompt_sha256": key} for r in rows
        if "prompt_sha256" in r or (same and r.get("error") is None)])  # fmt: skip


def _proposals(
    rd: RoundDir,
    proposer: Proposer,
    prompt: str,
    g: int,
    seed: int,
    parent: str,
    keep_failed: bool = True,
) -> list[Proposal]:
    """The round's G proposals (proposal i with sampling seed `seed + i`), kept in
    proposals.json and reused when a resumed run comes back to this round with the same
    prompt. A failed call (timeout, server error) is kept there too when the round goes on
    with it (`keep_failed`, or `the_proposers_own`), so a resume decides the round as it was
    decided; else it is not, and a resume asks for it again, with the same seed. This
    invocation's failures go to proposal_errors.json, for the record. Each kept proposal
    names the prompt it answers (`prompt_sha256`): a resume whose earlier round decided
    otherwise has another parent here, and the stored edits, written for the old one, are
    asked for again (rows of an older whale: `_settle_older_rows`)."""
    key = _prompt_key(prompt)
    done: dict[int, Proposal] = {}
    for row in _stored_rows(rd):
        i = row.pop("index")
        if row.pop("prompt_sha256", None) != key:
            continue  # the answer to another prompt
        try:
            p = Proposal(**row)
        except TypeError as e:
            raise RecordError(f"{rd.path / 'proposals.json'}: entry {i} is not a proposal ({e})"
                              ) from None  # fmt: skip
        if isinstance(i, int) and 0 <= i < g:
            done[i] = p
    missing = [i for i in range(g) if i not in done]
    if not missing:
        return [done[i] for i in range(g)]
    fresh = proposer.ask_missing(prompt, missing, seed, parent)
    done.update({i: p for i, p in fresh.items()
                 if p.error is None or keep_failed or the_proposers_own(p.error)})  # fmt: skip
    rd.write_json("proposals.json", [{"index": i, "prompt_sha256": key, **asdict(done[i])}
                                     for i in sorted(done)])  # fmt: skip
    failed = [{"index": i, **asdict(p)} for i, p in fresh.items() if p.error is not None]
    rd.write_json("proposal_errors.json", failed)
    return [done.get(i) or fresh[i] for i in range(g)]


def _candidate(
    t: int,
    i: int,
    parent_hash: str,
    p: Proposal,
    task: Task,
    score_set: Sequence[Question],
    runtime: Runtime,
    store: OutcomeStore,
    rd: RoundDir,
    cfg: LoopSettings,
    screen: AnswerEchoScreen | None = None,
) -> Candidate:
    parent_source = store.harness(parent_hash)
    rd.remove(f"candidate_{i}.diff")  # one an earlier ask of this round wrote (another edit)
    if p.error is not None:
        return Candidate(t, i, parent_hash, None, False, f"proposer: {p.error}", "none")
    res = apply_edits(parent_source, p.text)
    if not res.ok:
        v = reward(None, res.syntax_ok, False, 0.0, cfg.weights)
        return Candidate(
            t, i, parent_hash, None, False, res.reason, res.mode, res.syntax_ok, reward=v
        )
    echo = screen.check(res.source) if screen is not None else None
    if echo is not None:  # invalid before any rollout is paid; the diff is kept for audit
        rd.write_text(f"candidate_{i}.diff", diff(parent_source, res.source))
        v = reward(None, True, False, 0.0, cfg.weights)
        return Candidate(t, i, parent_hash, None, False, echo, res.mode, True, reward=v)
    h = store.save_harness(res.source)
    rd.write_text(f"candidate_{i}.diff", diff(parent_source, res.source))
    ev = store.evaluate(runtime, res.source, task, score_set, "score", cfg.workers)
    runnable = not all(o.failure is Failure.LOAD for o in ev.outcomes)
    r = reward(ev.accuracy, True, runnable, ev.rho_run, cfg.weights)
    return Candidate(t, i, parent_hash, h, True, "", res.mode, True, runnable, ev.rho_run,
                     ev.accuracy, r, len(ev.outcomes), ev.score)  # fmt: skip


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def summary_markdown(result: AdaptResult, meta: dict[str, Any]) -> str:
    lines = [f"# whale adapt: {meta.get('task')}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += [
        "",
        "J is the accuracy on the scoring questions (the task's binary verifier): Select and the "
        "reward use it. The mean (partial) score is shown beside it and decides nothing.",
        "",
        "| round | parent J | parent mean score | applicable | best candidate J | "
        "its mean score | its reward | decision |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result.rounds:
        scored = [c for c in r.candidates if c.accuracy is not None]
        # the best as Select sees it: highest J, earliest first among equals
        best = max(sorted(scored, key=lambda c: c.index), key=lambda c: c.accuracy or 0.0,
                   default=None)  # fmt: skip
        lines.append(
            f"| {r.round} | {r.parent_accuracy:.3f} | {_num(r.parent_mean_score)} | "
            f"{sum(c.valid for c in r.candidates)}/{len(r.candidates)} | "
            f"{_num(best.accuracy if best else None)} | {_num(best.mean_score if best else None)} "
            f"| {_num(best.reward if best else None)} | {r.decision.why} |"
        )
    s, f = result.seed_eval, result.final_eval
    lines += [
        "",
        f"Proposer format compliance: {result.applicable}/{result.proposals} proposals "
        f"gave an applicable candidate ({result.format_compliance:.0%}).",
        "",
        f"Held-out eval ({s.n} questions, read once):",
        "",
        "| harness | accuracy | mean score | ρ_run |",
        "|---|---|---|---|",
        f"| seed {result.seed_hash} | {s.accuracy:.3f} | {s.score:.3f} | {s.rho_run:.3f} |",
        f"| final {result.final_hash} | {f.accuracy:.3f} | {f.score:.3f} | {f.rho_run:.3f} |",
    ]
    return "\n".join(lines) + "\n"
