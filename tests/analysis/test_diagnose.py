"""`whale diagnose`: the noise rule and each verdict on hand-made values, the diagnosis of
hand-made probe records (paired from the ledger, unpaired from the reads), the pool that keeps
adapt's held-out questions out, and the command end to end (a fake cotrain that writes records,
and, slow, the real cotrain on the tiny model with a scripted proposer)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

import whale.cli.diagnose  # noqa: F401  (registers `whale diagnose` on the app)
from tests.fakes import ScriptedModel
from whale.analysis import diagnose as dg
from whale.analysis.diagnose import (
    DiagnoseConfig,
    Excluding,
    Shift,
    adapt_held_out,
    diagnose,
    paired_shift,
    unpaired_shift,
    verdict,
)
from whale.cli import app
from whale.records import RecordError
from whale.revise.run import AdaptConfig, split_pools
from whale.schedule.cotrain import cotrain_splits
from whale.tasks import Grade, Question, TaskBase, check_disjoint

runner = CliRunner()


def ones(k: int, n: int) -> dict[str, float]:
    """n questions q0..q{n-1}, the first k of them 1."""
    return {f"q{i}": 1.0 if i < k else 0.0 for i in range(n)}


# --- the rule --------------------------------------------------------------------------------


def test_paired_se_is_the_sample_sd_of_the_differences_over_sqrt_n():
    before, after = ones(2, 10), ones(6, 10)  # 4 questions flipped 0 -> 1
    s = paired_shift(before, after, z=2.0)
    d = [1.0] * 4 + [0.0] * 6
    sd = math.sqrt(sum((x - 0.4) ** 2 for x in d) / 9)
    assert s.paired and s.n == 10
    assert (s.before, s.after, s.delta) == (0.2, 0.6, pytest.approx(0.4))
    assert s.se == pytest.approx(sd / math.sqrt(10))  # 0.1633
    assert s.moved and not s.worse  # 0.4 > 2 * 0.163


def test_one_flip_in_twenty_is_within_noise():
    s = paired_shift(ones(0, 20), ones(1, 20), z=2.0)
    assert s.delta == pytest.approx(0.05) and s.se == pytest.approx(0.05)
    assert not s.moved and not s.worse


def test_the_improvement_must_be_strictly_larger_than_z_se():
    s = paired_shift(ones(0, 20), ones(1, 20), z=1.0)  # delta == 1 * se exactly
    assert not s.moved
    assert paired_shift(ones(0, 20), ones(1, 20), z=0.99).moved


def test_truncation_falling_is_an_improvement_and_rising_is_worse():
    fell = paired_shift(ones(10, 10), ones(0, 10), z=2.0, lower_is_better=True)
    assert fell.delta == -1.0 and fell.se == 0.0 and fell.moved
    rose = paired_shift(ones(0, 10), ones(10, 10), z=2.0, lower_is_better=True)
    assert rose.worse and not rose.moved


def test_unpaired_binomial_se():
    s = unpaired_shift(0.5, 10, 0.9, 20, z=2.0)
    assert s.se == pytest.approx(math.sqrt(0.25 / 10 + 0.09 / 20))
    assert s.delta == pytest.approx(0.4) and s.moved and not s.paired
    assert unpaired_shift(None, 0, None, 0, z=2.0).delta is None


def moved(yes: bool) -> Shift:
    return Shift(0.1, 0.9 if yes else 0.1, 0.8 if yes else 0.0, 0.01, 30, True, moved=yes)


@pytest.mark.parametrize(("h", "w", "want"), [
    (True, False, "harness bottleneck"),
    (False, True, "model bottleneck"),
    (True, True, "both"),
    (False, False, "neither (within noise)"),
])
def test_every_verdict_is_reachable(h, w, want):
    assert verdict(moved(h), moved(w)) == want


def test_no_data_is_not_applicable():
    empty = Shift(None, None, None, None, 0, True)
    assert verdict(empty, empty) == "n/a"


# --- hand-made probe records -------------------------------------------------------------------

QIDS = [f"p{i}" for i in range(20)]


def eval_rows(schedule, cycle, phase, harness, adapter, correct=0, fmt=20, trunc=0, hits=None):
    """Ledger eval rows: the first `correct` questions right, the first `fmt` well formatted,
    the first `trunc` truncated, the first `hits` with the gold retrieved (None: no golds)."""
    return [{"fingerprint": "fp", "harness": harness, "split": "eval", "schedule": schedule,
             "cycle": cycle, "phase": phase, "kind": "eval", "step": 0, "adapter": adapter,
             "question_id": q, "answer": "a", "score": float(i < correct), "correct": i < correct,
             "status": "ok", "format_ok": i < fmt, "truncated": i < trunc,
             "retrieval_hit": None if hits is None else i < hits} for i, q in enumerate(QIDS)]


def read(schedule, cycle, boundary, harness, adapter, rows, spent):
    n = len(rows)
    r = {"schedule": schedule, "cycle": cycle, "boundary": boundary, "training_rollouts": spent,
         "accuracy": sum(x["correct"] for x in rows) / n, "score": 0.0, "n": n,
         "harness": harness, "adapter": adapter,
         "truncation_rate": sum(x["truncated"] for x in rows) / n,
         "format_compliance": sum(x["format_ok"] for x in rows) / n}
    if rows[0]["retrieval_hit"] is not None:
        hit = [x for x in rows if x["retrieval_hit"]]
        r["retrieval_accuracy"] = len(hit) / n
        r["answer_extraction"] = sum(x["correct"] for x in hit) / len(hit) if hit else 0.0
    return r


def write_probe(root: Path, schedule: str, start_rows, end_rows, end_harness, end_adapter,
                spent=48, drop_end_rows=0):
    d = root / schedule
    d.mkdir(parents=True, exist_ok=True)
    boundary = "harness" if schedule == "harness-only" else "weight"
    reads = [read(schedule, 0, "start", "seed", None, start_rows, 0),
             read(schedule, 1, boundary, end_harness, end_adapter, end_rows, spent)]
    ledger = list(start_rows)
    if (end_harness, end_adapter) != ("seed", None):
        ledger += end_rows[: len(end_rows) - drop_end_rows]
    ledger.append({**start_rows[0], "split": "search", "kind": "harness_score", "cycle": 1})
    (d / "reads.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reads))
    (d / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))


def make_run(root: Path, hits=None, drop_end_rows=0, weight_spent=48):
    """Harness probe: format 10 -> 20 of 20 (a harness fix) and retrieval 5 -> 15; weight
    probe: truncation 12 -> 2 of 20 and accuracy 4 -> 14 (the model learned); harness probe's
    accuracy 4 -> 5 (noise)."""
    h0 = eval_rows("harness-only", 0, "eval", "seed", None, correct=4, fmt=10, trunc=12,
                   hits=None if hits is None else 5)
    h1 = eval_rows("harness-only", 1, "harness", "h1", None, correct=5, fmt=20, trunc=12,
                   hits=None if hits is None else 15)
    w0 = eval_rows("weight-only", 0, "eval", "seed", None, correct=4, fmt=10, trunc=12,
                   hits=None if hits is None else 5)
    w1 = eval_rows("weight-only", 1, "weight", "seed", "a1", correct=14, fmt=10, trunc=2,
                   hits=None if hits is None else 5)
    write_probe(root, "harness-only", h0, h1, "h1", None, drop_end_rows=drop_end_rows)
    write_probe(root, "weight-only", w0, w1, "seed", "a1", spent=weight_spent)


def by_cap(diag):
    return {r["capability"]: r for r in diag["capabilities"]}


def test_diagnosis_of_hand_made_probes(tmp_path):
    make_run(tmp_path, hits=True)
    diag = diagnose(tmp_path, z=2.0)
    caps = by_cap(diag)
    assert caps["format_compliance"]["verdict"] == "harness bottleneck"
    assert caps["format_compliance"]["before"] == 0.5
    assert caps["format_compliance"]["harness"]["after"] == 1.0
    assert caps["truncation_rate"]["verdict"] == "model bottleneck"
    assert caps["truncation_rate"]["weight"]["delta"] == pytest.approx(-0.5)
    assert caps["accuracy"]["verdict"] == "model bottleneck"
    assert caps["accuracy"]["harness"]["delta"] == pytest.approx(0.05)  # within noise
    assert caps["retrieval_accuracy"]["verdict"] == "harness bottleneck"
    # answer extraction (correct given gold retrieved) is unpaired: 4/5 -> 5/15 is worse.
    ae = caps["answer_extraction"]
    assert not ae["harness"]["paired"] and ae["harness"]["before"] == pytest.approx(0.8)
    assert ae["harness"]["after"] == pytest.approx(5 / 15)
    assert all(p["paired"] for p in diag["probes"].values()) and diag["equal_budget"]
    md = dg.markdown(diag)
    assert "| capability | before | harness probe | weight probe | verdict |" in md
    assert "| format_compliance | 0.500 | 1.000 (+0.500 ± 0.115) * |" in md


def test_a_task_without_gold_passages_has_no_retrieval_verdict(tmp_path):
    make_run(tmp_path, hits=None)
    caps = by_cap(diagnose(tmp_path))
    assert caps["retrieval_accuracy"]["verdict"] == "n/a"
    assert caps["answer_extraction"]["verdict"] == "n/a"
    assert "| retrieval_accuracy | n/a | n/a | n/a | n/a |" in dg.markdown(diagnose(tmp_path))


def test_an_incomplete_ledger_falls_back_to_the_reads_unpaired(tmp_path):
    make_run(tmp_path, drop_end_rows=3, weight_spent=40)
    diag = diagnose(tmp_path)
    assert not diag["probes"]["harness"]["paired"] and diag["probes"]["weight"]["paired"]
    fc = by_cap(diag)["format_compliance"]["harness"]
    assert not fc["paired"] and fc["se"] == pytest.approx(math.sqrt(0.25 / 20))
    assert not diag["equal_budget"] and "different training rollouts" in dg.markdown(diag)


def test_a_larger_z_turns_a_move_into_noise(tmp_path):
    make_run(tmp_path)
    assert by_cap(diagnose(tmp_path, z=50.0))["format_compliance"]["verdict"] == \
        "neither (within noise)"


def test_a_missing_probe_is_a_record_error(tmp_path):
    make_run(tmp_path)
    (tmp_path / "weight-only" / "reads.jsonl").unlink()
    with pytest.raises(RecordError, match="no read of the probe split"):
        diagnose(tmp_path)


def test_a_bad_ledger_row_is_a_record_error_naming_the_line(tmp_path):
    make_run(tmp_path)
    p = tmp_path / "harness-only" / "outcomes.jsonl"
    lines = p.read_text().splitlines()
    row = json.loads(lines[1])
    row["truncated"] = "no"
    lines[1] = json.dumps(row)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match=r"outcomes.jsonl:2: 'truncated'"):
        diagnose(tmp_path)


# --- the pool ----------------------------------------------------------------------------------


class CountTask(TaskBase):
    name = "test:count"
    description = "Count."

    def __init__(self, n: int) -> None:
        self._qs = [Question(f"c{i}", f"How many is {i}?", str(i)) for i in range(n)]

    def questions(self):
        return list(self._qs)

    def grade(self, q, answer):
        return Grade(float(answer == q.reference), answer == q.reference)

    def expected(self, q):
        return q.reference


def test_the_pool_keeps_adapts_held_out_questions_out(tmp_path):
    cfg = DiagnoseConfig(train=12, search=12, eval=30)
    task = CountTask(cfg.pool_size())
    held = adapt_held_out(task, cfg.seed)
    # exactly what `whale adapt` seals at its defaults on the same pool and seed
    want = split_pools(CountTask(100), AdaptConfig(seed=0))[2]  # type: ignore[arg-type]
    assert [q.id for q in held] == [q.id for q in want] and len(held) == 75
    pool = Excluding(task, held)
    assert len(pool.questions()) == cfg.pool_size() - 75
    train, probe, _ = cotrain_splits(pool, cfg.cotrain())  # type: ignore[arg-type]
    check_disjoint({"train": train, "probe": probe, "adapt held-out": held})
    assert pool.expected(train[0]) == train[0].reference  # other attributes are the task's


def test_a_pool_too_repetitive_for_adapt_reserves_nothing():
    """rg:coin_flip has 79 distinct questions among its first 100: adapt refuses that pool at
    its defaults, so it seals nothing, and diagnose must not stop on it (it did)."""
    task = CountTask(200)
    task._qs[50:71] = [Question(f"d{i}", "How many is 7?", "7") for i in range(21)]
    assert adapt_held_out(task, 0) == []


def test_the_pool_excludes_by_normalized_text_too():
    task = CountTask(5)
    same_text = Question("other-id", "how many IS 3", "3")
    assert [q.id for q in Excluding(task, [same_text]).questions()] == ["c0", "c1", "c2", "c4"]


def test_cotrain_config_is_two_probes_of_one_cycle_at_one_budget():
    c = DiagnoseConfig(rollouts=40).cotrain()
    assert c.schedules == ["harness-only", "weight-only"] and c.cycles == 1
    assert c.rollouts == 40 and c.task.size == 100 + 12 + 30
    c.validate()


# --- the command -------------------------------------------------------------------------------


def fake_cotrain(cfg, run_dir, task, source, proposer, say):
    """Writes probe records for the questions cotrain would read (its real splits)."""
    _, probe, _ = cotrain_splits(task, cfg)
    rng = random.Random(0)
    for sched in cfg.schedules:
        d = run_dir / sched
        d.mkdir(parents=True, exist_ok=True)
        if (d / "reads.jsonl").exists():
            continue  # resumed: nothing paid twice
        fixed = sched == "harness-only"
        h1, a1 = ("h1", None) if fixed else ("seed", "a1")
        rows = []
        for cycle, phase, h, a in ((0, "eval", "seed", None), (1, sched.split("-")[0], h1, a1)):
            rows.append([{"fingerprint": "fp", "harness": h, "split": "eval", "schedule": sched,
                          "cycle": cycle, "phase": phase, "kind": "eval", "step": 0,
                          "adapter": a, "question_id": q.id, "correct": rng.random() < 0.3,
                          "format_ok": cycle == 1 and fixed or i % 2 == 0, "truncated": False,
                          "retrieval_hit": None} for i, q in enumerate(probe)])
        (d / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for x in rows for r in x))
        bnd = "harness" if fixed else "weight"
        reads = [read(sched, 0, "start", "seed", None, rows[0], 0),
                 read(sched, 1, bnd, h1, a1, rows[1], cfg.rollouts)]
        (d / "reads.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reads))
    return {"task": cfg.task.id, "schedules": [], "table": "t"}


@pytest.fixture()
def fakes(monkeypatch):
    calls = []

    def cotrain(*a):
        calls.append(a)
        return fake_cotrain(*a)

    monkeypatch.setattr(dg, "run_cotrain", cotrain)
    monkeypatch.setattr("whale.runs.setup.build_model", lambda cfg: ScriptedModel())
    return calls


def test_the_command_writes_the_diagnosis_and_resumes(tmp_path, fakes):
    out = tmp_path / "diag"
    args = ["diagnose", "--task", "rg:letter_counting", "--harness", "single_call",
            "--rollouts", "8", "--train", "4", "--search", "4", "--eval", "10",
            "--out", str(out)]  # fmt: skip
    r = runner.invoke(app, [*args, "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    diag = json.loads(r.output.strip().splitlines()[-1])
    fc = by_cap(diag)["format_compliance"]
    assert fc["before"] == 0.5 and fc["harness"]["after"] == 1.0
    assert fc["verdict"] == "harness bottleneck"
    assert diag["probes"]["harness"]["probe_questions"] == 10
    assert (out / "diagnosis.md").read_text().startswith("# whale diagnose: rg:letter_counting")
    assert json.loads((out / "diagnosis.json").read_text())["capabilities"] == diag["capabilities"]
    assert 'rollouts = 8' in (out / "diagnose.toml").read_text()
    # the pool the probes drew from excluded adapt's held-out questions
    pool = fakes[0][2]
    held = {q.id for q in adapt_held_out(pool._task, 0)}
    assert held and not held & {q.id for q in pool.questions()}
    # resume: same experiment, a new z re-judges; changing the budget is refused
    r2 = runner.invoke(app, ["diagnose", "--resume", str(out), "--z", "100"],
                       catch_exceptions=False)
    assert r2.exit_code == 0, r2.output
    assert "neither (within noise)" in r2.output and len(fakes) == 2
    r3 = runner.invoke(app, ["diagnose", "--resume", str(out), "--rollouts", "9"])
    assert r3.exit_code == 2 and "--rollouts" in r3.output
    r4 = runner.invoke(app, ["diagnose", "--resume", str(out), "--set", "rollouts=9"])
    assert r4.exit_code == 2 and "rollouts" in r4.output


def test_a_search_split_larger_than_the_pool_is_exit_2(tmp_path, fakes):
    r = runner.invoke(app, ["diagnose", "--train", "4", "--search", "8",
                            "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "search" in r.output and not fakes


@pytest.mark.slow
def test_the_real_probes_on_the_tiny_model(tmp_path, monkeypatch):
    """Real cotrain (tiny random model served in process, revise operator with a scripted
    proposer): both probes run at one budget and the diagnosis reads their ledgers, paired."""
    from tests.tiny import make_tiny_model

    tiny = make_tiny_model(tmp_path / "tiny")
    monkeypatch.setattr("whale.runs.setup.build_model", lambda cfg: ScriptedModel(["no edit"]))
    out = tmp_path / "run"
    r = runner.invoke(app, [
        "diagnose", "--task", "rg:letter_counting", "--harness", "single_call",
        "--solver", str(tiny), "--serving", "hf", "--operator", "revise",
        "--rollouts", "4", "--train", "2", "--search", "2", "--eval", "3",
        "--set", "rsft.g=2", "--set", "runtime.budget.max_total_tokens=8",
        "--set", "solver.cache=false", "--set", "rsft.sft.threads=1",
        "--out", str(out), "--json"], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    diag = json.loads(r.output.strip().splitlines()[-1])
    assert all(p["paired"] and p["probe_questions"] == 3 for p in diag["probes"].values())
    assert (out / "harness-only" / "reads.jsonl").is_file()
    assert (out / "weight-only" / "reads.jsonl").is_file()
    assert {r["verdict"] for r in diag["capabilities"]} <= set(dg.VERDICTS)
    rows = (out / "weight-only" / "outcomes.jsonl").read_text().count("\n")
    r2 = runner.invoke(app, ["diagnose", "--resume", str(out), "--json"],
                       catch_exceptions=False)
    assert r2.exit_code == 0, r2.output
    assert (out / "weight-only" / "outcomes.jsonl").read_text().count("\n") == rows
