"""The Meta-Harness archive: every candidate harness ever scored, as folders on disk.

    archive/
      summary.jsonl            one row per candidate (its meta.json), appended as each lands
      c0000/harness.py         the candidate's source
      c0000/meta.json          id, parent id, iteration, hypothesis, validity, reason, hash,
                               accuracy, score, phase, solver, origin (`CandidateMeta`)
      c0000/outcomes.jsonl     per search-split example: id, answer, score, status, error
      c0000/trajectories.jsonl its trajectories (schema of whale.harness.trajectory)

A person or the proposer agent reads it with ordinary file tools (`tools.py`). The archive
holds search-split outcomes only: `add` refuses any outcome whose question id is not one of the
search split's ids it was opened with, so an eval-split question can never be written here.

One verifier: candidates rank on `accuracy`, the fraction of search questions the task's binary
verifier accepts (`correct`); `score`, the mean partial score (F1, partial credit), is kept
beside it and decides nothing. Ties go to the earlier candidate (iteration, then id), so a later
copy must beat, not match, to be accepted.

One archive serves every harness phase of a WHALE schedule (`operator.SearchOperator`). A score
is only comparable with scores measured under the same solver: each candidate records the
fingerprint of the solver (weights) it was scored under (`solver`), and the ranking is taken
under a view (`view(solver, until)`): the candidates scored under that solver, up to an
iteration (a replayed phase must not see what later phases of the killed run archived). A
candidate scored under other weights is shown to the agent, labelled, but never ranked.

A candidate folder is written whole into a hidden temporary folder and renamed into place, so
a killed run leaves either the whole candidate or none of it (a stale `.tmp-*` folder is
removed on open); `summary.jsonl` is rebuilt from the folders when it lags behind them.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from whale.harness import Trajectory, harness_hash
from whale.records import JsonlWriter, RecordError, read_json, read_jsonl, record_dir, write_atomic


class ArchiveError(ValueError):
    """A request the archive refuses (an unknown id, an eval question, a source that does not
    match its hash); a record cut or edited on disk is a `whale.records.RecordError`."""


@dataclass(frozen=True)
class CandidateMeta:
    id: str
    parent_id: str | None
    iteration: int
    hypothesis: str
    hash: str | None  # None for a candidate that never became a harness (edits did not apply)
    valid: bool
    reason: str = ""
    score: float | None = None  # mean partial score on the search split (an extra column)
    accuracy: float | None = None  # fraction `correct` on the search split: what ranks
    rho_run: float = 0.0
    n_scored: int = 0
    phase: int = 1  # the harness phase (call of the operator) that archived it
    # Fingerprint of the solver its scores were measured under (WHALE: base + adapter). None:
    # recorded before whale kept it, comparable with any.
    solver: str | None = None
    # "start": a phase's start harness (c0000 is the first phase's seed); "rescore": an earlier
    # candidate (parent_id) scored again under this phase's weights; "proposal": the agent's.
    origin: str = "proposal"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CandidateMeta:
        names = {f.name for f in fields(cls)}
        missing = names - set(d)
        optional = {"reason", "score", "accuracy", "rho_run", "n_scored", "phase", "solver",
                    "origin"}  # fmt: skip
        if missing - optional:
            raise ArchiveError(f"candidate record lacks {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def rankable(self) -> bool:
        """Valid and scored by the verifier: it can be ranked (under its solver)."""
        return self.valid and self.accuracy is not None

    def accuracy_text(self) -> str:
        """`accuracy 0.650 (13/20 correct), mean score 0.700` for the agent and people."""
        if not self.rankable:
            return "not scored" if self.valid else "invalid"
        acc = self.accuracy or 0.0
        part = f", mean score {self.score:.3f}" if self.score is not None else ""
        return f"accuracy {acc:.3f} ({round(acc * self.n_scored)}/{self.n_scored} correct){part}"


_OUTCOME_FIELDS = ("question_id", "answer", "score", "correct", "status", "error")


class Archive:
    def __init__(self, root: Path, search_ids: Iterable[str]) -> None:
        self.root = root
        self.search_ids = frozenset(search_ids)
        record_dir(root)  # never a link: candidates would be written wherever it points
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        self._metas: dict[str, CandidateMeta] = {}
        self._solver: str | None = None  # the ranking view (`view`); None: every candidate
        self._until: int | None = None
        folders = [p for p in root.iterdir() if p.name[:1] == "c" and _is_folder(p)]
        for folder in sorted(folders, key=lambda p: _id_order(p.name)):
            meta = CandidateMeta.from_dict(_read_json(folder / "meta.json"))
            if meta.id != folder.name:
                raise ArchiveError(f"{folder}/meta.json names id {meta.id!r}")
            self._metas[meta.id] = meta
        self._sync_summary()

    # -- queries -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._metas)

    def __contains__(self, cid: object) -> bool:
        return cid in self._metas

    def candidates(self) -> list[CandidateMeta]:
        return list(self._metas.values())

    def get(self, cid: str) -> CandidateMeta:
        try:
            return self._metas[cid]
        except KeyError:
            raise ArchiveError(f"no candidate {cid!r} in the archive") from None

    # -- the ranking view ---------------------------------------------------------------------
    def view(self, solver: str | None, until: int | None) -> None:
        """Rank from now on the candidates scored under `solver` (None: any) archived at
        iterations up to `until` (None: all). The search loop moves it as it goes."""
        self._solver, self._until = solver, until

    @property
    def solver(self) -> str | None:
        return self._solver

    def comparable(self, m: CandidateMeta) -> bool:
        """Scored under the view's solver (or recorded before whale kept solvers)."""
        return m.solver is None or self._solver is None or m.solver == self._solver

    def visible(self, m: CandidateMeta) -> bool:
        return self._until is None or m.iteration <= self._until

    def by_hash(self, h: str) -> CandidateMeta | None:
        """The first ranked candidate with this source hash under the view (a copy scored
        under this solver already; its scores stand)."""
        for m in self._metas.values():
            if m.hash == h and m.rankable and self.comparable(m) and self.visible(m):
                return m
        return None

    def top(self, k: int) -> list[CandidateMeta]:
        """The k best under the view, by accuracy; ties to the earlier candidate."""
        scored = [m for m in self._metas.values()
                  if m.rankable and self.comparable(m) and self.visible(m)]  # fmt: skip
        return sorted(scored, key=_rank_key)[:k]

    def best(self) -> CandidateMeta | None:
        top = self.top(1)
        return top[0] if top else None

    def earlier(self, k: int) -> list[CandidateMeta]:
        """The k best of those scored under other weights than the view's: shown, labelled,
        never ranked with the others (their scores were measured under another solver)."""
        other = [m for m in self._metas.values()
                 if m.rankable and not self.comparable(m) and self.visible(m)]  # fmt: skip
        return sorted(other, key=_rank_key)[:k]

    def label(self, m: CandidateMeta) -> str:
        """`m`'s scores, said to be under other weights when they are."""
        if not m.rankable or self.comparable(m):
            return m.accuracy_text()
        return f"{m.accuracy_text()} under the weights of harness phase {m.phase}, not the current"

    def source(self, cid: str) -> str:
        meta = self.get(cid)
        path = _regular(self.root / cid / "harness.py")
        if meta.hash is None or not path.exists():
            raise ArchiveError(f"candidate {cid} has no harness source (it was invalid)")
        text = path.read_text(encoding="utf-8")
        if harness_hash(text) != meta.hash:
            raise ArchiveError(f"{path} does not match its hash {meta.hash}: edited on disk?")
        return text

    def outcomes(self, cid: str) -> list[dict[str, Any]]:
        return read_jsonl(_regular(self.root / self.get(cid).id / "outcomes.jsonl"))

    def trajectories(self, cid: str) -> dict[str, Trajectory]:
        rows = read_jsonl(_regular(self.root / self.get(cid).id / "trajectories.jsonl"))
        return {r["question_id"]: Trajectory.from_dict(r) for r in rows}

    # -- writes ------------------------------------------------------------------------------
    def add(
        self,
        meta: CandidateMeta,
        source: str | None,
        outcomes: Sequence[dict[str, Any]] = (),
        trajectories: Sequence[Trajectory] = (),
    ) -> CandidateMeta:
        if meta.id in self._metas:
            raise ArchiveError(f"candidate {meta.id} is already archived")
        if meta.parent_id is not None and meta.parent_id not in self._metas:
            raise ArchiveError(f"parent {meta.parent_id!r} of {meta.id} is not archived")
        if (source is None) != (meta.hash is None) or (
            source is not None and harness_hash(source) != meta.hash
        ):
            raise ArchiveError(f"{meta.id}: source and hash disagree")
        ids = {str(o.get("question_id")) for o in outcomes} | {t.question_id for t in trajectories}
        leaked = sorted(ids - self.search_ids)
        if leaked:
            raise ArchiveError(
                f"{meta.id}: outcomes of questions outside the search split {leaked[:5]}; "
                "the archive holds search-split outcomes only"
            )
        tmp = self.root / f".tmp-{meta.id}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if source is not None:
            (tmp / "harness.py").write_text(source, encoding="utf-8")
        _write_jsonl(tmp / "outcomes.jsonl", [{k: o.get(k) for k in _OUTCOME_FIELDS}
                                              for o in outcomes])  # fmt: skip
        _write_jsonl(tmp / "trajectories.jsonl", [t.to_dict() for t in trajectories])
        (tmp / "meta.json").write_text(json.dumps(asdict(meta), indent=2))
        os.replace(tmp, self.root / meta.id)
        self._metas[meta.id] = meta
        w = JsonlWriter(self.root / "summary.jsonl")  # never through a link (whale.records)
        try:
            w.write(asdict(meta))
        finally:
            w.close()
        return meta

    def _sync_summary(self) -> None:
        """summary.jsonl is derived from the folders: rebuild it when a kill left it behind."""
        path = self.root / "summary.jsonl"
        try:
            rows = read_jsonl(path)
        except RecordError:
            rows = []
        if [r.get("id") for r in rows] != list(self._metas):
            write_atomic(path, "".join(json.dumps(asdict(m)) + "\n" for m in self._metas.values()))


def _id_order(cid: str) -> tuple[int, str]:
    """Candidate ids in the order they were made: `c10000` (iteration 100) after `c9900`."""
    return len(cid), cid


def _rank_key(m: CandidateMeta) -> tuple[float, int, tuple[int, str]]:
    return -(m.accuracy or 0.0), m.iteration, _id_order(m.id)


def _regular(path: Path) -> Path:
    """`path`, unless something other than a regular file is there (a FIFO would block the
    reader for ever; a link is not followed): ArchiveError. An absent file passes."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISREG(mode):
        raise ArchiveError(f"{path.parent.name}/{path.name} is not a regular file: not read")
    return path


def _is_folder(path: Path) -> bool:
    """A candidate folder: a real one. A link named like one is refused, not read through."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise ArchiveError(f"{path}: a symbolic link; whale does not read a candidate through it")
    return stat.S_ISDIR(mode)


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ArchiveError(f"{path}: not a JSON object")
    return data


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
