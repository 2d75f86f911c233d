"""`search`: Meta-Harness, WHALE's harness phase (seed 000, "Harness phase").

    archive = {start: score(start, Q_search)}  (one archive for every harness phase)
    for j in 1..I:
        for m in 1..M:
            if scoring one more candidate would pass the rollout cap: stop (nothing started)
            c = agent(archive, task)                   # read-only tools, then one submission
            archive += validate(c), score(c, Q_search) # one trajectory per (candidate, example)
        accepted = archive.best()                      # may return to an earlier candidate
        if patience and no new best for P_h iterations after J_min: stop
        if the rollout budget is spent: stop

One verifier: the ranking, the accepted candidate and the patience track use accuracy (the
fraction of search questions the task's verifier accepts); the mean partial score is kept
beside it (`score`, `best_score`) and decides nothing. Ties go to the earlier candidate.

The rollout cap is hard: a candidate whose full scoring would pass it is not started (scoring
it on part of the split would bias its accuracy); the phase stops and says why. A proposal's
cost is counted as |Q_search| before its agent session (a duplicate would cost less, but no
session is spent on a candidate that may not be scored).

Several phases, one archive (`PhaseStart`, used by `operator.SearchOperator`): candidate ids
and iteration numbers continue from phase to phase, and a phase ranks everything archived
before it that was scored under the same solver (the store's fingerprint). Its start harness
is a candidate of the phase (`origin` "start", id `c<J0>00` at the phase's start iteration
J0), unless the archive already holds it scored under this solver, whose scores then stand
and cost nothing. Earlier candidates named in `PhaseStart.rescore` (the operator passes the
previous phase's top k when the weights changed) are scored again under this solver as
candidates `c<J0>01`, ... (`origin` "rescore", parent the candidate they copy), so they can be
accepted again; the rest stay in the archive, shown to the agent with their scores labelled
as measured under other weights, and never ranked.

Every rollout goes through the OutcomeStore (so a duplicate by hash, or a resumed run, pays
nothing twice); every agent session is saved under `sessions/` before its candidate is scored,
so a resume reuses it. A session that fails in a way whale does not know is saved with that
reason and its candidate archived invalid ("no submission (failed: ...)"): it ends that
candidate, not the search, and a resume reads the record instead of running it again.
Candidate ids are fixed by (iteration, index): `c0000` is the seed, `cJJMM` is iteration JJ's
M-th candidate, and a resumed run skips what is archived. The ranking only ever sees the
candidates up to the current iteration (`Archive.view`), so a replay takes the decisions the
killed run took even though the archive already holds what came after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from whale.errors import WhaleError
from whale.evaluation import EvalResult
from whale.harness import Failure, Runtime, harness_hash
from whale.harness.bundle import ENTRY, header, is_bundle
from whale.metaharness.agent import ProposerAgent, Session, Submission
from whale.metaharness.archive import Archive, CandidateMeta
from whale.metaharness.patience import Patience
from whale.metaharness.tools import ArchiveTools, ToolCall
from whale.models.base import failure_cause
from whale.records import JsonlWriter, RecordError, read_json, read_jsonl, record_dir
from whale.revise.edits import SEARCH
from whale.revise.screens import AnswerEchoScreen
from whale.runs import OutcomeStore
from whale.tasks import Question, Task

SEED_ID = "c0000"


class SearchStopped(WhaleError, RuntimeError):
    """The search cannot go on (the seed does not load, the proposer's backend fails); what
    was paid is kept, and a resume continues once the cause is fixed."""


@dataclass(frozen=True)
class SearchSettings:
    iterations: int = 6
    m: int = 2
    patience: Patience | None = None  # None: run all iterations (fixed budget)
    # The agent reads answers in the archive: a candidate that hard-codes answers or prompts
    # of the search questions (that its base did not) is invalid, reason "answer echo".
    answer_echo_screen: bool = True
    max_rollouts: int | None = None  # a hard cap on the store's `used` count (see above)
    workers: int = 4
    seed: int = 0
    # WHALE (one archive for several phases): when the solver's weights changed since the
    # previous harness phase, that phase's top `rescore` candidates are scored again under
    # the new weights at the start of the next (its accepted one, the new start, among them).
    rescore: int = 2


@dataclass(frozen=True)
class PhaseStart:
    """Where one call of `search` starts in an archive that several harness phases share;
    the default is a search of its own (the seed is `c0000`)."""

    phase: int = 1
    iteration: int = 0  # J0: the phase's start harness, when archived, is c<J0>00
    rescore: tuple[str, ...] = ()  # earlier candidates to score again under this solver


@dataclass
class IterationRecord:
    iteration: int
    candidates: list[str]
    valid: int
    tool_calls: int
    best_id: str
    best_accuracy: float  # what ranks (fraction correct on the search split)
    best_score: float  # the best one's mean partial score (an extra column)
    rollouts: int


@dataclass
class SearchResult:
    seed_id: str  # the phase's start candidate ("" when the budget did not cover its scoring)
    accepted_id: str  # "" likewise: nothing was scored, the start harness stands
    seed_hash: str
    accepted_hash: str
    seed_score: float  # mean partial scores (extra columns)
    accepted_score: float
    iterations: list[IterationRecord] = field(default_factory=list)
    stopped: str = ""
    seed_accuracy: float = 0.0
    accepted_accuracy: float = 0.0
    next_iteration: int = 1  # the first iteration number a later phase may use
    rescored: list[str] = field(default_factory=list)  # ids of this phase's rescores


def search(
    task: Task,
    seed_source: str,
    search_set: Sequence[Question],
    runtime: Runtime,
    agent: ProposerAgent,
    store: OutcomeStore,
    archive: Archive,
    cfg: SearchSettings,
    say: Callable[[str], None] = lambda s: None,
    sessions: Path | None = None,
    start: PhaseStart = PhaseStart(),
) -> SearchResult:
    """`sessions`: where the proposer's sessions are logged (default `<store>/sessions`).
    `start`: where this phase starts in a shared archive (module docstring)."""
    sessions = record_dir(sessions or store.dir / "sessions")  # never a link (whale.records)
    fp, j0, qids = store.fingerprint, start.iteration, [q.id for q in search_set]
    archive.view(fp, j0 - 1)  # what earlier phases left
    seed0 = archive.get(SEED_ID) if SEED_ID in archive else None
    # Against the first seed, not the base or the phase's start: a chain of candidates, across
    # phases too, cannot launder an echo.
    baseline = archive.source(SEED_ID) if seed0 is not None and archive.visible(seed0) \
        else seed_source  # fmt: skip
    screen = (AnswerEchoScreen(task, search_set, baseline=baseline)
              if cfg.answer_echo_screen else None)  # fmt: skip
    h0 = harness_hash(seed_source)
    start_meta, added, halt = _phase_start(start, seed_source, task, search_set, runtime, store,
                                           archive, cfg)  # fmt: skip
    if start_meta is None:  # nothing was scored in this phase: its start harness stands
        return SearchResult("", "", h0, h0, 0.0, 0.0, [], halt, next_iteration=j0)
    first = j0 + 1 if added else j0
    archive.view(fp, first - 1)
    start_best = archive.best() or start_meta
    records: list[IterationRecord] = []
    best_after: list[float] = []
    stopped, last = halt or f"{cfg.iterations} iterations", first - 1
    for j in range(first, first + cfg.iterations) if not halt else ():
        archive.view(fp, j)
        before, calls, ids = store.used, 0, []
        for i in range(cfg.m):
            # Checked before the session, at a full scoring's cost, also when replayed (the
            # same check, on the same count, takes the same decision).
            halt = _budget_halt(store, cfg, len(set(qids)), "a new candidate")
            if halt:
                break
            cid = f"c{j:02d}{i:02d}"
            ids.append(cid)
            if cid in archive:  # archived before a kill: paid then, counted now (replay)
                _count_replayed(store, archive.get(cid), qids)
                saved = sessions / f"{cid}.json"
                if saved.exists():  # its record, as the killed run made it
                    calls += len(_session(saved, agent, archive, j, i, cfg).calls)
                continue
            session = _session(sessions / f"{cid}.json", agent, archive, j, i, cfg)
            calls += len(session.calls)
            _score_submission(cid, j, start.phase, session, task, search_set, runtime, store,
                              archive, cfg, screen)  # fmt: skip
        if ids:
            last = j
            best = archive.best() or start_best
            best_after.append(best.accuracy or 0.0)
            valid = sum(archive.get(c).valid for c in ids)
            records.append(IterationRecord(j, ids, valid, calls, best.id, best.accuracy or 0.0,
                                           best.score or 0.0, store.used - before))  # fmt: skip
            say(f"iteration {j}: {valid}/{len(ids)} valid; best {best.id} "
                f"({best.accuracy_text()})")  # fmt: skip
        if halt:
            stopped = f"{halt} at iteration {j}"
            break
        if cfg.patience is not None and cfg.patience.should_stop(best_after,
                                                                 start_best.accuracy or 0.0):
            stopped = f"patience: no new best for {cfg.patience.p_h} iterations (after {j})"
            break
        if cfg.max_rollouts is not None and store.used >= cfg.max_rollouts:
            stopped = f"rollout budget {cfg.max_rollouts} spent (after iteration {j})"
            break
    archive.view(fp, last)
    accepted = archive.best() or start_best
    assert accepted.hash is not None and start_meta.hash is not None
    return SearchResult(start_meta.id, accepted.id, start_meta.hash, accepted.hash,
                        start_meta.score or 0.0, accepted.score or 0.0, records, stopped,
                        start_meta.accuracy or 0.0, accepted.accuracy or 0.0, last + 1,
                        [a for a in added if archive.get(a).origin == "rescore"])  # fmt: skip


def _phase_start(start: PhaseStart, seed_source: str, task: Task,
                 search_set: Sequence[Question], runtime: Runtime, store: OutcomeStore,
                 archive: Archive,
                 cfg: SearchSettings) -> tuple[CandidateMeta | None, list[str], str]:  # fmt: skip
    """The phase's start candidate (None when the cap did not let it be scored), the ids
    archived at the start iteration (the start, the rescores), and why the phase cannot go
    on ("" when it can). The archive's view is that of the earlier phases."""
    j0, fp, h0 = start.iteration, store.fingerprint, harness_hash(seed_source)
    added: list[str] = []
    start_meta = archive.by_hash(h0)  # scored under this solver already: its scores stand
    if start_meta is None:
        meta = CandidateMeta(f"c{j0:02d}00", _copy_of(archive, h0), j0, "seed" if j0 == 0
                             else f"start of harness phase {start.phase}", h0, True,
                             phase=start.phase, solver=fp, origin="start")  # fmt: skip
        halt = _score_known(meta, seed_source, task, search_set, runtime, store, archive, cfg)
        if halt:
            return None, added, halt
        start_meta = archive.get(meta.id)
        added.append(meta.id)
        if not start_meta.rankable:
            raise SearchStopped(f"the seed harness is not usable: {start_meta.reason}")
    for rid in start.rescore:
        old = archive.get(rid)
        if old.hash is None or archive.by_hash(old.hash) is not None or any(
                archive.get(a).hash == old.hash for a in added):  # fmt: skip
            continue  # already scored under this solver (the start, a duplicate)
        meta = CandidateMeta(f"c{j0:02d}{len(added):02d}", rid, j0,
                             f"{rid} scored again under the weights of harness phase "
                             f"{start.phase}", old.hash, True, phase=start.phase, solver=fp,
                             origin="rescore")  # fmt: skip
        halt = _score_known(meta, archive.source(rid), task, search_set, runtime, store,
                            archive, cfg)  # fmt: skip
        if halt:
            return start_meta, added, halt
        added.append(meta.id)
    return start_meta, added, ""


def _copy_of(archive: Archive, h: str) -> str | None:
    """The id of the latest candidate in view with source `h`, whatever solver scored it."""
    ids = [m.id for m in archive.candidates() if m.hash == h and archive.visible(m)]
    return ids[-1] if ids else None


def _budget_halt(store: OutcomeStore, cfg: SearchSettings, cost: int, what: str) -> str:
    """Why `what`, costing `cost` new rollouts, is not started, or "" when the cap allows it."""
    if cfg.max_rollouts is None:
        return ""
    left = cfg.max_rollouts - store.used
    if cost <= left:
        return ""
    return f"rollout budget: {max(0, left)} left, scoring {what} takes {cost} (not started)"


def _count_replayed(store: OutcomeStore, meta: CandidateMeta, qids: list[str]) -> None:
    """A candidate archived before a kill: its rollouts were paid then and count now (a
    harness that never loaded was run too: `n_scored`)."""
    if meta.hash is not None and (meta.n_scored > 0 or meta.score is not None):
        store.mark_used(meta.hash, qids)


def _score_known(meta: CandidateMeta, source: str, task: Task, search_set: Sequence[Question],
                 runtime: Runtime, store: OutcomeStore, archive: Archive,
                 cfg: SearchSettings) -> str:  # fmt: skip
    """Archive `meta` (a start or a rescore: its source is known) scored under the store's
    solver, or replay it from the archive; "" or why it was not started (the rollout cap)."""
    assert meta.hash is not None
    qids = [q.id for q in search_set]
    halt = _budget_halt(store, cfg, store.unused(meta.hash, qids), f"{meta.id} ({meta.origin})")
    if halt:
        return halt
    if meta.id in archive:
        got = archive.get(meta.id)
        if got.hash != meta.hash:
            what = "a search from seed" if meta.id == SEED_ID else f"{meta.id} from harness"
            raise SearchStopped(
                f"{archive.root} holds {what} {got.hash}, not from this harness "
                f"({meta.hash}): use another folder"
            )
        _count_replayed(store, got, qids)
        return ""
    ev = store.evaluate(runtime, source, task, search_set, "search", cfg.workers)
    _archive(archive, meta, source, ev)
    return ""


# The edit format of a harness of several files, in the brief when the harness is one (the
# system prompt, written for one file, is left as it was).
FILES_NOTE = (
    "This harness is a folder of Python files, kept in each candidate's harness.py as one text: "
    f"each file follows a line {header('NAME')!r}, which is not part of the file, and {ENTRY} "
    "defines run(question, env) and imports the others by their module names. A SEARCH/REPLACE "
    f"block names the file it edits on its SEARCH line: {SEARCH} NAME (a block that names none "
    f"edits {ENTRY}); its SEARCH copies whole lines of that file."
)


def brief(archive: Archive, tools: ArchiveTools, iteration: int, k: int = 5) -> str:
    """Where the search stands, as the agent's first user message: the top candidates, recent
    invalid ones, and the best one's source and failures (small models spend their few steps
    better when these are already in view; the tools reach everything else)."""
    rows = [f"- {m.id}: {m.accuracy_text()}, parent {m.parent_id}, hypothesis: {m.hypothesis}"
            for m in archive.top(k)]  # fmt: skip
    invalid = [m for m in archive.candidates() if not m.valid][-3:]
    lines = [f"Iteration {iteration}. {len(archive)} candidates archived. Best so far "
             "(ranked by accuracy):", *rows]  # fmt: skip
    other = archive.earlier(3)
    if other:
        lines += ["Scored under earlier weights (not comparable with the above):",
                  *(f"- {m.id}: {archive.label(m)}" for m in other)]  # fmt: skip
    if invalid:
        lines += ["Recent invalid candidates:", *(f"- {m.id}: {m.reason[:200]}" for m in invalid)]
    best = archive.best()
    if best is not None and is_bundle(archive.source(best.id)):
        lines += ["", FILES_NOTE]
    if best is not None:
        lines += [f"\n{best.id}/harness.py:", tools.call(ToolCall("read", {"path":
                  f"{best.id}/harness.py"})), "", tools.call(ToolCall("failures",
                  {"id": best.id, "n": 2}))]  # fmt: skip
    return "\n".join(lines)


def _session(path: Path, agent: ProposerAgent, archive: Archive, j: int, i: int,
             cfg: SearchSettings) -> Session:  # fmt: skip
    """The agent session for candidate (j, i): from `path` when a resumed run already paid for
    it, continued from its last logged step when a kill cut it short. Each call is appended to
    `<cid>.steps.jsonl` before it runs and again with its output (a line each: rewriting the
    whole session every step cost the search wall time, docs/measurements.md); the whole
    session goes to `path` at the end, also when it failed, so a resume reads the failure, not
    runs it."""
    if path.exists() or path.is_symlink():
        d = read_json(path)  # never through a link or from a FIFO (whale.records)
        try:
            sub = d.pop("submission", None)
            done = Session(**d)
            done.submission = Submission(**sub) if sub else None
        except (AttributeError, TypeError) as e:
            raise RecordError(f"{path}: not a saved session ({e})") from None
        return done
    steps = path.with_suffix(".steps.jsonl")
    partial = _replay(steps)
    log = JsonlWriter(steps)
    seen = {"messages": len(partial.messages) if partial else 0,
            "calls": len(partial.calls) if partial else 0}  # fmt: skip

    def on_step(s: Session) -> None:
        # "last": the latest call as it stands now; it was logged before it ran (output None)
        # and this row may carry its output.
        log.write({
            "iteration": s.iteration, "index": s.index, "seed": s.seed, "tokens": s.tokens,
            "trimmed": s.trimmed, "messages": s.messages[seen["messages"]:],
            "calls": s.calls[seen["calls"]:], "last": s.calls[-1] if s.calls else None,
        })  # fmt: skip
        seen.update(messages=len(s.messages), calls=len(s.calls))

    seed = cfg.seed * 100_000 + j * 100 + i
    failure: Exception | None = None
    try:
        s = agent.run(j, i, seed=seed, brief=brief(archive, agent.tools, j), resume=partial,
                      on_step=on_step)  # fmt: skip
    except Exception as e:  # whale does not know this failure: it ends this candidate only
        failure = e
    finally:
        log.close()
    if failure is not None:  # the session as far as it was logged, with the reason
        s = _replay(steps) or Session(j, i, seed)
        s.ended = f"failed: {type(failure).__name__}: {str(failure)[:300]}"
        if s.calls and s.calls[-1].get("output") is None:
            s.calls[-1]["output"] = f"error: {s.ended}"
    if s.ended.startswith("model error"):  # its finished steps are logged; a resume goes on
        # from the model error (a timeout: the experiment runner resumes it by itself)
        cause = failure_cause([s.ended.removeprefix("model error: ")])
        raise SearchStopped(f"the proposer failed in session {path.stem}: {s.ended}") from cause
    s.save(path)  # read on resume, never run again
    steps.unlink(missing_ok=True)
    return s


def _replay(steps: Path) -> Session | None:
    """The session a steps log holds so far, or None when it holds no step."""
    rows = read_jsonl(steps)
    if not rows:
        return None
    s = Session(rows[0]["iteration"], rows[0]["index"], rows[0]["seed"])
    for r in rows:
        s.messages += r["messages"]
        s.calls += r["calls"]
        if r.get("last") is not None and s.calls:
            s.calls[-1] = r["last"]
        s.tokens = r["tokens"]
        s.trimmed = r.get("trimmed", 0)
    return s


def _score_submission(cid: str, j: int, phase: int, session: Session, task: Task,
                      search_set: Sequence[Question], runtime: Runtime, store: OutcomeStore,
                      archive: Archive, cfg: SearchSettings,
                      screen: AnswerEchoScreen | None) -> None:  # fmt: skip
    sub = session.submission
    fp = store.fingerprint

    def add(meta: CandidateMeta, source: str | None) -> None:
        archive.add(replace(meta, phase=phase, solver=fp), source)

    if sub is None:
        add(CandidateMeta(cid, None, j, "", None, False, f"no submission ({session.ended})"),
            None)  # fmt: skip
        return
    parent = sub.base if sub.base in archive else None
    if not sub.valid or sub.source is None:  # Apply said why (it checks the run contract)
        add(CandidateMeta(cid, parent, j, sub.hypothesis, None, False, sub.reason), None)
        return
    h = harness_hash(sub.source)
    echo = screen.check(sub.source) if screen is not None else None
    if echo is not None:  # invalid before any rollout is paid; its source is kept to read
        add(CandidateMeta(cid, parent, j, sub.hypothesis, h, False, echo), sub.source)
        return
    ev = store.evaluate(runtime, sub.source, task, search_set, "search", cfg.workers)
    _archive(archive, CandidateMeta(cid, parent, j, sub.hypothesis, h, True, phase=phase,
                                    solver=fp), sub.source, ev)  # fmt: skip


def _archive(archive: Archive, meta: CandidateMeta, source: str, ev: EvalResult) -> None:
    """Archive a scored candidate. A harness that never loads is kept, invalid, no score."""
    if ev.outcomes and all(o.failure is Failure.LOAD for o in ev.outcomes):
        reason = f"does not load in the sandbox: {(ev.outcomes[0].error or '')[:300]}"
        meta = replace(meta, valid=False, reason=reason, n_scored=ev.n)
    else:
        meta = replace(meta, valid=True, score=ev.score, accuracy=ev.accuracy,
                       rho_run=ev.rho_run, n_scored=ev.n)  # fmt: skip
    archive.add(meta, source, [asdict(o) for o in ev.outcomes], ev.trajectories)
