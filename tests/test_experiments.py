"""Both experiments' configs at `--scale toy`, end to end, through the real operators and the
runner, with test doubles where a real model would take too long: scripted chat models for
the solver that `select` reads, the teacher, the proposers and the search agent, and the tiny
random transformers model (tests/tiny.py) wherever weights are trained or served in process.
Each test copies the experiment's file and adds a scale `double` that extends `toy` with the
doubles' settings only (model names, in-process serving, a short x_t template and seed for
the tiny model's 512 positions). Then the tables must come out of the run directories with
the commit and the config hashes. No real-model variant: the toy as written on smollm2-135m
took 18 min on the shared machine and stops at `train-proposer sft` (docs/experiments.md).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED
from tests.tiny import make_tiny_model
from whale.experiments import experiment_tables, run_experiment
from whale.experiments.records import read_experiment, read_step, whale_commit
from whale.records import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

# The search agent's reply: one candidate on single_call's answer line (a clean-up).
AGENT = (
    'CALL submit {"base": "c0000", "hypothesis": "drop a trailing period"}\n'
    '<<<<<<< SEARCH\n            return line.split(":", 1)[1].strip()\n=======\n'
    '            return line.split(":", 1)[1].strip().rstrip(".")\n>>>>>>> REPLACE\n'
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def copy_with(experiment: str, tmp_path: Path, scale: str) -> Path:
    d = tmp_path / experiment
    d.mkdir()
    text = (ROOT / "experiments" / experiment / "experiment.toml").read_text()
    (d / "experiment.toml").write_text(text + "\n" + scale)
    return d


def tables_of(d: Path, runs: Path) -> str:
    path = experiment_tables(d, runs, "double", runs / "tables" / "out.md")
    text = path.read_text()
    root = (runs / d.name / "double").resolve()
    exp = read_experiment(root)
    assert f"experiment config sha256: `{exp['config_sha256']}`" in text
    assert f"of this table: `{whale_commit()}`" in text
    for name in json.loads(json.dumps([p.stem for p in (root / "_steps").iterdir()])):
        assert f"`{read_step(root, name).hash}`" in text  # type: ignore[union-attr]
    return text


def test_harness_learning_toy_runs_end_to_end_and_tables_come_from_the_runs(
        tmp_path, tiny, monkeypatch):  # fmt: skip
    seed, template = tmp_path / "seed.py", tmp_path / "xt.txt"
    seed.write_text(SEED)
    template.write_text("Task: {description}\nHarness:\n{source}\nReport:\n{report}\nEdit it.")
    short = (
        f'contexts = {{ seeds = ["{seed}"], template = "{template}", '
        "report = { char_budget = 200, max_failures = 1, max_correct = 1 } }"
    )
    d = copy_with(
        "harness-learning",
        tmp_path,
        f"""
[scale.double]
extends = "toy"
[scale.double.vars]
solver = "solver-double"
teacher = "teacher-double"
[scale.double.steps.proposer]
checkpoint = "{tiny}"
{short}
sft = {{ max_len = 500, lora = {{ r = 4, alpha = 8 }} }}
grpo = {{ generation = "trl", max_prompt = 480, max_completion = 8, lora = {{ r = 4, alpha = 8 }} }}
[scale.double.steps.proposer-format]
{short}
""",
    )
    made: list[str] = []

    def model(cfg):  # the solver answers; the teacher and every proposer write GOOD_EDIT
        made.append(cfg.name)
        return ScriptedModel(["Answer: 1"] if cfg.name == "solver-double" else [GOOD_EDIT])

    monkeypatch.setattr("whale.runs.setup.build_model", lambda cfg: ScriptedModel(["Answer: 1"]))
    monkeypatch.setattr("whale.train.proposer.run.build_model", model)
    runs = tmp_path / "runs"
    got = run_experiment(d, runs, "double")
    assert [s["action"] for s in got.steps] == ["started"] * 3
    root = got.root
    sel = json.loads((root / "select" / "selection.json").read_text())
    lists = sel["assignment"]
    assert [len(lists[k]) for k in ("sft", "rl", "unseen")] == [2, 1, 2]
    teacher = json.loads((root / "proposer" / "teacher" / "summary.json").read_text())
    assert teacher["kept"] >= 1
    ev = json.loads((root / "proposer" / "evaluate" / "summary.json").read_text())
    assert ev["subject"] == "grpo" and set(ev["paired"]) == {"sft", "base", "teacher"}
    assert {r["family"] for r in ev["readings"]} == set(lists["unseen"])
    fmt = json.loads((root / "proposer-format" / "evaluate" / "summary.json").read_text())
    assert {r["family"] for r in fmt["readings"]} == set(lists["unseen"])  # toy: all offer it
    assert json.loads((root / "proposer-format" / "trained_from.json").read_text())["stages"] == \
        ["sft", "grpo"]  # fmt: skip
    # rerun: everything finished is skipped, nothing is asked again
    n = len(made)
    again = run_experiment(d, runs, "double")
    assert [s["action"] for s in again.steps] == ["skipped"] * 3 and len(made) == n
    text = tables_of(d, runs)
    assert "| family | correct / n | accuracy | SE |" in text  # the selection
    assert "Paired grpo − sft over families:" in text  # evaluate's own table, reused
    assert "| sft − base | mean |" in text  # the pairs evaluate did not take, by its `paired`
    assert "### Teacher data" in text and "### GRPO" in text
    assert "| proposer | round 0 | round 1 |" in text  # the ratchet curve, and its plot
    assert (runs / "tables" / "out-proposer-ratchet.png").stat().st_size > 0
    assert "](out-proposer-format-ratchet.png)" in text


def test_whale_toy_runs_end_to_end_resumes_after_a_kill_and_tables_come_from_the_runs(
        tmp_path, tiny, monkeypatch):  # fmt: skip
    small = (
        "runtime.budget.max_total_tokens = 8\nrsft.sft.threads = 1\n"
        "rsft.lora = { r = 4, alpha = 8 }\n"
    )
    steps = ["diagnose-rg", "diagnose-mhqa", "rg-seed0", "rg-seed1", "mhqa-seed0", "mhqa-seed1"]
    d = copy_with("whale", tmp_path, "[scale.double]\nextends = \"toy\"\n"
                  f"[scale.double.vars]\nsolver = \"{tiny}\"\nserving = \"hf\"\n" +
                  "".join(f"[scale.double.steps.{s}]\n{small}" for s in steps))  # fmt: skip
    monkeypatch.setattr("whale.runs.setup.build_model",
                        lambda cfg: ScriptedModel(["Answer: 1"]) if cfg.name == str(tiny)
                        else ScriptedModel([AGENT]))  # fmt: skip
    # Killed in the middle of rg-seed1 (Ctrl-C at its second schedule), then run again.
    from whale.experiments import steps as stepmod

    real = stepmod.OPERATORS["cotrain"]

    def killed(**kw):
        if str(kw.get("out", "")).endswith("rg-seed1"):

            def say(s):
                if s.startswith("schedule fixed"):
                    raise KeyboardInterrupt

            kw["say"] = say
        return real[0](**kw)

    monkeypatch.setitem(stepmod.OPERATORS, "cotrain", (killed, real[1]))
    runs = tmp_path / "runs"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(d, runs, "double")
    root = (runs / "whale" / "double").resolve()
    assert read_step(root, "rg-seed1").state == "started"  # type: ignore[union-attr]
    monkeypatch.setitem(stepmod.OPERATORS, "cotrain", real)
    got = run_experiment(d, runs, "double")
    assert [s["action"] for s in got.steps] == ["skipped"] * 4 + ["resumed", "started", "started"]
    seed0 = json.loads((root / "rg-seed0" / "summary.json").read_text())
    seed1 = json.loads((root / "rg-seed1" / "summary.json").read_text())
    assert [seed1["stagewise"]["e_star"], seed1["stagewise"]["i_star"]] == \
        [seed0["stagewise"]["e_star"], seed0["stagewise"]["i_star"]]  # fmt: skip
    assert seed0["stagewise"]["from"].startswith("the sweep") and "sweep" not in seed1
    # stagewise started from the chosen sweep point's records: its training rollouts are
    # those rows, replayed, not sampled again
    (point,) = [p for p in seed0["sweep"]["points"]
                if [p["epochs"], p["iters"]] == seed0["sweep"]["chosen"]]  # fmt: skip

    def training(folder):
        return [r for r in read_jsonl(folder / "outcomes.jsonl")
                if r["kind"] in ("weight_sample", "harness_score")]  # fmt: skip

    swept = training(root / "rg-seed0" / point["dir"])
    assert swept and training(root / "rg-seed0" / "stagewise") == swept
    for sched in ("adaptive", "fixed", "weight-only", "harness-only", "stagewise"):
        rows = read_jsonl(root / "rg-seed1" / sched / "outcomes.jsonl")
        keys = Counter((r["fingerprint"], r["harness"], r["question_id"], r["kind"],
                        r.get("step"), r.get("cycle"), r.get("phase")) for r in rows)  # fmt: skip
        assert rows and max(keys.values()) == 1, sched  # the resume paid nothing twice
    text = tables_of(d, runs)
    assert text.count("Per schedule (`whale.schedule.curves`") == 4
    assert "Adaptive phases (`adaptive/phases.jsonl`)" in text
    assert "## Across seeds: `mhqa`" in text
    assert "| schedule | cycle | phase | rollouts | cumulative | format_compliance |" in text
    assert (runs / "tables" / "out-rg-seed0.png").stat().st_size > 0
    assert "diagnose-mhqa (diagnose)" in text and "| capability | before |" in text
