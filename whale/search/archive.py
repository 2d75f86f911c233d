"""The Meta-Harness archive: every candidate harness ever scored, as folders on disk.

    archive/
      summary.jsonl            one row per candidate (its meta.json), appended as each lands
      c0000/harness.py         the candidate's source
      c0000/meta.json          id, parent id, iteration, hypothesis, score, validity, reason, hash
      c0000/outcomes.jsonl     per search-split example: id, answer, score, status, error
      c0000/trajectories.jsonl its trajectories (schema of whale.harness.trajectory)

A person or the proposer agent reads it with ordinary file tools (`tools.py`). The archive
holds search-split outcomes only: `add` refuses any outcome whose question id is not one of the
search split's ids it was opened with, so an eval-split question can never be written here.

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
    score: float | None = None  # mean score on the search split; None when invalid
    accuracy: float | None = None
    rho_run: float = 0.0
    n_scored: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CandidateMeta:
        names = {f.name for f in fields(cls)}
        missing = names - set(d)
        if missing - {"reason", "score", "accuracy", "rho_run", "n_scored"}:
            raise ArchiveError(f"candidate record lacks {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})


_OUTCOME_FIELDS = ("question_id", "answer", "score", "correct", "status", "error")


class Archive:
    def __init__(self, root: Path, search_ids: Iterable[str]) -> None:
        self.root = root
        self.search_ids = frozenset(search_ids)
        record_dir(root)  # never a link: candidates would be written wherever it points
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        self._metas: dict[str, CandidateMeta] = {}
        for folder in sorted(p for p in root.iterdir() if p.name[:1] == "c" and _is_folder(p)):
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

    def by_hash(self, h: str) -> CandidateMeta | None:
        """The first valid, scored candidate with this source hash (duplicates are not
        re-scored: the loop looks here first)."""
        for m in self._metas.values():
            if m.hash == h and m.valid and m.score is not None:
                return m
        return None

    def top(self, k: int) -> list[CandidateMeta]:
        scored = [m for m in self._metas.values() if m.valid and m.score is not None]
        # Ties go to the earlier candidate: a later copy must beat, not match, to be accepted.
        return sorted(scored, key=lambda m: (-(m.score or 0.0), m.iteration, m.id))[:k]

    def best(self) -> CandidateMeta | None:
        top = self.top(1)
        return top[0] if top else None

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
