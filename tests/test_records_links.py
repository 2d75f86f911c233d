"""Run-directory records are opened without following links and must be regular files
(whale.records.open_record, issue 20)."""

import os

import pytest

from whale.records import JsonlWriter, RecordError, RunLock, iter_jsonl, record_dir, write_atomic


def test_the_writer_refuses_a_symlinked_file_and_leaves_its_target_alone(tmp_path):
    target = tmp_path / "outside.jsonl"
    target.write_text('{"a": 1}\n')
    run = tmp_path / "run"
    run.mkdir()
    (run / "outcomes.jsonl").symlink_to(target)
    with pytest.raises(RecordError, match=r"outcomes\.jsonl: a symbolic link"):
        JsonlWriter(run / "outcomes.jsonl")
    assert target.read_text() == '{"a": 1}\n'


def test_a_dangling_link_is_refused_not_created_through(tmp_path):
    (tmp_path / "outcomes.jsonl").symlink_to(tmp_path / "made-elsewhere.jsonl")
    with pytest.raises(RecordError, match="a symbolic link"):
        JsonlWriter(tmp_path / "outcomes.jsonl")
    assert not (tmp_path / "made-elsewhere.jsonl").exists()


def test_reading_a_symlinked_or_fifo_record_is_refused(tmp_path):
    (tmp_path / "outside.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "outside.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(RecordError, match="a symbolic link"):
        iter_jsonl(tmp_path / "link.jsonl")
    with pytest.raises(RecordError, match="not a regular file"):
        iter_jsonl(tmp_path / "fifo.jsonl")  # would block for ever if opened for reading
    with pytest.raises(RecordError, match="not a regular file"):
        JsonlWriter(tmp_path / "fifo.jsonl")


def test_write_atomic_replaces_a_link_instead_of_writing_through_it(tmp_path):
    target = tmp_path / "outside.json"
    target.write_text("theirs")
    (tmp_path / "summary.json").symlink_to(target)
    write_atomic(tmp_path / "summary.json", "ours")
    assert not (tmp_path / "summary.json").is_symlink()
    assert (tmp_path / "summary.json").read_text() == "ours"
    assert target.read_text() == "theirs"


def test_write_atomic_does_not_follow_a_planted_temporary_link(tmp_path):
    target = tmp_path / "outside"
    target.write_text("theirs")
    tmp = tmp_path / f".x.json.{os.getpid()}.{__import__('threading').get_ident()}.tmp"
    tmp.symlink_to(target)
    write_atomic(tmp_path / "x.json", "ours")
    assert target.read_text() == "theirs" and (tmp_path / "x.json").read_text() == "ours"


def test_record_dir_refuses_a_linked_folder(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "trajectories").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RecordError, match="trajectories: a symbolic link"):
        record_dir(tmp_path / "trajectories")
    assert record_dir(tmp_path / "harnesses").is_dir()


def test_the_run_lock_does_not_truncate_a_linked_file(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        RunLock(run)
    assert target.read_text() == "keep me"
