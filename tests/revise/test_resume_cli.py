"""`whale adapt --resume` refuses what would change the experiment or what it cannot trust, with
exit 2 and the field or file named; --rounds and --workers work (issue 8)."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from tests.servers import StubServer
from tests.test_records import hold
from whale import config as cfgmod
from whale.cli import app
from whale.harness import load_harness
from whale.models import build_model
from whale.revise.run import AdaptConfig, run_adapt
from whale.runs import new_run_dir
from whale.tasks import load_task

runner = CliRunner()
EDIT = (
    "Return the number after 'Answer:' only.\n<<<<<<< SEARCH\n    return reply.text.strip()\n"
    "=======\n    return reply.text.strip().split()[-1]\n>>>>>>> REPLACE\n"
)
COMMON = ["--set", "solver.cache=false", "--set", "proposer.cache=false", "--json"]


def adapt(*args):
    return runner.invoke(app, ["adapt", *args], catch_exceptions=False)


def said(r):
    return " ".join(r.output.split())  # rich wraps long error lines at 80 columns


def last_json(output):
    return json.loads(output.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def servers():
    with StubServer([("ok", "Answer: 3")]) as solver, StubServer([("ok", EDIT)]) as proposer:
        yield solver, proposer


def start(out, servers, *extra):
    solver, proposer = servers
    return adapt("--task", "rg:basic_arithmetic", "--solver", f"s@{solver.base_url}",
                 "--proposer", f"p@{proposer.base_url}", "--rounds", "2", "--g", "2",
                 "--dev", "6", "--eval", "6", "--feedback", "3", "--out", str(out), *extra,
                 *COMMON)  # fmt: skip


@pytest.fixture(scope="module")
def finished(servers, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    r = start(out, servers)
    assert r.exit_code == 0, r.output
    return out, last_json(r.output)


@pytest.fixture
def run_dir(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished[0], copy)
    return copy


def ledger(run_dir):
    return (run_dir / "outcomes.jsonl").read_bytes()


def test_resume_with_more_rounds_runs_them(servers, tmp_path):
    # issue 8: `--resume DIR --rounds 5` silently ran the saved 3. Here a run dies in round 2
    # (before the eval split is read) and is resumed with --rounds 5.
    solver, proposer = servers
    out = tmp_path / "run"
    out.mkdir()
    cfg = cfgmod.load(AdaptConfig, None, COMMON[1:4:2], base={
        "task": {"id": "rg:basic_arithmetic"}, "solver": {"name": f"s@{solver.base_url}"},
        "proposer": {"name": f"p@{proposer.base_url}"}, "rounds": 3, "g": 1, "dev": 6,
        "eval": 6, "feedback": 3, "out": str(out),
    })  # fmt: skip
    real = build_model(cfg.proposer)

    class DiesInRound2:
        name = "dies"

        def chat(self, messages, sampling, timeout=None):
            if sampling.seed >= 2000:  # round t asks with seed t * 1000 + i
                raise RuntimeError("killed in round 2")
            return real.chat(messages, sampling)

    task = load_task("rg:basic_arithmetic", size=12)
    with pytest.raises(RuntimeError, match="killed in round 2"):
        run_adapt(cfg, out, task, load_harness("single_call"), build_model(cfg.solver),
                  DiesInRound2())  # fmt: skip
    assert not (out / "eval_read.json").exists()
    r = adapt("--resume", str(out), "--rounds", "5", *COMMON)
    assert r.exit_code == 0, r.output
    assert [d["round"] for d in last_json(r.output)["rounds_detail"]] == [1, 2, 3, 4, 5]
    assert (out / "round_05" / "decision.json").exists()


def test_more_rounds_after_the_eval_split_was_read_are_refused(run_dir):
    r = adapt("--resume", str(run_dir), "--rounds", "5", *COMMON)
    assert r.exit_code == 2 and "eval split was already read" in said(r)


def test_resume_refuses_a_new_seed(run_dir):
    # issue 8: a new seed moved eval questions into the feedback pool
    before = ledger(run_dir)
    r = adapt("--resume", str(run_dir), "--set", "seed=1", *COMMON)
    assert r.exit_code == 2 and "seed was 0 when the run started, now 1" in said(r)
    assert ledger(run_dir) == before


def test_resume_refuses_a_new_budget(run_dir):
    r = adapt("--resume", str(run_dir), "--set", "runtime.budget.model_calls=2", *COMMON)
    assert r.exit_code == 2 and "runtime.budget.model_calls was 12" in said(r)


def test_resume_refuses_flags_other_than_rounds_and_workers(run_dir):
    r = adapt("--resume", str(run_dir), "--dev", "8", *COMMON)
    assert r.exit_code == 2 and "--dev cannot be given with --resume" in said(r)


def test_resume_may_change_the_workers(run_dir, servers):
    r = adapt("--resume", str(run_dir), "--workers", "1", *COMMON)
    assert r.exit_code == 0, r.output
    assert last_json(r.output)["rollouts_paid_this_invocation"] == 0


def test_a_second_command_on_a_run_dir_in_use_exits_2(run_dir):
    # issue 8: two `adapt --resume` of one dir both ran (66 ledger rows for 36 keys)
    before = ledger(run_dir)
    p = hold(run_dir)
    try:
        r = adapt("--resume", str(run_dir), *COMMON)
    finally:
        p.communicate("\n", timeout=30)
    assert r.exit_code == 2 and "in use by another whale command" in said(r)
    assert ledger(run_dir) == before


def test_the_lock_is_released_when_the_command_ends(run_dir):
    r = adapt("--resume", str(run_dir), "--set", "seed=1", *COMMON)  # locks, then exits 2
    assert r.exit_code == 2
    hold(run_dir).communicate("\n", timeout=30)  # another process takes it now


def test_an_edited_seed_file_is_refused_on_resume(servers, tmp_path):
    seed = tmp_path / "seed.py"
    seed.write_text(load_harness("single_call"))
    r = start(tmp_path / "run", servers, "--harness", str(seed))
    assert r.exit_code == 0, r.output
    seed.write_text(seed.read_text().replace(".strip()", ".strip().lower()"))
    r = adapt("--resume", str(tmp_path / "run"), *COMMON)
    assert r.exit_code == 2 and "the file was edited" in said(r)


def test_a_cut_harness_file_is_written_whole_again_not_used(run_dir, finished):
    # issue 8: a truncated harnesses/<hash>.py was used, silently, under a new hash
    kept = finished[1]["final_eval"]["hash"]
    path = run_dir / "harnesses" / f"{kept}.py"
    whole = path.read_text()
    path.write_text(whole[: len(whole) // 2])
    r = adapt("--resume", str(run_dir), *COMMON)
    assert r.exit_code == 0, r.output
    again = last_json(r.output)
    assert again["final_eval"] == finished[1]["final_eval"]
    assert again["rollouts_paid_this_invocation"] == 0 and path.read_text() == whole


def test_a_cut_eval_read_record_exits_2(run_dir):
    path = run_dir / "eval_read.json"
    path.write_bytes(path.read_bytes()[:20])
    r = adapt("--resume", str(run_dir), *COMMON)
    assert r.exit_code == 2 and "eval_read.json: not valid JSON" in said(r)


def test_a_cut_proposals_file_exits_2(run_dir):
    path = run_dir / "round_01" / "proposals.json"
    path.write_bytes(path.read_bytes()[:20])
    r = adapt("--resume", str(run_dir), *COMMON)
    assert r.exit_code == 2 and "proposals.json: not valid JSON" in said(r)


def test_a_deleted_trajectories_file_exits_2(run_dir, finished):
    seed = finished[1]["seed_eval"]["hash"]
    (run_dir / "trajectories" / f"{seed}.jsonl").unlink()
    r = adapt("--resume", str(run_dir), *COMMON)
    assert r.exit_code == 2 and "no trajectory for" in said(r)


def test_a_ledger_row_of_the_wrong_shape_exits_2(run_dir):
    with open(run_dir / "outcomes.jsonl", "a") as f:
        f.write('{"fingerprint": "x", "harness": 1}\n')
    r = adapt("--resume", str(run_dir), *COMMON)
    assert r.exit_code == 2 and "not a ledger row" in said(r)


def test_a_ledger_line_torn_inside_a_multibyte_character_is_dropped(run_dir, servers):
    with open(run_dir / "outcomes.jsonl", "ab") as f:
        f.write(b'{"fingerprint": "x", "answer": "caf' + "é".encode()[:1])
    r = adapt("--resume", str(run_dir), *COMMON)
    assert r.exit_code == 0, r.output
    assert last_json(r.output)["rollouts_paid_this_invocation"] == 0


def test_two_runs_started_in_the_same_second_get_two_directories(tmp_path, monkeypatch):
    # issue 8: two `whale eval` without --out, started in the same second, shared a dir
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20260101-000000")
    (a, lock_a), (b, lock_b) = (new_run_dir(None, "eval", "rg:x-single_call") for _ in "ab")
    lock_a.release()
    lock_b.release()
    assert a != b and a.is_dir() and b.is_dir() and b.name == f"{a.name}-2"
