"""whale.runs.rundir: making and taking a run directory raises typed errors naming the path,
worded as the CLI prints them (the CLI exits 2 with the same message)."""

import subprocess
import sys

import pytest

from tests.test_records import hold
from whale.metaharness.run import SearchConfig
from whale.runs import (
    OutNotADirectory,
    RecordError,
    RunDirError,
    RunDirInUse,
    RunDirNotEmpty,
    check_out,
    hold_run_dir,
    load_run_config,
    new_run_dir,
    save_run_config,
)

TRY_LOCK = """
import sys
from pathlib import Path
from whale.records import RunDirInUse, RunLock
try:
    RunLock(Path(sys.argv[1]))
except RunDirInUse:
    print("busy")
else:
    print("free")
"""


def locked_elsewhere(path):
    """Whether another process finds run directory `path` locked."""
    r = subprocess.run([sys.executable, "-c", TRY_LOCK, str(path)], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    return {"busy": True, "free": False}[r.stdout.strip()]


def test_a_run_dir_another_process_holds_is_run_dir_in_use(tmp_path):
    p = hold(tmp_path)
    try:
        with pytest.raises(RunDirInUse, match=f"run directory {tmp_path} is in use by another"):
            hold_run_dir(tmp_path)
    finally:
        p.communicate("\n", timeout=30)


def test_an_out_dir_another_process_holds_is_run_dir_in_use(tmp_path):
    p = hold(tmp_path)
    try:
        with pytest.raises(RunDirInUse):
            new_run_dir(str(tmp_path), "adapt", "x")
    finally:
        p.communicate("\n", timeout=30)


def test_a_non_empty_out_is_refused_and_left_unlocked(tmp_path):
    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(RunDirNotEmpty, match=f"run directory {tmp_path} is not empty "
                       r"\(choose a new --out\)"):  # fmt: skip
        new_run_dir(str(tmp_path), "adapt", "x")
    assert not locked_elsewhere(tmp_path)  # the refusal let go of the lock it took


def test_an_out_that_is_a_file_is_out_not_a_directory(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(OutNotADirectory, match=f"--out {f}: exists and is not a directory"):
        new_run_dir(str(f), "adapt", "x")
    assert f.read_text() == "x"


def test_check_out_names_the_parent_that_is_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(OutNotADirectory, match=f"--out {f}/run: {f} exists and is not a dir"):
        check_out(str(f / "run"))
    check_out(str(tmp_path / "new" / "run"))  # absent: fine, nothing made
    assert not (tmp_path / "new").exists()


def test_the_typed_errors_are_value_or_runtime_errors():
    assert issubclass(OutNotADirectory, RunDirError) and issubclass(RunDirNotEmpty, RunDirError)
    assert issubclass(RunDirError, ValueError) and issubclass(RunDirInUse, RuntimeError)


def test_a_new_out_dir_is_made_and_locked(tmp_path):
    path, lock = new_run_dir(str(tmp_path / "a" / "run"), "adapt", "x")
    try:
        assert path.is_dir() and locked_elsewhere(path)
    finally:
        lock.release()
    assert not locked_elsewhere(path)


def test_the_default_place_takes_a_suffix_within_one_second(tmp_path, monkeypatch):
    monkeypatch.setattr("time.strftime", lambda fmt: "20260101-000000")
    a, la = new_run_dir(None, "eval", "rg:x-single_call", root=tmp_path)
    b, lb = new_run_dir(None, "eval", "rg:x-single_call", root=tmp_path)
    la.release()
    lb.release()
    assert a.parent == tmp_path and a.name == "eval-rg_x-single_call-20260101-000000"
    assert b.name == f"{a.name}-2"


def test_the_saved_config_reads_back_and_a_missing_one_names_the_file(tmp_path):
    cfg = SearchConfig(iterations=2, seed=7)
    save_run_config(tmp_path, cfg)
    assert load_run_config(tmp_path, SearchConfig) == cfg
    with pytest.raises(RecordError, match="diagnose.toml: missing .is .* whale diagnose"):
        load_run_config(tmp_path, SearchConfig, "diagnose.toml", "whale diagnose")
    (tmp_path / "config.toml").write_text("iterations = 0\n")
    with pytest.raises(RecordError, match="config.toml: .*iterations"):
        load_run_config(tmp_path, SearchConfig)


def test_an_out_error_names_the_out_field(tmp_path):
    from whale.errors import WhaleError

    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(WhaleError) as e:
        new_run_dir(str(f), "adapt", "x")
    assert e.value.field == "out"
