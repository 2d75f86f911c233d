"""`search`: Meta-Harness, WHALE's harness phase (seed 000, "Harness phase").

    archive = {seed: score(seed, Q_search)}
    for j in 1..I:
        for m in 1..M:
            c = agent(archive, task)                   # read-only tools, then one submission
            archive += validate(c), score(c, Q_search) # one trajectory per (candidate, example)
        accepted = archive.best()                      # may return to an earlier candidate
        if patience and no new best for P_h iterations after J_min: stop
        if the rollout budget is spent: stop

Every rollout goes through the OutcomeStore (so a duplicate by hash, or a resumed run, pays
nothing twice); every agent session is saved under `sessions/` before its candidate is scored,
so a resume reuses it. A session that fails in a way whale does not know is saved with that
reason and its candidate archived invalid ("no submission (failed: ...)"): it ends that
candidate, not the search, and a resume reads the record instead of running it again.
Candidate ids are fixed by (iteration, index): `c0000` is the seed, `cJJMM` is iteration JJ's
M-th candidate, and a resumed run skips what is archived.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from whale.evaluate import EvalResult
from whale.harness import Runtime, harness_hash
from whale.records import JsonlWriter, RecordError, read_json, read_jsonl, record_dir
from whale.revise.screens import AnswerEchoScreen
from whale.revise.store import OutcomeStore
from whale.search.agent import ProposerAgent, Session, Submission
from whale.search.archive import Archive, CandidateMeta
from whale.search.patience import Patience
from whale.search.tools import ArchiveTools, ToolCall
from whale.tasks import Question, Task

SEED_ID = "c0000"


class SearchStopped(RuntimeError):
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
    max_rollouts: int | None = None  # the operator's budget in rollouts, counted in the store
    workers: int = 4
    seed: int = 0


@dataclass
class IterationRecord:
    iteration: int
    candidates: list[str]
    valid: int
    tool_calls: int
    best_id: str
    best_score: float
    rollouts: int


@dataclass
class SearchResult:
    seed_id: str
    accepted_id: str
    seed_hash: str
    accepted_hash: str
    seed_score: float
    accepted_score: float
    iterations: list[IterationRecord] = field(default_factory=list)
    stopped: str = ""


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
) -> SearchResult:
    """`sessions`: where the proposer's sessions are logged (default `<store>/sessions`; one
    folder per archive when several searches share a store, as WHALE's harness phases do)."""
    sessions = record_dir(sessions or store.dir / "sessions")  # never a link (whale.records)
    # Against the seed, not the base: a chain of candidates cannot launder an echo.
    screen = (AnswerEchoScreen(task, search_set, baseline=seed_source)
              if cfg.answer_echo_screen else None)  # fmt: skip
    if SEED_ID not in archive:
        ev = store.evaluate(runtime, seed_source, task, search_set, "search", cfg.workers)
        _archive(archive, CandidateMeta(SEED_ID, None, 0, "seed", harness_hash(seed_source),
                                        True), seed_source, ev)  # fmt: skip
    else:  # scored by a run that was killed: its rollouts count for this one's budget
        store.mark_used(archive.get(SEED_ID).hash or "", [q.id for q in search_set])
    seed = archive.get(SEED_ID)
    if seed.hash != harness_hash(seed_source):
        raise SearchStopped(
            f"{archive.root} holds a search from seed {seed.hash}, not from this harness "
            f"({harness_hash(seed_source)}): use another folder"
        )
    if not seed.valid or seed.score is None:
        raise SearchStopped(f"the seed harness is not usable: {seed.reason}")
    records: list[IterationRecord] = []
    best_after: list[float] = []
    stopped = f"{cfg.iterations} iterations"
    for j in range(1, cfg.iterations + 1):
        before, calls, ids = store.used, 0, []
        for i in range(cfg.m):
            if cfg.max_rollouts is not None and store.used >= cfg.max_rollouts:
                break  # checked before each candidate; one candidate may pass it by |Q_search|
            cid = f"c{j:02d}{i:02d}"
            ids.append(cid)
            if cid in archive:  # archived before a kill: paid then, counted now (replay)
                meta = archive.get(cid)
                if meta.valid and meta.score is not None and meta.hash is not None:
                    store.mark_used(meta.hash, [q.id for q in search_set])
                continue
            session = _session(sessions / f"{cid}.json", agent, archive, j, i, cfg)
            calls += len(session.calls)
            _score_submission(cid, j, session, task, search_set, runtime, store, archive, cfg,
                              screen)  # fmt: skip
        if not ids:  # the rollout budget was spent before this iteration's first candidate
            stopped = f"rollout budget {cfg.max_rollouts} spent (before iteration {j})"
            break
        best = archive.best() or seed
        best_after.append(best.score or 0.0)
        valid = sum(archive.get(c).valid for c in ids)
        records.append(IterationRecord(j, ids, valid, calls, best.id, best.score or 0.0,
                                       store.used - before))  # fmt: skip
        say(f"iteration {j}: {valid}/{len(ids)} valid; best {best.id} ({best.score:.3f})")
        if cfg.patience is not None and cfg.patience.should_stop(best_after, seed.score or 0.0):
            stopped = f"patience: no new best for {cfg.patience.p_h} iterations (after {j})"
            break
        if cfg.max_rollouts is not None and store.used >= cfg.max_rollouts:
            stopped = f"rollout budget {cfg.max_rollouts} spent (after iteration {j})"
            break
    accepted = archive.best() or seed
    assert accepted.hash is not None and seed.hash is not None
    return SearchResult(SEED_ID, accepted.id, seed.hash, accepted.hash, seed.score or 0.0,
                        accepted.score or 0.0, records, stopped)  # fmt: skip


def brief(archive: Archive, tools: ArchiveTools, iteration: int, k: int = 5) -> str:
    """Where the search stands, as the agent's first user message: the top candidates, recent
    invalid ones, and the best one's source and failures (small models spend their few steps
    better when these are already in view; the tools reach everything else)."""
    rows = [f"- {m.id}: score {m.score:.3f}, parent {m.parent_id}, hypothesis: {m.hypothesis}"
            for m in archive.top(k)]  # fmt: skip
    invalid = [m for m in archive.candidates() if not m.valid][-3:]
    lines = [f"Iteration {iteration}. {len(archive)} candidates archived. Best so far:", *rows]
    if invalid:
        lines += ["Recent invalid candidates:", *(f"- {m.id}: {m.reason[:200]}" for m in invalid)]
    best = archive.best()
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
    whole session every step cost the search ~1% of its wall time); the whole session goes to
    `path` at the end, also when it failed, so a resume reads the failure, not runs it."""
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
        raise SearchStopped(f"the proposer failed in session {path.stem}: {s.ended}")
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


def _score_submission(cid: str, j: int, session: Session, task: Task,
                      search_set: Sequence[Question], runtime: Runtime, store: OutcomeStore,
                      archive: Archive, cfg: SearchSettings,
                      screen: AnswerEchoScreen | None) -> None:  # fmt: skip
    sub = session.submission
    if sub is None:
        meta = CandidateMeta(cid, None, j, "", None, False, f"no submission ({session.ended})")
        archive.add(meta, None)
        return
    parent = sub.base if sub.base in archive else None
    if not sub.valid or sub.source is None:  # Apply said why (it checks the run contract)
        archive.add(CandidateMeta(cid, parent, j, sub.hypothesis, None, False, sub.reason), None)
        return
    echo = screen.check(sub.source) if screen is not None else None
    if echo is not None:  # invalid before any rollout is paid; its source is kept to read
        meta = CandidateMeta(cid, parent, j, sub.hypothesis, harness_hash(sub.source), False, echo)
        archive.add(meta, sub.source)
        return
    ev = store.evaluate(runtime, sub.source, task, search_set, "search", cfg.workers)
    meta = CandidateMeta(cid, parent, j, sub.hypothesis, harness_hash(sub.source), True)
    _archive(archive, meta, sub.source, ev)


def _archive(archive: Archive, meta: CandidateMeta, source: str, ev: EvalResult) -> None:
    """Archive a scored candidate. A harness that never loads is kept, invalid, no score."""
    if ev.outcomes and all((o.error or "").startswith("load:") for o in ev.outcomes):
        reason = f"does not load in the sandbox: {(ev.outcomes[0].error or '')[:300]}"
        meta = replace(meta, valid=False, reason=reason, n_scored=ev.n)
    else:
        meta = replace(meta, valid=True, score=ev.score, accuracy=ev.accuracy,
                       rho_run=ev.rho_run, n_scored=ev.n)  # fmt: skip
    archive.add(meta, source, [asdict(o) for o in ev.outcomes], ev.trajectories)
