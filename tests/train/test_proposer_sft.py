"""Proposer SFT on TRL (tiny local model): family-disjoint folds, the CV epoch pick, completion-only
masking, dropping (not truncating) long examples, the adapter changing the model, and resume of a
killed run from its last checkpoint."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from whale.train.proposer.sft import (
    ProposerSFTSettings,
    cross_validate,
    eval_epochs,
    family_folds,
    fit_examples,
    pick_epochs,
    steps_for,
    train_sft,
)
from whale.train.sft import LoraSettings

# fp32: the arithmetic checked here is fp32's (bf16: test_dtype.py)
FAST = dict(lora=LoraSettings(r=4, alpha=8), lr=1e-2, batch_size=2, threads=1, dtype="fp32")


def settings(**kw) -> ProposerSFTSettings:
    return ProposerSFTSettings(**(FAST | kw))


def rows(n: int, families: int) -> list[dict]:
    out = []
    for i in range(n):
        fam = f"fam{i % families}"
        out.append({
            "prompt": [{"role": "user", "content": f"What is {i} plus {i}? Please think step."}],
            "completion": [{"role": "assistant", "content": f"It is {2 * i}. The answer is {i}."}],
            "family": fam,
            "context": f"rg:{fam}/h{i}/0",
        })  # fmt: skip
    return out


def dataset(n: int = 4, families: int = 2):
    from datasets import Dataset

    return Dataset.from_list(rows(n, families))


def quiet(_: str) -> None:
    pass


# -- pure parts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n_fam", [2, 3, 4, 5, 7, 12])
@pytest.mark.parametrize("k", [2, 3, 4, 10])
def test_folds_never_share_a_family(n_fam, k):
    rng = random.Random(n_fam * 100 + k)
    names = [f"f{i}" for i in range(n_fam)]
    families = [rng.choice(names) for _ in range(40)] + names  # repeats, every name present
    for seed in range(3):
        folds = family_folds(families, k, seed)
        assert len(folds) == min(k, n_fam)
        seen: list[str] = []
        for train, val in folds:
            assert val and train, (train, val)
            assert not set(train) & set(val)
            assert set(train) | set(val) == set(names)
            seen += val
        assert sorted(seen) == sorted(names)  # each family validates in exactly one fold
    assert family_folds(families, k, 0) == family_folds(families, k, 0)


def test_fewer_than_two_families_raises():
    with pytest.raises(ValueError, match="at least 2 families"):
        family_folds(["a", "a", "a"], 4, 0)
    with pytest.raises(ValueError, match="at least 2 families"):
        family_folds([], 4, 0)


def test_pick_epochs_lowest_mean_on_a_fixed_table():
    curves = [
        [(0.5, 3.0), (1.0, 2.0), (1.5, 1.6), (2.0, 1.9), (2.5, 9.0)],
        [(0.5, 3.2), (1.0, 2.2), (1.5, 2.0), (2.0, 1.3)],  # no 2.5: 2.5 is not common
        [(0.5, 2.8), (1.0, 1.9), (1.5, 1.7), (2.0, 1.9)],
    ]
    epochs, mean = pick_epochs(curves)
    assert [e for e, _ in mean] == [0.5, 1.0, 1.5, 2.0]
    assert mean[2][1] == pytest.approx((1.6 + 2.0 + 1.7) / 3)
    assert mean[3][1] == pytest.approx((1.9 + 1.3 + 1.9) / 3)
    # means: 3.0, 2.033, 1.767, 1.70 -> 2.0, though two of three folds are lowest at 1.5
    assert epochs == 2.0


def test_pick_epochs_ties_go_to_fewer_epochs_and_empty_raises():
    assert pick_epochs([[(1.0, 2.0), (2.0, 2.0)], [(1.0, 1.0), (2.0, 1.0)]])[0] == 1.0
    with pytest.raises(ValueError):
        pick_epochs([[(1.0, 2.0)], []])
    with pytest.raises(ValueError):
        pick_epochs([[(1.0, 2.0)], [(2.0, 1.0)]])


def test_eval_grid_and_steps():
    assert eval_epochs(4.0, 0.5) == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    assert eval_epochs(1.0, 0.3) == [0.3, 0.6, 0.9, 1.0]
    assert steps_for(2.9, 10) == 29 and steps_for(0.5, 3) == 2 and steps_for(0.01, 1) == 1


def test_settings_validate():
    ProposerSFTSettings().validate()
    for bad in (dict(lr=0), dict(folds=1), dict(batch_size=8, micro_batch=3), dict(epochs=0.0),
                dict(eval_every=5.0), dict(scheduler="nope"), dict(max_len=0)):  # fmt: skip
        with pytest.raises(ValueError):
            ProposerSFTSettings(**bad).validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lora"):
        ProposerSFTSettings(lora=LoraSettings(r=0)).validate()


# -- with the tiny model ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_too_long_example_is_dropped_with_its_reason(tok):
    data = rows(3, 2)
    data[1]["completion"][0]["content"] = "one two three " * 200
    from datasets import Dataset

    kept, dropped = fit_examples(Dataset.from_list(data), tok, max_len=128)
    assert kept["context"] == [data[0]["context"], data[2]["context"]]
    assert len(dropped) == 1 and dropped[0]["context"] == data[1]["context"]
    assert dropped[0]["tokens"] > 128 and "max_len 128" in dropped[0]["reason"]
    kept_all, none = fit_examples(Dataset.from_list(data), tok, max_len=10_000)
    assert len(kept_all) == 3 and none == []


def test_trl_masks_the_prompt(tiny_model_dir, tok, tmp_path):
    """Labels of the prompt tokens are -100, the rest are the completion's tokens, and the
    trainer's loss equals the NLL over the completion positions alone."""
    import torch
    import torch.nn.functional as F

    from whale.train.proposer.sft import _trainer

    data = dataset(4, 2)
    trainer = _trainer(tiny_model_dir, settings(), data, None, tmp_path, 1, {}, quiet, [])
    for row, prepared in zip(data, trainer.train_dataset, strict=True):
        prompt = tok.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]  # fmt: skip
        ids, labels = prepared["input_ids"], prepared["labels"]
        assert ids[: len(prompt)] == prompt
        assert labels[: len(prompt)] == [-100] * len(prompt)
        assert labels[len(prompt) :] == ids[len(prompt) :]
        assert tok.decode(labels[len(prompt) :]).startswith(row["completion"][0]["content"])
    batch = trainer.data_collator([trainer.train_dataset[0]])
    model = trainer.model
    model.eval()
    with torch.no_grad():
        loss = float(trainer.compute_loss(model, dict(batch)))
        logits = model(input_ids=batch["input_ids"]).logits[0, :-1]
    target = batch["labels"][0, 1:]
    keep = target != -100
    completion_only = float(F.cross_entropy(logits[keep], target[keep]))
    everything = float(F.cross_entropy(logits, batch["input_ids"][0, 1:]))
    assert loss == pytest.approx(completion_only, rel=1e-4)
    assert abs(loss - everything) > 1e-3  # the prompt positions would change it


def test_train_sft_adapter_changes_the_model(tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = rows(4, 2) + [rows(1, 1)[0] | {"context": "long"}]
    data[-1]["prompt"] = [{"role": "user", "content": "seven " * 400}]
    from datasets import Dataset

    adapter = train_sft(Dataset.from_list(data), tiny_model_dir, settings(max_len=256), 1.0,
                        tmp_path / "final", say=quiet)  # fmt: skip
    assert (adapter / "adapter_config.json").exists()
    assert (adapter / "adapter_model.safetensors").exists()
    record = json.loads((tmp_path / "final" / "train.json").read_text())
    assert record["examples"] == 4 and record["steps"] == 2 and record["epochs"] == 1.0
    assert [d["context"] for d in record["dropped"]] == ["long"]
    assert record["resumed_from"] is None and record["final_loss"] > 0
    assert not (tmp_path / "final" / "checkpoints").exists()
    ids = torch.arange(20)[None]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        before = base(input_ids=ids).logits
        tuned = PeftModel.from_pretrained(base, str(adapter)).eval()
        after = tuned(input_ids=ids).logits
    assert (after - before).abs().max() > 1e-4


class Kill(Exception):
    pass


def StepLog():
    from transformers import TrainerCallback

    class Log(TrainerCallback):
        def __init__(self):
            self.seen: list[int] = []

        def on_step_end(self, args, state, control, **kw):
            self.seen.append(state.global_step)

    return Log()


def killer(at_step: int):
    from transformers import TrainerCallback

    class KillAfterSave(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            if state.global_step == at_step:
                raise Kill(at_step)

    return KillAfterSave()


def test_killed_run_resumes_from_its_checkpoint(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    data, s = dataset(4, 2), settings()  # 2 steps an epoch, 4 steps in all
    with pytest.raises(Kill):
        train_sft(data, tiny_model_dir, s, 2.0, tmp_path / "a", say=quiet,
                  callbacks=[killer(2)])  # fmt: skip
    assert (tmp_path / "a" / "checkpoints" / "checkpoint-2" / "trainer_state.json").exists()
    assert not (tmp_path / "a" / "adapter").exists()
    with pytest.raises(ValueError, match="another run"):  # other epochs: refuse, don't mix
        train_sft(data, tiny_model_dir, s, 1.0, tmp_path / "a", say=quiet)
    said: list[str] = []
    steps = StepLog()
    adapter = train_sft(data, tiny_model_dir, s, 2.0, tmp_path / "a", say=said.append,
                        callbacks=[steps])  # fmt: skip
    assert steps.seen == [3, 4]  # continued at step 3, not restarted from 0
    record = json.loads((tmp_path / "a" / "train.json").read_text())
    assert record["resumed_from"] == 2 and record["steps"] == 4
    assert any("resuming from checkpoint-2" in line for line in said)
    straight = train_sft(data, tiny_model_dir, s, 2.0, tmp_path / "b", say=quiet)
    again = StepLog()  # finished before: returned as is, nothing trained
    assert (
        train_sft(data, tiny_model_dir, s, 2.0, tmp_path / "b", say=quiet, callbacks=[again])
        == straight
    )
    assert again.seen == []
    resumed, plain = (
        load_file(adapter / "adapter_model.safetensors"),
        load_file(straight / "adapter_model.safetensors"),
    )
    assert resumed.keys() == plain.keys()
    for key in plain:  # a resumed run continues as the uninterrupted one did
        assert (resumed[key] - plain[key]).abs().max() < 1e-5, key


def test_cross_validate_folds_curves_and_no_rerun(tiny_model_dir, tmp_path):
    from transformers import TrainerCallback

    class Count(TrainerCallback):
        runs = 0

        def on_train_begin(self, args, state, control, **kw):
            Count.runs += 1

    data = dataset(8, 4)
    s = settings(folds=2, max_epochs=1.0, eval_every=0.5)
    cv = cross_validate(data, tiny_model_dir, s, tmp_path / "cv", say=quiet, callbacks=[Count()])
    assert Count.runs == 2 and len(cv.folds) == 2
    for fold in cv.folds:
        assert not set(fold["train_families"]) & set(fold["val_families"])
        assert fold["n_train"] == fold["n_val"] == 4
        assert [e for e, _ in fold["curve"]] == [0.5, 1.0]
        assert fold["curve"][1][1] < fold["curve"][0][1]  # lr 1e-2: the val loss falls
    epochs, mean = pick_epochs([f["curve"] for f in cv.folds])
    assert cv.epochs == epochs == 1.0 and cv.mean_curve == mean
    saved = json.loads((tmp_path / "cv" / "cv.json").read_text())
    assert saved["epochs"] == 1.0 and saved["examples"] == 8
    again = cross_validate(data, tiny_model_dir, s, tmp_path / "cv", say=quiet,
                           callbacks=[Count()])  # fmt: skip
    assert Count.runs == 2 and again.epochs == cv.epochs and again.mean_curve == cv.mean_curve


def test_cross_validate_needs_two_families(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="set `epochs`"):
        cross_validate(dataset(4, 1), tiny_model_dir, settings(), tmp_path / "cv", say=quiet)


def test_module_has_no_heavy_imports():
    import subprocess
    import sys

    code = ("import sys, whale.train.proposer.sft; "
            "print(sorted(m for m in ('torch', 'trl', 'peft', 'transformers', 'datasets') "
            "if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"
