"""The rollout ledger every command keeps (eval excepted), and the outcome store that makes
resume free.

Every rollout is appended, as it finishes, to `outcomes.jsonl` (the rollout ledger), keyed by
(fingerprint, harness hash, question id), with its trajectory in `trajectories/<hash>.jsonl`
and the harness source in `harnesses/<hash>.py`. The fingerprint says what else produced the
outcome (task and its config, solver identity, runtime budgets, limits, sampling:
`whale.runs.fingerprint.outcome_fingerprint`), so an outcome is reused only by a request that
would have produced it. Any later request for the same key is answered from the store, so
identical candidates are scored once and a killed run, resumed, pays for nothing twice.
`whale adapt`, `search`, `cotrain`, `rsft`, `diagnose` and `train-proposer` all write
through it; the report, the audit and the curves read the rows back (`ledger_row`).

Records are opened without following links (`whale.records.open_record`): a ledger, a
trajectory file or a sub-folder replaced by a symlink is a `RecordError` naming it, so a
resume stops before it writes anywhere. Nothing read back is trusted: a ledger row of the
wrong shape, a row without a fingerprint (written by a whale before fingerprints, whose
resume accepted config changes, so what produced it is unknown), a harness file whose content
does not hash to its name, or an outcome whose trajectory is missing, is a `RecordError`
naming the file (and line).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from whale.evaluation import EvalResult, Outcome, evaluate
from whale.harness import Runtime, Trajectory, harness_hash, read_failure
from whale.harness.bundle import BundleError, is_bundle, write_folder
from whale.records import JsonlWriter, RecordError, iter_jsonl, record_dir, write_atomic
from whale.tasks import Question, Task

Key = tuple[str, str, str]  # (fingerprint, harness hash, question id)

# Tags a caller may put on every row it writes (`OutcomeStore.tags`): WHALE's schedule marks
# each rollout with its schedule, cycle, phase, kind, step and adapter, so that one ledger
# serves every curve (whale.schedule.loop). Their types, checked on read.
TAGS: dict[str, Any] = {"schedule": str, "cycle": int, "phase": str, "kind": str, "step": int,
                        "adapter": str | None}  # fmt: skip


class OutcomeStore:
    """The ledger of one run directory (a cotrain schedule's folder, a train-proposer family's
    folder): outcomes by (fingerprint, harness hash, question id), their trajectories and the
    harness sources, read back on open and appended to as rollouts finish."""

    def __init__(self, run_dir: Path, fingerprint: str = "") -> None:
        self.dir = run_dir
        self.fingerprint = fingerprint
        self.dir.mkdir(parents=True, exist_ok=True)
        # A sub-folder or ledger that is a link is refused (RecordError naming it): a resume
        # must not write a run's records wherever a link points.
        record_dir(self.dir / "harnesses")
        record_dir(self.dir / "trajectories")
        self._outcomes: dict[Key, Outcome] = {}
        path = self.dir / "outcomes.jsonl"
        for n, row in iter_jsonl(path):
            key, outcome = ledger_row(row, f"{path}:{n}")
            self._outcomes[key] = outcome
        self._ledger = JsonlWriter(path)
        self.new_rollouts = 0
        self._trajs: dict[str, dict[str, Trajectory]] = {}
        self.tags: dict[str, Any] = {}
        self._used: set[Key] = set()

    def rebind(self, fingerprint: str, **tags: Any) -> None:
        """Key later rollouts by another fingerprint (WHALE: the solver's weights changed) and
        tag their rows with `tags` (names and types of `TAGS`)."""
        bad = [k for k in tags if k not in TAGS or not _fits(tags[k], TAGS[k])]
        if bad:
            raise ValueError(f"not a ledger tag (or of the wrong type): {bad}")
        if fingerprint != self.fingerprint:
            self._trajs.clear()  # cached by harness under the old fingerprint
        self.fingerprint, self.tags = fingerprint, dict(tags)

    @property
    def rollouts(self) -> int:
        """Rollouts in the ledger (every one ever paid for in this run directory)."""
        return len(self._outcomes)

    @property
    def used(self) -> int:
        """Distinct rollouts this process asked for, paid now or answered from the ledger.
        Budgets count this: a resumed run replays its requests in order, so it takes the
        decisions the killed one took, while `rollouts` already holds the killed run's future."""
        return len(self._used)

    def mark_used(self, h: str, question_ids: Sequence[str]) -> None:
        """Count rollouts of harness `h` as used without asking for them: a resumed operator
        that skips work its records hold (an archived candidate) still replays its budget."""
        self._used.update((self.fingerprint, h, q) for q in question_ids)

    def unused(self, h: str, question_ids: Sequence[str]) -> int:
        """How many rollouts asking for harness `h` on these questions would add to `used`
        (what it costs a budget): a hard cap is checked before a scoring starts."""
        return len({(self.fingerprint, h, q) for q in question_ids} - self._used)

    def _harness_path(self, h: str) -> Path:
        return self.dir / "harnesses" / f"{h}.py"

    def save_harness(self, source: str) -> str:
        h = harness_hash(source)
        path = self._harness_path(h)
        try:
            intact = harness_hash(path.read_text(encoding="utf-8")) == h
        except (OSError, UnicodeDecodeError):
            intact = False
        if not intact:  # absent, or cut by an edit: this source is what the name says
            write_atomic(path, source)
        return h

    def harness(self, h: str) -> str:
        """The source saved under hash `h`, checked against the hash."""
        return saved_harness(self.dir, h)

    def trajectories(self, h: str) -> dict[str, Trajectory]:
        """Trajectories of harness `h` under this store's fingerprint, by question id: read
        from disk once, then kept current as new runs finish."""
        if h not in self._trajs:
            path = self.dir / "trajectories" / f"{h}.jsonl"
            known: dict[str, Trajectory] = {}
            for n, row in iter_jsonl(path):
                if row.get("fingerprint", "") != self.fingerprint:
                    continue
                try:
                    t = Trajectory.from_dict(row)
                except (TypeError, ValueError) as e:
                    raise RecordError(f"{path}:{n}: not a trajectory ({e})") from None
                known[t.question_id] = t
            self._trajs[h] = known
        return self._trajs[h]

    def evaluate(
        self,
        runtime: Runtime,
        source: str,
        task: Task,
        questions: Sequence[Question],
        split: str,
        workers: int,
        on_done: Callable[[], None] | None = None,
    ) -> EvalResult:
        """Outcomes of `source` on `questions`, running only the pairs not yet in the store."""
        h = self.save_harness(source)
        fp = self.fingerprint
        self._used.update((fp, h, q.id) for q in questions)
        # One run per key, even when a question is asked twice in one call.
        missing = list({q.id: q for q in questions if (fp, h, q.id) not in self._outcomes}.values())
        traj_path = self.dir / "trajectories" / f"{h}.jsonl"
        known = self.trajectories(h)
        tags = dict(self.tags)
        if missing:
            traj_f = JsonlWriter(traj_path)

            def done(o: Outcome, t: Trajectory) -> None:
                # trajectory first: an outcome implies its trajectory
                traj_f.write({"fingerprint": fp, **t.to_dict()})
                known[o.question_id] = t
                self._ledger.write({"fingerprint": fp, "harness": h, "split": split, **tags,
                                    **asdict(o)})  # fmt: skip
                self._outcomes[(fp, h, o.question_id)] = o
                self.new_rollouts += 1
                if on_done is not None:
                    on_done()

            try:
                evaluate(runtime, source, task, missing, workers, on_done=done)
            finally:
                traj_f.close()
        lost = [q.id for q in questions if q.id not in known]
        if lost:
            raise RecordError(
                f"{traj_path}: no trajectory for {len(lost)} question(s) whose outcomes are in "
                f"{self.dir / 'outcomes.jsonl'} (first: {lost[0]}); the file was deleted or cut"
            )
        outcomes = [self._outcomes[(fp, h, q.id)] for q in questions]
        return EvalResult(outcomes, [known[q.id] for q in questions])

    def close(self) -> None:
        self._ledger.close()


_OUTCOME_HINTS = typing.get_type_hints(Outcome)
_REQUIRED = {
    f.name for f in fields(Outcome) if f.default is MISSING and f.default_factory is MISSING
}


def ledger_row(row: dict[str, Any], where: str) -> tuple[Key, Outcome]:
    """The key and outcome of one ledger row, or RecordError naming `where` (file:line)."""
    if "fingerprint" not in row:
        raise RecordError(
            f"{where}: a ledger row without an outcome fingerprint (written by an older whale, "
            "whose resume accepted config changes, so what produced it is unknown); start a new "
            "run directory"
        )
    extra = sorted(set(row) - set(_OUTCOME_HINTS) - set(TAGS) - {"fingerprint", "harness", "split"})
    missing = sorted((_REQUIRED | {"harness"}) - set(row))
    if extra or missing:
        raise RecordError(f"{where}: not a ledger row (missing {missing}, unknown {extra})")
    tags = [(k, TAGS[k]) for k in TAGS if k in row]
    for name, hint in (("fingerprint", str), ("harness", str), ("split", str | None), *tags):
        if not _fits(row.get(name), hint):
            raise RecordError(f"{where}: {name} is {row.get(name)!r}, not a {hint}")
    values = {k: v for k, v in row.items() if k in _OUTCOME_HINTS}
    # The failure kind (whale.harness.Failure) as its value; a row written before the field
    # has it only as its error text's prefix ("load: ..."), which read_failure reads.
    try:
        values["failure"] = read_failure(row)
    except ValueError:
        raise RecordError(f"{where}: failure is {row.get('failure')!r}, not a kind") from None
    for name, value in values.items():
        if not _fits(value, _OUTCOME_HINTS[name]):
            raise RecordError(f"{where}: {name} is {value!r}, not a {_OUTCOME_HINTS[name]}")
    o = Outcome(**values)
    return (row["fingerprint"], row["harness"], o.question_id), o


def _fits(value: Any, hint: Any) -> bool:
    """Enough of a type check for the ledger's flat fields (str, int, float, bool, X | None)."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    for arm in typing.get_args(hint) if union else (hint,):
        if arm is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        elif arm is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif arm is type(None):
            ok = value is None
        elif isinstance(typing.get_origin(arm) or arm, type):  # str, bool, dict[str, Any] ...
            ok = isinstance(value, typing.get_origin(arm) or arm)
        else:  # a hint this check does not know: accept
            ok = True
        if ok:
            return True
    return False


def saved_harness(run_dir: Path, h: str) -> str:
    """The harness source a run saved under hash `h` (`run_dir/harnesses/h.py`), checked
    against the hash: RecordError naming the file when it cannot be read or was edited."""
    path = run_dir / "harnesses" / f"{h}.py"
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: cannot read the harness ({e})") from None
    got = harness_hash(source)
    if got != h:
        raise RecordError(
            f"{path}: its content hashes to {got}, not {h}: the file was cut or edited "
            "(restore it, or start a new run)"
        )
    return source


FINAL_FOLDER = "final_harness"


def write_final_folder(run_dir: Path, source: str) -> dict[str, str]:
    """A final harness of several files written out as a folder too, `RUN/final_harness/`
    (its files, as `--harness DIR` reads them back), replacing an earlier one; returns the
    summary's entry naming it. A one-file harness gets no folder ({}): its source is
    `harnesses/<hash>.py`, as it always was (a bundle's is there too, as one text)."""
    if not is_bundle(source):
        return {}
    try:
        write_folder(source, run_dir / FINAL_FOLDER)
    except (OSError, BundleError) as e:  # a link or a file in its place: never written through
        raise RecordError(f"{run_dir / FINAL_FOLDER}: the final harness not written ({e})") from e
    return {"final harness folder": str(run_dir / FINAL_FOLDER)}
