"""GRPO's embedded sampler asks a timed-out sample again, with its seed, `generation_retries`
times: one slow call on a busy machine does not end the update (issue 26's run lost an update
to one such call); a sample that keeps timing out still fails it, and the retries are counted."""

import json
import threading
from types import SimpleNamespace

import pytest

from tests.fakes import ScriptedModel
from tests.train.test_proposer_decoding import _Tokenizer, _Trainer
from whale.models.base import ModelTimeout
from whale.train.proposer import grpo as grpomod
from whale.train.proposer import grpo_rollout as rollmod
from whale.train.proposer.run import ProposerTrainConfig


class _SlowAt(ScriptedModel):
    """A ScriptedModel whose calls on one prompt time out their first `times` times."""

    def __init__(self, prompt: str, times: int) -> None:
        super().__init__(["answer"])
        self.prompt, self.left = prompt, times
        self._gate = threading.Lock()

    def chat(self, messages, sampling, timeout=None):
        with self._gate:
            slow = messages[-1]["content"] == self.prompt and self.left > 0
            self.left -= slow
        if slow:
            self.calls.append((messages, sampling))
            raise ModelTimeout("no reply within 600.0 s")
        return super().chat(messages, sampling, timeout)


def _rollout(model, retries: int, clock, out):
    settings = grpomod.GRPOSettings(generation="embedded", generation_retries=retries)
    serving = SimpleNamespace(serve=lambda adapter: model)
    return rollmod.make_rollout(serving, settings, out, _Tokenizer(), clock)


MSGS = [[{"role": "user", "content": m}] for m in ("first prompt", "second prompt")]


def test_a_timed_out_sample_is_asked_again_with_its_seed_and_counted(tmp_path):
    model, clock = _SlowAt("second prompt", times=1), rollmod.Clock()
    out = _rollout(model, 1, clock, tmp_path)(MSGS, _Trainer())
    assert out["whale_text"] == ["answer", "answer"]
    seeds = [s.seed for m, s in model.calls if m[-1]["content"] == "second prompt"]
    assert len(seeds) == 2 and seeds[0] == seeds[1]  # the same sample, asked again
    assert clock.retries == 1


def test_a_sample_that_keeps_timing_out_still_fails_the_update(tmp_path):
    model = _SlowAt("second prompt", times=2)
    with pytest.raises(ModelTimeout):
        _rollout(model, 1, rollmod.Clock(), tmp_path)(MSGS, _Trainer())


def test_with_no_retries_the_first_timeout_fails_the_update(tmp_path):
    model = _SlowAt("second prompt", times=1)
    with pytest.raises(ModelTimeout):
        _rollout(model, 0, rollmod.Clock(), tmp_path)(MSGS, _Trainer())


def test_negative_retries_are_refused_and_a_resume_may_change_them():
    with pytest.raises(ValueError, match="generation_retries"):
        grpomod.GRPOSettings(generation_retries=-1).validate()
    assert "grpo.generation_retries" in ProposerTrainConfig.where_fields


def test_an_update_row_written_before_retries_were_counted_still_reads(tmp_path):
    old = {"update": 1, "generation_s": 1.0, "reward_s": 1.0, "gradient_s": 1.0,
           "reward_mean": 0.0, "reward_std": 0.0, "rewards": [0.0], "completion_tokens": 3}  # fmt: skip
    (tmp_path / "rows.jsonl").write_text(json.dumps(old) + "\n")
    (row,) = grpomod._read_rows(tmp_path / "rows.jsonl")
    assert row.generation_retries == 0


def test_a_run_saved_before_retries_existed_resumes_with_any_retries(tmp_path):
    """`generation_retries` says how often a sample is asked again, not what is trained: it is
    no part of the run's identity, so the Harness Learning run (grpo_run.json written before
    the setting) resumes under the new code, with any value."""
    prompts = [("c1", "first prompt")]

    def identity(**kw):
        return grpomod.run_identity(grpomod.GRPOSettings(**kw), "bf16", tmp_path / "ck", None,
                                    prompts, None)  # fmt: skip

    saved = identity()
    assert "generation_retries" not in saved["settings"]  # as a run from before wrote it
    (tmp_path / grpomod.RUN_FILE).write_text(json.dumps(saved))
    grpomod._check_run(tmp_path, identity(generation_retries=3))
    with pytest.raises(ValueError, match="'settings'"):
        grpomod._check_run(tmp_path, identity(g=4))


def test_a_run_saved_while_retries_were_part_of_its_identity_resumes(tmp_path):
    """4778e66 added the setting without putting it in `_WHERE`: a run it started recorded
    `generation_retries` in grpo_run.json's settings, and the current identity, which leaves it
    out, differed from it ("differs in ['settings']"). A where-field the saved run recorded
    is left out of the comparison too."""
    prompts = [("c1", "first prompt")]
    now = grpomod.run_identity(grpomod.GRPOSettings(generation_retries=2), "bf16",
                               tmp_path / "ck", None, prompts, None)  # fmt: skip
    saved = json.loads(json.dumps(now))
    saved["settings"]["generation_retries"] = 1  # as 4778e66 wrote it
    (tmp_path / grpomod.RUN_FILE).write_text(json.dumps(saved))
    grpomod._check_run(tmp_path, now)
    saved["settings"]["g"] = 99  # a setting that defines the run still must match
    (tmp_path / grpomod.RUN_FILE).write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="'settings'"):
        grpomod._check_run(tmp_path, now)
