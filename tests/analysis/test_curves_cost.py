"""The paper's cost figure, the phase lengths and the reported best point, on ledgers written by
hand (whale.schedule.curves): reads.jsonl, outcomes.jsonl and phases.jsonl of a stagewise and an
adaptive schedule, each row spelled out."""

import json

import pytest

from whale.records import RecordError
from whale.schedule.curves import (
    crossing,
    markdown_table,
    phase_lengths,
    schedule_summary,
)


def ledger_row(schedule, cycle, phase, kind, i):
    return {"harness": "h0", "question_id": f"q{i}", "split": "train", "score": 1.0,
            "correct": True, "status": "ok", "format_ok": True, "truncated": False,
            "schedule": schedule, "cycle": cycle, "phase": phase, "kind": kind, "step": 0,
            "adapter": None}  # fmt: skip


def read_row(schedule, cycle, boundary, rollouts, accuracy, validation=None):
    return {"schedule": schedule, "cycle": cycle, "boundary": boundary,
            "training_rollouts": rollouts, "accuracy": accuracy, "score": accuracy, "n": 20,
            "harness": "h0", "adapter": None, "validation_accuracy": validation,
            "validation_n": 0 if validation is None else 10}  # fmt: skip


def phase_row(cycle, phase, epochs, steps, stopped):
    return {"cycle": cycle, "phase": phase, "start_harness": "h0", "end_harness": "h0",
            "start_adapter": None, "end_adapter": None, "rollouts": 0, "stopped": stopped,
            "steps": steps, "epochs": epochs}  # fmt: skip


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def stagewise(out):
    """One weight stage of 48 samples, one harness stage of 32 scorings: 80 training rollouts,
    final eval accuracy 0.40."""
    name = "stagewise"
    write(out / name / "outcomes.jsonl",
          [ledger_row(name, 1, "weight", "weight_sample", i) for i in range(48)]
          + [ledger_row(name, 1, "harness", "harness_score", i) for i in range(32)])  # fmt: skip
    write(out / name / "reads.jsonl", [read_row(name, 0, "start", 0, 0.20),
                                       read_row(name, 1, "weight", 48, 0.30),
                                       read_row(name, 1, "harness", 80, 0.40)])  # fmt: skip
    write(out / name / "phases.jsonl", [phase_row(1, "weight", 0.75, 6, "0.75 epochs"),
                                        phase_row(1, "harness", 0.0, 3, "3 iterations")])


def adaptive(out):
    """Reads at 0, 16, 32, 48, 64 training rollouts; eval 0.20, 0.35, 0.40, 0.50, 0.45: it
    equals stagewise's final 0.40 at 32 rollouts and first passes it at 48 (48 / 80 = 0.6 of
    stagewise's)."""
    name = "adaptive"
    spans = [(1, "weight", "weight_sample", 16), (1, "harness", "harness_score", 16),
             (2, "weight", "weight_sample", 16), (2, "harness", "harness_score", 16)]
    write(out / name / "outcomes.jsonl",
          [ledger_row(name, c, p, k, i) for c, p, k, n in spans for i in range(n)])
    write(out / name / "reads.jsonl", [
        read_row(name, 0, "start", 0, 0.20, validation=0.1),
        read_row(name, 1, "weight", 16, 0.35, validation=0.6),  # the best validation read
        read_row(name, 1, "harness", 32, 0.40, validation=0.4),
        read_row(name, 2, "weight", 48, 0.50, validation=0.6),  # equal: the earlier one wins
        read_row(name, 2, "harness", 64, 0.45, validation=0.5),
    ])  # fmt: skip
    write(out / name / "phases.jsonl", [
        phase_row(1, "weight", 0.25, 5, "patience: no new best reward for 0.2 epochs"),
        phase_row(1, "harness", 0.0, 7, "patience: no new best for 2 iterations (after 7)"),
        phase_row(2, "weight", 0.3, 6, "patience: no new best reward for 0.2 epochs"),
        phase_row(2, "harness", 0.0, 13, "patience: no new best for 2 iterations (after 13)"),
        phase_row(3, "weight", 0.05, 1, "rollout budget spent"),  # cut short: not counted
    ])  # fmt: skip


def weight_only(out):
    """Never reaches 0.40."""
    name = "weight-only"
    write(out / name / "outcomes.jsonl",
          [ledger_row(name, 1, "weight", "weight_sample", i) for i in range(80)])
    write(out / name / "reads.jsonl", [read_row(name, 0, "start", 0, 0.20),
                                       read_row(name, 1, "weight", 80, 0.35)])


def by_name(out):
    return {r["schedule"]: r for r in schedule_summary(out)}


def test_the_crossing_is_where_a_schedule_first_passes_stagewise_final_accuracy(tmp_path):
    stagewise(tmp_path)
    adaptive(tmp_path)
    weight_only(tmp_path)
    got = by_name(tmp_path)
    assert got["adaptive"]["stagewise_final"] == 0.40
    assert got["adaptive"]["crossing_rollouts"] == 48  # 0.40 at 32 only equals it: not passed
    assert got["adaptive"]["crossing_fraction"] == 48 / 80
    assert got["weight-only"]["crossing_rollouts"] is None  # 0.35 at most: never
    assert got["weight-only"]["crossing_fraction"] is None
    assert got["stagewise"]["crossing_rollouts"] is None  # its own final is never above itself
    assert {r["base_at_or_above_stagewise_final"] for r in got.values()} == {False}  # 0.20


def declining(out):
    """Stagewise reads 0.30 -> 0.25 -> 0.20 and weight-only 0.30 -> 0.22 -> 0.21: both bases are
    already above stagewise's final 0.20."""
    for name, accs in (("stagewise", (0.30, 0.25, 0.20)), ("weight-only", (0.30, 0.22, 0.21))):
        write(out / name / "outcomes.jsonl",
              [ledger_row(name, c, "weight", "weight_sample", i) for c in (1, 2)
               for i in range(10)])  # fmt: skip
        write(out / name / "reads.jsonl", [read_row(name, 0, "start", 0, accs[0]),
                                           read_row(name, 1, "weight", 10, accs[1]),
                                           read_row(name, 2, "weight", 20, accs[2])])


def test_a_base_already_at_stagewise_final_is_flagged_not_a_crossing_at_0(tmp_path):
    declining(tmp_path)
    got = by_name(tmp_path)
    assert got["stagewise"]["stagewise_final"] == 0.20
    for name in ("stagewise", "weight-only"):
        assert got[name]["base_at_or_above_stagewise_final"] is True
        # the first read after training that passes 0.20 (0.25, 0.22): 10 rollouts, not 0
        assert (got[name]["crossing_rollouts"], got[name]["crossing_fraction"]) == (10, 0.5)
    line = next(x for x in markdown_table(tmp_path).splitlines()
                if x.startswith("| weight-only |"))  # fmt: skip
    assert "| 0.500 (10); base >= it |" in line


def test_the_table_shows_the_crossing_fraction_and_never(tmp_path):
    stagewise(tmp_path)
    adaptive(tmp_path)
    weight_only(tmp_path)
    lines = markdown_table(tmp_path).splitlines()
    adaptive_line = next(x for x in lines if x.startswith("| adaptive |"))
    assert "| 0.600 (48) |" in adaptive_line
    assert "| never |" in next(x for x in lines if x.startswith("| weight-only |"))


def test_without_a_stagewise_schedule_there_is_no_crossing(tmp_path):
    adaptive(tmp_path)
    got = by_name(tmp_path)["adaptive"]
    assert got["stagewise_final"] is None and got["crossing_rollouts"] is None
    assert got["base_at_or_above_stagewise_final"] is None
    assert "| - | 0.275 / 0.3 (2) |" in markdown_table(tmp_path)


def test_crossing_on_reads_alone_counts_only_reads_after_training_strictly_above():
    reads = [{"training_rollouts": 0, "accuracy": 0.1}, {"training_rollouts": 9, "accuracy": 0.5},
             {"training_rollouts": 12, "accuracy": 0.7}]  # fmt: skip
    assert crossing(reads, 0.4) == 9
    assert crossing(reads, 0.5) == 12  # 0.5 at 9 only equals it
    assert crossing(reads, 0.05) == 9  # the start read (0 rollouts) never counts
    assert crossing(reads, 0.7) is None


def test_phase_lengths_leave_out_phases_the_budget_cut_short(tmp_path):
    adaptive(tmp_path)
    got = by_name(tmp_path)["adaptive"]
    assert (got["weight_phases"], got["weight_epochs_median"], got["weight_epochs_max"]) == \
        (2, 0.275, 0.3)  # 0.25 and 0.3; the budget-cut 0.05 is not counted
    assert (got["harness_phases"], got["harness_iters_median"], got["harness_iters_max"]) == \
        (2, 10.0, 13.0)


def test_phase_lengths_of_hand_made_phases():
    rows = [phase_row(1, "weight", 0.25, 5, "patience"), phase_row(2, "weight", 0.4, 8, "patience"),
            phase_row(3, "weight", 1.15, 23, "cap of 2 epochs"),
            phase_row(1, "harness", 0.0, 7, "patience"), phase_row(2, "harness", 0.0, 6, "patience"),
            phase_row(3, "harness", 0.0, 2, "rollout budget 300 spent (after iteration 2)")]
    assert phase_lengths(rows) == {
        "weight_phases": 3, "weight_epochs_median": 0.4, "weight_epochs_max": 1.15,
        "harness_phases": 2, "harness_iters_median": 6.5, "harness_iters_max": 7.0}  # fmt: skip
    assert phase_lengths([])["weight_epochs_median"] is None


def test_the_reported_best_point_is_chosen_by_validation_not_by_eval(tmp_path):
    adaptive(tmp_path)
    got = by_name(tmp_path)["adaptive"]
    # eval's maximum is 0.50 (at 48); the validation split's best read is at 16 (0.6, first of
    # two equal), where eval reads 0.35
    assert (got["best"], got["best_validation"], got["rollouts_at_best"]) == (0.35, 0.6, 16)


def test_a_phase_row_of_the_wrong_shape_names_file_and_line(tmp_path):
    adaptive(tmp_path)
    path = tmp_path / "adaptive" / "phases.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[1]["steps"] = "7"
    write(path, rows)
    with pytest.raises(RecordError, match=r"adaptive/phases\.jsonl:2: 'steps' must be"):
        schedule_summary(tmp_path)
