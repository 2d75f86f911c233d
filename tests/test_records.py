"""JSONL records that harness output reaches, and the run directory lock (whale.records)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from whale.records import JsonlWriter, RecordError, RunDirInUse, RunLock, read_jsonl


def write(path, *records):
    w = JsonlWriter(path)
    for r in records:
        w.write(r)
    w.close()


def test_an_answer_with_line_separators_stays_one_record(tmp_path):
    # issue 8: written raw and read with str.splitlines(), "\u2028{}\u2028" made three lines
    path = tmp_path / "o.jsonl"
    write(path, {"question_id": "q0", "answer": "\u2028{}\u2028"}, {"question_id": "q1"})
    assert read_jsonl(path) == [{"question_id": "q0", "answer": "\u2028{}\u2028"},
                                {"question_id": "q1"}]  # fmt: skip


def test_a_lone_surrogate_answer_is_written_and_read_back(tmp_path):
    path = tmp_path / "o.jsonl"
    write(path, {"answer": "\ud800x"})
    assert read_jsonl(path) == [{"answer": "\ud800x"}]


def test_a_malformed_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"a": 1}\n{}}\n{"a": 2}\n')
    with pytest.raises(RecordError, match=r"o\.jsonl:2: not a JSON object"):
        read_jsonl(path)


def test_a_line_that_is_json_but_not_an_object_is_an_error(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"a": 1}\n[1, 2]\n')
    with pytest.raises(RecordError, match=r"o\.jsonl:2"):
        read_jsonl(path)


def test_a_torn_last_line_inside_a_multibyte_character_is_dropped(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "caf' + "é".encode()[:1])  # cut inside U+00E9
    assert read_jsonl(path) == [{"a": 1}]


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    write(path, {"a": 3})
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_the_writer_cuts_a_torn_tail_so_it_never_becomes_a_bad_middle_line(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "caf' + "é".encode()[:1])
    write(path, {"a": 2})
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from whale.records import RunLock
    lock = RunLock(Path(sys.argv[1]))
    print("locked", flush=True)
    sys.stdin.readline()
    """
)


def hold(path):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout.readline().strip() == "locked"
    return p


def test_the_run_lock_is_refused_to_a_second_process(tmp_path):
    p = hold(tmp_path)
    try:
        with pytest.raises(RunDirInUse, match=f"in use by another whale command .pid {p.pid}"):
            RunLock(tmp_path)
    finally:
        p.communicate("\n", timeout=30)
    RunLock(tmp_path).release()  # free again once the holder has ended


def test_the_run_lock_dies_with_a_killed_holder(tmp_path):
    p = hold(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    p.stdin.close()
    p.stdout.close()
    RunLock(tmp_path).release()


def test_the_run_lock_is_reentrant_within_one_process(tmp_path):
    outer = RunLock(tmp_path)
    inner = RunLock(tmp_path)  # the CLI holds it, then run_adapt takes it again
    inner.release()
    p = subprocess.run([sys.executable, "-c", HOLDER, str(tmp_path)], input="\n",
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode != 0 and "RunDirInUse" in p.stderr  # still held by `outer`
    outer.release()


def test_read_untrusted_refuses_links_out_fifos_and_oversize(tmp_path):
    import os

    from whale.records import UnsafeRead, read_untrusted

    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (tmp_path / "secret").write_text("TOP-SECRET")
    (run / "ok.txt").write_text("fine")
    (run / "sub" / "inside").symlink_to(run / "ok.txt")
    os.symlink(tmp_path / "secret", run / "out")
    os.symlink(tmp_path, run / "sub" / "updir")  # a directory link out, then a file below it
    os.mkfifo(run / "fifo")
    assert read_untrusted(run / "ok.txt", run, 100) == b"fine"
    assert read_untrusted(run / "sub" / "inside", run, 100) == b"fine"  # a link within is fine
    for bad in (run / "out", run / "sub" / "updir" / "secret", run / "fifo", run / "missing"):
        with pytest.raises(UnsafeRead):
            read_untrusted(bad, run, 100)
    with pytest.raises(UnsafeRead, match="over the limit"):
        read_untrusted(run / "ok.txt", run, 3)


def _folder(path, text):
    path.mkdir()
    (path / "adapter.bin").write_text(text)
    return path


def test_replace_dir_puts_the_new_folder_in_place_and_leaves_nothing_beside(tmp_path):
    from whale.records import replace_dir

    out = _folder(tmp_path / "adapter", "old")
    replace_dir(_folder(tmp_path / "adapter.tmp", "new"), out)
    assert (out / "adapter.bin").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]


def test_a_kill_inside_replace_dir_never_leaves_the_adapter_missing(tmp_path, monkeypatch):
    # A kill between "move the old folder aside" and "move the new one in" (the two renames
    # the trainers did) lost the adapter a run had paid for. Killed here just after any
    # rename, the folder is at its name, old or new.
    import whale.records as records

    probe = _folder(tmp_path / "a", "a"), _folder(tmp_path / "b", "b")
    if not records._exchange(*probe):
        pytest.skip("this filesystem cannot swap two names in one step (renameat2)")
    real = os.replace

    def killed_after(src, dst):
        real(src, dst)
        raise KeyboardInterrupt

    out = _folder(tmp_path / "adapter", "old")
    monkeypatch.setattr(records.os, "replace", killed_after)
    try:
        records.replace_dir(_folder(tmp_path / "adapter.tmp", "new"), out)
    except KeyboardInterrupt:
        pass
    assert (out / "adapter.bin").read_text() in ("old", "new")


def test_replace_dir_over_a_link_replaces_the_link_and_leaves_its_target_alone(tmp_path):
    from whale.records import replace_dir

    target = _folder(tmp_path / "elsewhere", "keep")
    out = tmp_path / "adapter"
    out.symlink_to(target, target_is_directory=True)
    replace_dir(_folder(tmp_path / "adapter.tmp", "new"), out)
    assert not out.is_symlink() and (out / "adapter.bin").read_text() == "new"
    assert (target / "adapter.bin").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "elsewhere"]


def test_replace_dir_over_a_file_puts_the_folder_in_place_without_an_error(tmp_path):
    from whale.records import replace_dir

    out = tmp_path / "adapter"
    out.write_text("stale")
    replace_dir(_folder(tmp_path / "adapter.tmp", "new"), out)
    assert (out / "adapter.bin").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]
