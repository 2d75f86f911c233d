"""WHALE's schedule: phase order per schedule, and a real weight phase + harness phase on a tiny
random-weight model (real runtime, real LoRA training, adapters served in process): the new
adapter is what the next rollouts use, patience stops, and a kill + resume counts every
rollout once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.fakes import ScriptedModel
from tests.tiny import make_tiny_model
from whale.harness import RuntimeConfig
from whale.records import read_jsonl
from whale.revise.loop import LoopSettings
from whale.revise.operator import ReviseOperator
from whale.revise.proposer import Proposer, ProposerConfig
from whale.runs import OutcomeStore
from whale.schedule.curves import count_rollouts, curve_rows
from whale.schedule.loop import Cotrain, Reads, ScheduleSettings, phases
from whale.tasks import Grade, Question, TaskBase
from whale.train.precision import resolve
from whale.train.rsft import RsftSettings, Solver, WeightPhase, trainer_factory
from whale.train.sft import LoraSettings, SFTSettings


def kinds(kind, **kw):
    return [(p.kind, p.cycle, p.adaptive) for p in phases(ScheduleSettings(kind, **kw))]


def test_fixed_alternates_weight_then_harness_each_cycle():
    assert kinds("fixed", cycles=2) == [("weight", 1, False), ("harness", 1, False),
                                        ("weight", 2, False), ("harness", 2, False)]


def test_adaptive_alternates_with_patience():
    assert kinds("adaptive", cycles=1) == [("weight", 1, True), ("harness", 1, True)]


def test_baselines_have_one_kind_of_phase():
    assert {k for k, _, _ in kinds("weight-only", cycles=3)} == {"weight"}
    assert {k for k, _, _ in kinds("harness-only", cycles=3)} == {"harness"}


def test_stagewise_is_one_weight_stage_of_e_star_then_one_harness_stage_of_i_star():
    got = [(p.kind, p.cycle, p.adaptive, p.epochs, p.iters)
           for p in phases(ScheduleSettings("stagewise", cycles=3, stagewise=(1.5, 7)))]
    assert got == [("weight", 1, False, 1.5, 0), ("harness", 1, False, 0.0, 7)]


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown schedule"):
        ScheduleSettings("alternating")


# --- a real run on the tiny model ---------------------------------------------------------------


class EvenTask(TaskBase):
    """The verifier accepts answers of even length: the tiny random model is right about half
    the time, so S+ is never empty and the reward moves when the weights do."""

    name = "test:even"
    description = "Reply with a short word."

    def __init__(self, n=24):
        self._qs = [Question(id=f"e{i}", prompt=f"Say a word about number {i}.", reference=None)
                    for i in range(n)]

    def questions(self):
        return list(self._qs)

    def grade(self, q, answer):
        ok = len(answer) > 0 and len(answer) % 2 == 0
        return Grade(1.0 if ok else 0.0, ok)


SEED = ("def run(question, env):\n"
        "    reply = env.llm([{'role': 'user', 'content': question}], max_tokens=6)\n"
        "    return reply.text\n")
EDIT = ("Shorter replies.\n<<<<<<< SEARCH\n"
        "    reply = env.llm([{'role': 'user', 'content': question}], max_tokens=6)\n=======\n"
        "    reply = env.llm([{'role': 'user', 'content': question}], max_tokens=5)\n"
        ">>>>>>> REPLACE\n")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def settings(**kw) -> RsftSettings:
    return RsftSettings(g=2, step_epochs=0.25, temperature=1.0, lora=LoraSettings(r=4, alpha=8),
                        sft=SFTSettings(lr=3e-2, batch_size=4, max_len=256, threads=1), **kw)


def build(root: Path, tiny: Path, kind: str, rollouts: int, cycles: int = 2):
    from transformers import AutoTokenizer

    from whale.train.serving import InProcessServing

    task = EvenTask()
    qs = task.questions()
    pool, held = qs[:8], qs[16:22]
    store = OutcomeStore(root, "fp-test")
    serving = InProcessServing(tiny, alias="tiny", threads=1)
    solver = Solver(serving, "fp-test", RuntimeConfig(sandbox="auto", warm=0))
    rs = settings()
    weights = WeightPhase(root / "weight", task, pool, store, solver, rs,
                          trainer_factory(tiny, rs, 0), lambda: AutoTokenizer.from_pretrained(tiny),
                          seed=0, workers=2)
    proposer = Proposer(ScriptedModel([EDIT]), ProposerConfig(grammar="off"))
    op = ReviseOperator(root / "harness", pool, pool[:4], store, proposer,
                        LoopSettings(rounds=1, g=1, workers=2, feedback=2))
    s = ScheduleSettings(kind, rollouts=rollouts, weight_epochs=0.25, harness_iters=1,
                         cycles=cycles)
    reads = Reads(root, kind, task, store, solver, 2, held)
    run = Cotrain(root, kind, s, task, SEED, store, solver, weights, op, workers=2, read=reads)
    run.reads = reads  # the test's handle on what was read
    return run, store, weights, serving


def close(run, store, weights, serving):
    run.close()
    run.reads.close()
    weights.close()
    store.close()
    serving.close()


@pytest.mark.slow
def test_a_weight_step_trains_on_accepted_runs_and_serves_the_new_adapter(tmp_path, tiny):
    run, store, weights, serving = build(tmp_path / "adaptive", tiny, "weight-only", 100)
    try:
        tags = {"schedule": "weight-only", "cycle": 1, "phase": "weight",
                "kind": "weight_sample", "step": 0, "adapter": None}
        rec = weights.step(SEED, 0, 0, None, tags)
        assert rec.samples == 2 * 2 and rec.accepted >= 1  # 2 prompts (0.25 of 8), G = 2
        assert rec.trained and rec.examples == rec.accepted  # one model call per run
        assert rec.dtype == resolve("auto", "cpu")  # recorded as trained: "auto" resolved
        assert run.solver.adapter == Path(rec.adapter_path) and rec.adapter == run.solver.digest
        msgs = [{"role": "user", "content": "Say a word about number 3."}]
        from whale.models import Sampling
        from whale.models.hf import TransformersChat

        # Same seed, same sampling: a different reply means other weights (the random base's
        # greedy reply is a run of newlines that a small step does not move).
        sampling = Sampling(max_tokens=12, temperature=1.0, seed=5)
        base = TransformersChat(tiny, threads=1).chat(msgs, sampling)
        new = run.solver.model().chat(msgs, sampling)
        assert new.token_ids != base.token_ids  # the served weights are the trained ones
        assert run.solver.model().chat(msgs, sampling).token_ids == new.token_ids
        rec2 = weights.step(SEED, 1, rec.consumed, None, {**tags, "step": 1,
                                                          "adapter": rec.adapter})
        rows = read_jsonl(tmp_path / "adaptive" / "outcomes.jsonl")
        assert {r["fingerprint"] for r in rows if r["step"] == 1} == {f"fp-test+{rec.adapter}"}
        assert rec2.adapter_before == rec.adapter
    finally:
        close(run, store, weights, serving)


@pytest.mark.slow
def test_a_killed_cotrain_resumes_counting_every_rollout_once(tmp_path, tiny):
    # The reference: the same run, never interrupted.
    ref = build(tmp_path / "ref" / "fixed", tiny, "fixed", rollouts=40, cycles=10)
    try:
        want = ref[0].run()
        want["reads"] = ref[0].reads.rows()
    finally:
        close(*ref)
    # The same run, interrupted (Ctrl-C) as its 13th rollout is recorded, then resumed.
    first = build(tmp_path / "run" / "fixed", tiny, "fixed", rollouts=40, cycles=10)
    writer = first[1]._ledger
    real_write, n = writer.write, [0]

    def write(row):
        n[0] += 1
        if n[0] == 13:
            raise KeyboardInterrupt
        real_write(row)

    writer.write = write
    try:
        with pytest.raises(KeyboardInterrupt):
            first[0].run()
    finally:
        close(*first)
    again = build(tmp_path / "run" / "fixed", tiny, "fixed", rollouts=40, cycles=10)
    try:
        got = again[0].run()
    finally:
        close(*again)
    rows = read_jsonl(tmp_path / "run" / "fixed" / "outcomes.jsonl")
    keys = Counter((r["fingerprint"], r["harness"], r["question_id"]) for r in rows)
    assert max(keys.values()) == 1  # no rollout paid twice
    ref_rows = read_jsonl(tmp_path / "ref" / "fixed" / "outcomes.jsonl")
    assert len(rows) == len(ref_rows)
    assert got["training_rollouts"] == want["training_rollouts"] >= 40  # the budget stopped it
    assert got["stopped"] == want["stopped"] == "rollout budget 40 spent"
    assert count_rollouts(tmp_path / "run" / "fixed")["training"] == got["training_rollouts"]
    # Every read says how many training rollouts preceded it, as the ledger counts them.
    assert [r["training_rollouts"] for r in curve_rows(tmp_path / "run") if r["schedule"] == "fixed"] \
        == [r["training_rollouts"] for r in want["reads"]]


@pytest.mark.slow
def test_a_run_copied_from_a_sweep_point_replays_its_training_and_trains_nothing(tmp_path, tiny,
                                                                                monkeypatch):
    # What stagewise does after the sweep (whale.schedule.sweep_copy): the
    # chosen point ran the same config and seed, so its weight steps (trained adapters) and
    # its harness phase replay from the copied records, under the copy's own paths.
    from whale.schedule.sweep_copy import stagewise_from_sweep

    src = tmp_path / "sweep" / "E0.25-I1" / "stagewise"
    first = build(src, tiny, "fixed", rollouts=16, cycles=1)
    try:
        want = first[0].run()
    finally:
        close(*first)
    steps = read_jsonl(src / "weight" / "steps.jsonl")
    assert any(s["trained"] for s in steps)  # an adapter to replay
    stagewise_from_sweep(tmp_path, {"chosen": [0.25, 1], "points": [
        {"epochs": 0.25, "iters": 1, "dir": "sweep/E0.25-I1/stagewise"}]}, lambda m: None)
    dst = tmp_path / "stagewise"
    trained = []
    monkeypatch.setattr("whale.train.sft.LoraTrainer.train",
                        lambda *a, **k: trained.append(1))  # fmt: skip
    again = build(dst, tiny, "fixed", rollouts=16, cycles=1)
    try:
        got = again[0].run()
    finally:
        close(*again)
    assert trained == [] and got["training_rollouts"] == want["training_rollouts"]
    assert got["adapter"] == want["adapter"] and got["harness"] == want["harness"]
    assert [r for r in read_jsonl(dst / "outcomes.jsonl") if r["kind"] != "eval"] == \
        [r for r in read_jsonl(src / "outcomes.jsonl") if r["kind"] != "eval"]  # fmt: skip
    paths = [s["adapter_path"] for s in read_jsonl(dst / "weight" / "steps.jsonl")]
    assert all(p is None or Path(p).is_relative_to(dst) for p in paths) and any(paths)


@pytest.mark.slow
def test_adaptive_weight_phase_stops_by_patience_not_by_eval(tmp_path, tiny):
    run, store, weights, serving = build(tmp_path / "adaptive", tiny, "adaptive", 200, cycles=1)
    try:
        run.operator = None  # weight phase only: call it directly
        from whale.schedule.loop import Phase

        rec = run.weight_phase(SEED, Phase("weight", 1, True, epochs=2.0))  # capped at 2 epochs
        steps = rec.detail["steps"]
        rewards = [s["reward"] for s in steps]
        # It stopped at the first step that set no new best after T_min (0.2 epoch = 1 step
        # of 0.25), or at the cap of 2 epochs (8 steps).
        if len(steps) < 8:
            assert "patience" in rec.stopped
            assert rewards[-1] <= max(rewards[:-1])
            assert all(b > a for a, b in zip(rewards[:-2], rewards[1:-1], strict=False))
        else:
            assert "cap" in rec.stopped
    finally:
        close(run, store, weights, serving)


class CountingServing:
    """Counts serve() calls; serving is slow, so that racing first calls overlap."""

    def __init__(self):
        self.served = 0

    def serve(self, adapter):
        import time

        self.served += 1
        time.sleep(0.2)
        return ScriptedModel(["Answer: 1"])

    def close(self):
        pass


def test_concurrent_first_calls_serve_the_weights_once():
    import threading

    serving = CountingServing()
    solver = Solver(serving, "fp", RuntimeConfig(sandbox="auto", warm=0))
    threads = [threading.Thread(target=solver.model) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert serving.served == 1  # a second serve() would close the first one's server


def test_a_killed_search_cotrain_resumes_to_the_uninterrupted_result(tmp_path):
    """harness-only with the search operator (scripted proposer and solver), killed in the eval
    read after its first harness phase: the replay counts the archived phase's rollouts."""
    from tests.metaharness.test_loop import GOOD, WORSE
    from tests.revise.conftest import SEED as SUM_SEED
    from tests.revise.conftest import SumTask, prose_solver
    from whale.metaharness.loop import SearchSettings
    from whale.metaharness.operator import SearchOperator

    class Serving:
        def serve(self, adapter):
            return prose_solver()

        def close(self):
            pass

    def make(root):
        task = SumTask()
        qs = task.questions()
        store = OutcomeStore(root, "fp")
        solver = Solver(Serving(), "fp", RuntimeConfig(sandbox="auto", warm=0))
        op = SearchOperator(root / "harness", qs[:6], store, ScriptedModel([WORSE, WORSE, GOOD]),
                            SearchSettings(iterations=2, m=2, workers=2))
        s = ScheduleSettings("harness-only", rollouts=40, harness_iters=2, cycles=4)
        reads = Reads(root, "harness-only", task, store, solver, 2, qs[20:24])
        run = Cotrain(root, "harness-only", s, task, SUM_SEED, store, solver, None, op, 2,
                      read=reads)
        run.reads = reads
        return run, store

    def finish(run, st):
        out = {**run.run(), "reads": run.reads.rows()}
        run.close(), run.reads.close(), st.close()
        return out

    ref, st = make(tmp_path / "ref" / "harness-only")
    want = finish(ref, st)
    run, st = make(tmp_path / "run" / "harness-only")
    real, n = st._ledger.write, [0]

    def write(row):
        n[0] += 1
        if n[0] == 24:
            raise KeyboardInterrupt
        real(row)

    st._ledger.write = write
    with pytest.raises(KeyboardInterrupt):
        run.run()
    run.close(), run.reads.close(), st.close()
    got = finish(*make(tmp_path / "run" / "harness-only"))
    assert got["training_rollouts"] == want["training_rollouts"]
    assert [(r["cycle"], r["training_rollouts"]) for r in got["reads"]] == \
        [(r["cycle"], r["training_rollouts"]) for r in want["reads"]]
    assert count_rollouts(tmp_path / "run" / "harness-only")["training"] == got["training_rollouts"]
    curve_rows(tmp_path / "run")  # reads agree with the ledger, or RecordError


def test_a_schedule_whose_cycle_spends_nothing_stops_instead_of_looping():
    """harness-only until the budget: a proposer whose every edit fails to apply spends no
    rollout after the seed, so without a stop the schedule would cycle for ever."""
    from tests.revise.conftest import SEED as SUM_SEED
    from tests.revise.conftest import SumTask, prose_solver
    from whale.metaharness.loop import SearchSettings
    from whale.metaharness.operator import SearchOperator

    class Serving:
        def serve(self, adapter):
            return prose_solver()

        def close(self):
            pass

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "harness-only"
        task = SumTask()
        qs = task.questions()
        store = OutcomeStore(root, "fp")
        solver = Solver(Serving(), "fp", RuntimeConfig(sandbox="auto", warm=0))
        bad = 'CALL submit {"base": "c0000", "hypothesis": "x"}\n<<<<<<< SEARCH\nnot there\n=======\nx\n>>>>>>> REPLACE\n'
        op = SearchOperator(root / "harness", qs[:4], store, ScriptedModel([bad]),
                            SearchSettings(iterations=1, m=1, workers=2))
        s = ScheduleSettings("harness-only", rollouts=1000, harness_iters=1)
        reads = Reads(root, "harness-only", task, store, solver, 2, qs[20:22])
        run = Cotrain(root, "harness-only", s, task, SUM_SEED, store, solver, None, op, 2,
                      read=reads)
        try:
            got = run.run()
        finally:
            run.close()
            reads.close()
            store.close()
    assert got["stopped"].startswith("cycle 2 spent no training rollout")
    assert got["training_rollouts"] == 4  # the seed, scored once in cycle 1


def test_a_recorded_weight_step_is_replayed_only_from_the_same_harness(tmp_path):
    serving = CountingServing()  # replies "Answer: 1": odd length, never accepted
    store = OutcomeStore(tmp_path, "fp")
    solver = Solver(serving, "fp", RuntimeConfig(sandbox="auto", warm=0))
    task = EvenTask()
    wp = WeightPhase(tmp_path / "weight", task, task.questions()[:8], store, solver, settings(),
                     lambda a: None, lambda: None, seed=0, workers=2)
    tags = {"schedule": "weight-only", "cycle": 1, "phase": "weight", "kind": "weight_sample",
            "step": 0, "adapter": None}
    try:
        first = wp.step(SEED, 0, 0, None, tags)
        assert first.skipped.startswith("no accepted trajectory") and store.new_rollouts == 4
        assert wp.step(SEED, 0, 0, None, tags) is first and store.new_rollouts == 4  # replayed
        other = SEED.replace("return reply.text", "return reply.text + ' '")
        again = wp.step(other, 0, 0, None, tags)
        assert again is not first and store.new_rollouts == 8  # another harness: sampled anew
    finally:
        wp.close()
        store.close()
