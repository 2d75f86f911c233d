"""Noise-aware Select: the 2·SE rule on worked numbers, and in the loop with fake solvers."""

import json
import math
import re

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, prose_solver
from whale.harness import Runtime
from whale.revise.loop import LoopSettings, revise
from whale.revise.proposer import Proposer
from whale.revise.run import AdaptConfig
from whale.revise.select import Decision, apply_noise_check, noise_check
from whale.revise.store import OutcomeStore


def test_noise_check_worked_examples():
    # d = [0.2, 0.0, 0.4]: mean 0.2, sd 0.2, se 0.2/sqrt(3) = 0.1155, noise 0.2309 > 0.2
    c = noise_check([0.5, 0.6, 0.4], [0.7, 0.6, 0.8])
    assert c.mean_diff == pytest.approx(0.2) and c.se == pytest.approx(0.2 / math.sqrt(3))
    assert c.noise == pytest.approx(0.23094, abs=1e-5) and not c.passed
    # d = [0.3, 0.2, 0.4]: mean 0.3, sd 0.1, se 0.0577, noise 0.1155 < 0.3
    c = noise_check([0.5, 0.6, 0.4], [0.8, 0.8, 0.8])
    assert c.noise == pytest.approx(0.11547, abs=1e-5) and c.passed


def test_identical_rescorings_reduce_to_strictly_better():
    assert noise_check([0.5, 0.5], [0.6, 0.6]).passed  # noise 0, diff 0.1
    tie = noise_check([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    assert tie.noise == 0.0 and not tie.passed


def test_noise_check_needs_k_scores_of_each():
    with pytest.raises(ValueError, match="k >= 2"):
        noise_check([0.5], [0.6])
    with pytest.raises(ValueError, match="k >= 2"):
        noise_check([0.5, 0.4], [0.6])


def test_a_failed_check_keeps_the_parent_and_records_the_numbers():
    d = Decision("c", 0.9, "p", 0.5, 2, "best-of-g", "candidate 2 scores 0.900 (parent 0.500)")
    out = apply_noise_check(d, noise_check([0.5, 0.9], [0.9, 0.5]))
    assert out.kept_hash == "p" and out.kept_score == 0.5 and out.chosen is None
    assert out.noise is not None and out.noise["candidate_scores"] == [0.9, 0.5]
    assert "not above the noise" in out.why
    kept = apply_noise_check(d, noise_check([0.5, 0.5], [0.9, 0.9]))
    assert kept.kept_hash == "c" and kept.chosen == 2 and kept.noise["passed"] is True


def test_noise_k_of_one_is_refused_by_the_config():
    with pytest.raises(ValueError, match="noise_k"):
        AdaptConfig(noise_k=1).validate()
    AdaptConfig(noise_k=0).validate()
    AdaptConfig(noise_k=3).validate()


def _revise(task, tmp_path, solver, k, rule="ratchet"):
    dev = task.questions()[:10]
    store = OutcomeStore(tmp_path, "fp")
    try:
        h, rounds = revise(
            task, SEED, dev, dev, Runtime(model=solver), Proposer(ScriptedModel([GOOD_EDIT])),
            store, LoopSettings(rounds=1, g=1, select=rule, feedback=4, workers=4, noise_k=k),
        )  # fmt: skip
        return h, rounds, store.used
    finally:
        store.close()


def test_a_real_gain_is_kept_and_rescoring_rollouts_are_counted(task, tmp_path):
    solver = prose_solver()
    h, rounds, used = _revise(task, tmp_path, solver, k=3)
    d = rounds[0].decision
    assert d.chosen == 0 and h == d.kept_hash != d.parent_hash
    assert d.noise is not None and d.noise["parent_scores"] == [0.0, 0.0, 0.0]
    assert d.noise["candidate_scores"] == [1.0, 1.0, 1.0] and d.noise["noise"] == 0.0
    # 2 harnesses x 2 extra rescorings x 10 scoring questions, in the ledger and in the round
    assert d.noise["rollouts"] == 40 and rounds[0].rollouts == used
    rows = [json.loads(x) for x in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    rescored = [r for r in rows if r["split"] == "rescore"]
    assert len(rescored) == 40
    assert {r["fingerprint"] for r in rescored} == {"fp:rescore1", "fp:rescore2"}
    assert {s.seed for _, s in solver.calls} == {0, 1, 2}  # each repeat under its own seed
    saved = json.loads((tmp_path / "round_01" / "decision.json").read_text())
    assert saved["noise"]["k"] == 3 and saved["chosen"] == 0


def lucky_solver():
    """Prose around the answer under sampling seed 0 only; the bare number under any other.
    The seed harness (strip) fails on prose, the candidate (last number) never does: the
    candidate's gain at seed 0 is luck of the sampling, gone on rescoring."""

    def reply(messages, sampling):
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return f"Sure! The answer is {a + b}." if sampling.seed == 0 else str(a + b)

    return ScriptedModel(reply)


@pytest.mark.parametrize("rule", ["ratchet", "best-of-g"])
def test_a_lucky_gain_is_not_kept_over_the_noise(task, tmp_path, rule):
    _, plain, _ = _revise(task, tmp_path / "plain", lucky_solver(), k=0, rule=rule)
    assert plain[0].decision.chosen == 0 and plain[0].decision.noise is None  # off: kept
    h, rounds, _ = _revise(task, tmp_path / "noisy", lucky_solver(), k=3, rule=rule)
    d = rounds[0].decision
    # d = [1, 0, 0]: mean 1/3, se = sd/sqrt(3) = 0.5774/1.7321 = 1/3, noise 2/3
    assert d.chosen is None and h == d.parent_hash and d.kept_score == 0.0
    assert d.noise["mean_diff"] == pytest.approx(1 / 3) and d.noise["noise"] == pytest.approx(2 / 3)
    assert not d.noise["passed"]


def test_adapt_cli_plumbs_noise_k_and_refuses_one(tmp_path):
    from typer.testing import CliRunner

    from tests.servers import StubServer
    from whale.cli import app
    from whale.revise.run import load_run_config

    runner = CliRunner()
    out = tmp_path / "run"
    with StubServer([("ok", "Answer: 3")]) as solver, StubServer([("ok", "no edit")]) as prop:
        args = ["adapt", "--task", "rg:basic_arithmetic", "--solver", f"s@{solver.base_url}",
                "--proposer", f"p@{prop.base_url}", "--rounds", "1", "--dev", "4", "--eval",
                "4", "--feedback", "2", "--set", "solver.cache=false", "--set",
                "proposer.cache=false", "--json"]  # fmt: skip
        bad = runner.invoke(app, [*args, "--noise-k", "1", "--out", str(tmp_path / "bad")])
        assert bad.exit_code == 2 and "noise_k" in bad.output
        assert not (tmp_path / "bad").exists()
        r = runner.invoke(app, [*args, "--noise-k", "2", "--out", str(out)])
        assert r.exit_code == 0, r.output
        again = runner.invoke(app, ["adapt", "--resume", str(out), "--noise-k", "3"])
        assert again.exit_code == 2 and "--noise-k" in again.output
    assert load_run_config(out).noise_k == 2
