"""Run-directory folders replaced by symbolic links are refused, not written through (issue 20
and its hostile review: with `sessions/` and `archive/` linked out of the run, a search wrote
its candidates and sessions outside it; a linked `launch/` had a step folder removed where it
pointed). Each writer names the folder and leaves the link's target untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from whale.metaharness.agent import Session
from whale.metaharness.archive import Archive, ArchiveError
from whale.records import RecordError, record_dir
from whale.train.data import Example
from whale.train.launch import AccelerateTrainer
from whale.train.sft import LoraSettings, SFTSettings


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "keep.txt").write_text("not the run's")
    return d


def _link(run: Path, name: str, target: Path) -> Path:
    run.mkdir(exist_ok=True)
    (run / name).symlink_to(target, target_is_directory=True)
    return run / name


def test_a_linked_archive_folder_is_refused(tmp_path, outside):
    link = _link(tmp_path / "run", "archive", outside)
    with pytest.raises(RecordError, match="archive: a symbolic link"):
        Archive(link, ["q1"])
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_a_session_is_not_saved_into_a_linked_sessions_folder(tmp_path, outside):
    link = _link(tmp_path / "run", "sessions", outside)
    with pytest.raises(RecordError, match="sessions: a symbolic link"):
        Session(1, 0, 7).save(link / "c0100.json")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_a_linked_launch_folder_is_neither_emptied_nor_written(tmp_path, outside):
    (outside / "step_0001").mkdir()
    (outside / "step_0001" / "precious").write_text("x")
    link = _link(tmp_path / "run", "launch", outside)
    config = tmp_path / "accelerate.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\n")
    trainer = AccelerateTrainer(tmp_path, LoraSettings(), SFTSettings(accelerate_config=str(config)),
                                seed=0)  # fmt: skip
    ex = Example([1, 2, 3], [-100, 2, 3], "q#0")
    with pytest.raises(RecordError, match="launch: a symbolic link"):
        trainer.train([ex], workdir=link / "step_0001")
    assert (outside / "step_0001" / "precious").read_text() == "x"


def test_a_dangling_link_on_the_way_is_a_record_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "evaluate").symlink_to(tmp_path / "gone", target_is_directory=True)
    with pytest.raises(RecordError, match="dangling link"):
        record_dir(run / "evaluate" / "x-abc")


def test_a_candidate_folder_that_is_a_link_is_refused(tmp_path, outside):
    root = tmp_path / "run" / "archive"
    root.mkdir(parents=True)
    (root / "c0000").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ArchiveError, match="c0000: a symbolic link"):
        Archive(root, ["q1"])
