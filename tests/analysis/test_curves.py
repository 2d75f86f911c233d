"""Curves of a cotrain run and capability metrics per phase (whale.schedule.curves).

The runs here are synthetic: `FakeCotrain` writes ledgers and reads the way `whale cotrain` is
specified to (one ledger row per rollout, one read per phase boundary) and counts, on its own,
the training rows it wrote before each read."""

import csv
import json
import subprocess
import sys

import pytest

from whale.records import JsonlWriter, RecordError
from whale.schedule.curves import (
    CURVE_COLUMNS,
    LEDGER,
    PHASE_COLUMNS,
    capability_metrics,
    count_rollouts,
    curve_rows,
    markdown_table,
    phase_table,
    write_curves,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class FakeCotrain:
    """One schedule folder. `eval_tag`: "eval" tags eval rows with phase "eval"; "ended" tags
    them with the phase that just ended (both occur in the spec; neither may count)."""

    def __init__(self, out, name, eval_tag="eval", count_eval=False):
        self.name, self.eval_tag, self.count_eval = name, eval_tag, count_eval
        self.ledger = JsonlWriter(out / name / LEDGER)
        self.reads = JsonlWriter(out / name / "reads.jsonl")
        self.trained = 0  # training rows written so far
        self.lines = 0  # ledger rows written so far
        self.read_at = []  # (ledger rows before the read, training rows before it)

    def row(self, cycle, phase, kind, i, **over):
        rec = {"harness": "h0", "question_id": f"q{i}", "split": "scoring", "score": 1.0,
               "correct": i % 2 == 0, "status": "ok", "format_ok": i % 4 != 3,
               "truncated": i % 4 == 1, "retrieval_hit": None, "schedule": self.name,
               "cycle": cycle, "phase": phase, "kind": kind, "step": i, "adapter": None,
               "extra_key": "ignored"} | over  # fmt: skip
        self.ledger.write(rec)
        self.lines += 1
        if kind not in ("eval", "validation"):
            self.trained += 1

    def phase(self, cycle, phase, n, **over):
        kind = "weight_sample" if phase == "weight" else "harness_score"
        for i in range(n):
            self.row(cycle, phase, kind, i, **over)

    def read(self, cycle, boundary, accuracy, n=4, validation=None):
        tag = "eval" if self.eval_tag == "eval" or boundary == "start" else boundary
        for i in range(n):
            self.row(cycle, tag, "eval", 100 + i, split="eval")
        if validation is not None:  # validation rows: never training either
            for i in range(2):
                self.row(cycle, tag, "validation", 200 + i, split="validation")
        self.read_at.append((self.lines, self.trained))
        counted = self.lines if self.count_eval else self.trained
        self.reads.write({"schedule": self.name, "cycle": cycle, "boundary": boundary,
                          "training_rollouts": counted, "accuracy": accuracy, "score": accuracy,
                          "n": n, "harness": "h0", "adapter": "a1" if boundary == "weight" else None,
                          "validation_accuracy": validation,
                          "validation_n": 0 if validation is None else 2})  # fmt: skip

    def close(self):
        self.ledger.close()
        self.reads.close()


def three_schedules(out):
    a = FakeCotrain(out, "adaptive")
    a.read(0, "start", 0.25)
    a.phase(0, "weight", 4)
    a.read(0, "weight", 0.5)
    a.phase(0, "harness", 3)
    a.read(0, "harness", 0.75)
    a.phase(1, "weight", 2)
    a.read(1, "weight", 0.5)
    w = FakeCotrain(out, "weight-only", eval_tag="ended")
    w.read(0, "start", 0.25, validation=0.5)
    w.phase(0, "weight", 8)
    w.read(0, "weight", 0.5, validation=1.0)  # the best point: validation chooses it
    w.phase(1, "weight", 8)
    w.read(1, "weight", 0.75, validation=0.5)  # eval's best, not the reported one
    h = FakeCotrain(out, "harness-only")
    h.read(0, "start", 0.25)
    h.phase(0, "harness", 2)
    h.read(0, "harness", 1.0)
    h.phase(1, "harness", 5)  # spent after the last read
    for s in (a, w, h):
        s.close()
    return {"adaptive": a, "weight-only": w, "harness-only": h}


# --- capability metrics on hand-made rows ------------------------------------------------------


def r(correct, format_ok=True, truncated=False, **kw):
    return {"correct": correct, "format_ok": format_ok, "truncated": truncated, **kw}


def test_capability_metrics_on_hand_made_rows_are_exact():
    rows = [r(True, retrieval_hit=True), r(False, truncated=True, retrieval_hit=True),
            r(True, format_ok=False, retrieval_hit=False), r(False, retrieval_hit=None)]  # fmt: skip
    assert capability_metrics(rows) == {
        "format_compliance": 0.75, "truncation_rate": 0.25,
        "retrieval_accuracy": 2 / 3,  # 2 hits of the 3 rows that have a gold passage
        "answer_extraction": 0.5,  # 1 correct of the 2 with the gold retrieved
        "accuracy": 0.5, "n": 4,
    }  # fmt: skip


def test_missing_retrieval_fields_give_none_not_zero():
    m = capability_metrics([r(True), r(False, retrieval_hit=None)])
    assert m["retrieval_accuracy"] is None and m["answer_extraction"] is None
    assert m["accuracy"] == 0.5


def test_answer_extraction_is_zero_when_the_gold_was_retrieved_but_never_used():
    m = capability_metrics([r(False, retrieval_hit=True), r(True, retrieval_hit=False)])
    assert m["retrieval_accuracy"] == 0.5 and m["answer_extraction"] == 0.0


def test_no_rows_give_no_means():
    m = capability_metrics([])
    assert m["n"] == 0 and all(m[k] is None for k in m if k != "n")


def test_a_row_of_the_wrong_shape_is_a_record_error():
    with pytest.raises(RecordError, match=r"row 1: 'correct' must be true/false"):
        capability_metrics([r(True), r("yes")])


# --- the counting rule -----------------------------------------------------------------------


def test_reads_count_exactly_the_training_rows_written_before_them(tmp_path):
    sims = three_schedules(tmp_path)
    rows = curve_rows(tmp_path)
    for name, sim in sims.items():
        lines = (tmp_path / name / LEDGER).read_text().splitlines()
        mine = [row for row in rows if row["schedule"] == name]
        assert len(mine) == len(sim.read_at)
        for row, (before, trained) in zip(mine, sim.read_at, strict=True):
            in_file = sum(json.loads(x)["kind"] not in ("eval", "validation")
                          for x in lines[:before])  # fmt: skip
            assert row["training_rollouts"] == row["ledger_rollouts"] == in_file == trained


def test_count_rollouts_per_kind_matches_what_was_written(tmp_path):
    three_schedules(tmp_path)
    assert count_rollouts(tmp_path / "adaptive") == {
        "weight_sample": 6, "harness_score": 3, "eval": 16, "validation": 0,
        "training": 9}  # fmt: skip
    assert count_rollouts(tmp_path / "weight-only")["validation"] == 6  # 3 reads of 2
    # harness-only spent 5 rollouts after its last read: counted, though no read shows them
    assert count_rollouts(tmp_path / "harness-only")["training"] == 7


def test_a_schedule_that_counts_eval_rollouts_is_refused(tmp_path):
    s = FakeCotrain(tmp_path, "stagewise", count_eval=True)
    s.read(0, "start", 0.25)  # 4 eval rows: reads training_rollouts 4
    s.phase(0, "weight", 3)
    s.read(0, "weight", 0.5)
    s.close()
    with pytest.raises(RecordError, match=r"stagewise/reads\.jsonl:1: training_rollouts 4 but "
                       r"the ledger holds 0"):  # fmt: skip
        curve_rows(tmp_path)


def test_curve_rows_are_ordered_by_schedule_then_training_rollouts(tmp_path):
    three_schedules(tmp_path)
    keys = [(row["schedule"], row["training_rollouts"]) for row in curve_rows(tmp_path)]
    assert keys == sorted(keys)
    assert [k[0] for k in keys][:1] == ["adaptive"] and len(keys) == 4 + 3 + 2


# --- files -----------------------------------------------------------------------------------


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
        f.seek(0)
        header = next(csv.reader(f))
    return header, rows


def test_curves_csv_columns_and_values(tmp_path):
    three_schedules(tmp_path)
    curves, _, _ = write_curves(tmp_path)
    header, rows = read_csv(curves)
    assert tuple(header) == CURVE_COLUMNS
    got = [(x["boundary"], x["cycle"], x["training_rollouts"], x["accuracy"], x["adapter"])
           for x in rows if x["schedule"] == "adaptive"]  # fmt: skip
    assert got == [("start", "0", "0", "0.25", ""), ("weight", "0", "4", "0.5", "a1"),
                   ("harness", "0", "7", "0.75", ""), ("weight", "1", "9", "0.5", "a1")]  # fmt: skip


def test_phases_csv_has_training_metrics_and_the_read_that_ended_each_phase(tmp_path):
    three_schedules(tmp_path)
    _, phases, _ = write_curves(tmp_path)
    header, rows = read_csv(phases)
    assert tuple(header) == PHASE_COLUMNS
    by_key = {(x["schedule"], x["cycle"], x["phase"]): x for x in rows}
    w0 = by_key[("adaptive", "0", "weight")]  # 4 rows: correct T F T F, format_ok T T T F
    assert (w0["rollouts"], w0["eval_rollouts"], w0["cum_rollouts"]) == ("4", "0", "4")
    got = (w0["accuracy"], w0["format_compliance"], w0["truncation_rate"])
    assert got == ("0.5", "0.75", "0.25")
    assert w0["retrieval_accuracy"] == "" and w0["answer_extraction"] == ""  # no gold: no metric
    assert (w0["eval_accuracy"], w0["eval_n"]) == ("0.5", "4")
    h0 = by_key[("adaptive", "0", "harness")]  # 3 rows: correct T F T
    assert (h0["rollouts"], h0["cum_rollouts"], h0["eval_accuracy"]) == ("3", "7", "0.75")
    assert h0["accuracy"] == str(2 / 3)
    ev = by_key[("adaptive", "0", "eval")]  # the eval rows tagged "eval": none of them training
    assert (ev["rollouts"], ev["eval_rollouts"], ev["accuracy"]) == ("0", "12", "")
    # weight-only tags a read's eval rows with the phase that just ended: still not training
    ww = by_key[("weight-only", "1", "weight")]
    assert (ww["rollouts"], ww["eval_rollouts"], ww["cum_rollouts"]) == ("8", "4", "16")
    assert ww["validation_rollouts"] == "2"  # its read's validation rows: not training either
    # harness-only's last phase ended without a read
    assert by_key[("harness-only", "1", "harness")]["eval_accuracy"] == ""


def test_phase_table_is_in_ledger_order_per_schedule(tmp_path):
    three_schedules(tmp_path)
    keys = [(x["cycle"], x["phase"]) for x in phase_table(tmp_path) if x["schedule"] == "adaptive"]
    assert keys == [(0, "eval"), (0, "weight"), (0, "harness"), (1, "weight"), (1, "eval")]


def test_the_png_is_a_png_and_nothing_temporary_is_left(tmp_path):
    three_schedules(tmp_path)
    _, _, png = write_curves(tmp_path, task="rg:leg_counting")
    data = png.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "curves.csv", "curves.png", "phases.csv"]  # fmt: skip


def test_the_task_name_is_drawn_in_the_title(tmp_path):
    three_schedules(tmp_path)
    png = write_curves(tmp_path, task="rg:leg_counting")[2]
    first = png.read_bytes()
    assert write_curves(tmp_path, task="rg:leg_counting")[2].read_bytes() == first  # deterministic
    assert write_curves(tmp_path, task="mhqa:musique")[2].read_bytes() != first


def test_markdown_table_per_schedule(tmp_path):
    three_schedules(tmp_path)
    lines = markdown_table(tmp_path).splitlines()
    assert lines[0].startswith("| schedule | base eval acc | final eval acc | eval acc at best "
                               "val | best val acc | rollouts at best | training rollouts |")
    # No validation reads, no stagewise schedule, no phases.jsonl: dashes
    assert "| adaptive | 0.250 | 0.500 | - | - | - | 9 | - | - | - |" in lines
    assert "| harness-only | 0.250 | 1.000 | - | - | - | 7 | - | - | - |" in lines
    # The reported best is the read of best validation accuracy (8 rollouts), not eval's max
    assert "| weight-only | 0.250 | 0.750 | 0.500 | 1.000 | 8 | 16 | - | - | - |" in lines


def test_a_schedule_without_reads_gets_dashes(tmp_path):
    s = FakeCotrain(tmp_path, "fixed")
    s.phase(0, "weight", 2)
    s.close()
    assert "| fixed | - | - | - | - | - | 2 | - | - | - |" in markdown_table(tmp_path).splitlines()


# --- bad files -------------------------------------------------------------------------------


def test_a_bad_ledger_line_is_an_error_naming_file_and_line(tmp_path):
    three_schedules(tmp_path)
    path = tmp_path / "adaptive" / LEDGER
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0], b"{not json", *lines[2:]]))
    with pytest.raises(RecordError, match=r"adaptive/outcomes\.jsonl:2: not a JSON object"):
        write_curves(tmp_path)
    assert not (tmp_path / "curves.csv").exists()  # nothing written from a bad run


@pytest.mark.parametrize(("field", "value", "message"), [
    ("correct", "yes", "'correct' must be true/false"),
    ("retrieval_hit", 1, "'retrieval_hit' must be true/false/null"),
    ("kind", "train", "'kind' must be one of"),
    ("cycle", "0", "'cycle' must be an integer"),
    ("schedule", "fixed", "row of schedule 'fixed' in the folder of 'adaptive'"),
])  # fmt: skip
def test_a_ledger_row_of_the_wrong_shape_names_file_and_line(tmp_path, field, value, message):
    three_schedules(tmp_path)
    path = tmp_path / "adaptive" / LEDGER
    lines = path.read_text().splitlines()
    row = json.loads(lines[6])
    row[field] = value
    lines[6] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match=rf"adaptive/outcomes\.jsonl:7: {message}"):
        phase_table(tmp_path)


def test_a_read_of_the_wrong_shape_names_file_and_line(tmp_path):
    three_schedules(tmp_path)
    path = tmp_path / "weight-only" / "reads.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"accuracy": 0.5', '"accuracy": 50')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match=r"weight-only/reads\.jsonl:2: 'accuracy' must be"):
        curve_rows(tmp_path)


def test_a_folder_without_schedules_is_an_error(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(RecordError, match="no schedule folder"):
        write_curves(tmp_path)


def test_importing_the_module_does_not_import_matplotlib():
    code = "import sys, whale.schedule.curves; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
