"""Proposer SFT (Harness Learning): LoRA on filtered teacher edits with TRL's `SFTTrainer`, the
epoch count chosen by family-disjoint k-fold cross-validation.

The recipe is the paper's: LoRA r = 32 on every attention and MLP projection, lr 1e-4 with a
cosine schedule, loss on the completion only (TRL's `completion_only_loss` on the
conversational prompt-completion dataset masks the prompt's labels to -100), and a training
length (~2.9 epochs in the paper) picked as the lowest mean validation loss over k folds whose
validation families never appear in their training data (a proposer must generalize to unseen
tasks, so examples of one family must not leak across a split).

Why TRL here and a hand loop in `whale.train.sft`: proposer SFT is one `train()` of a fixed
dataset, exactly what a `Trainer` is built for, and it brings checkpoint/resume, the schedule,
gradient accumulation and the multi-process path (`accelerate launch`) for free.

Lengths: an example longer than `max_len` tokens (prompt + completion, as the chat template
renders them) is dropped with its reason recorded, never truncated (a cut edit block teaches a
malformed answer); TRL runs with `max_length=None`. Epochs: one epoch is
ceil(ceil(n / (micro_batch * processes)) / accumulation) optimizer steps (the `Trainer`'s own
count); a fractional epoch count e trains ceil(e * steps_per_epoch) steps, given as `max_steps`
so the cosine schedule ends where training does. `batch_size` is per process.

dtype (`sft.dtype`, `whale.train.precision`): the base weights in bf16 where the hardware has
bf16 units ("auto"), the LoRA weights and the saved adapter fp32; TRL's own `bf16` (autocast)
stays off. The dtype trained in is recorded in each run's record (`dtype`) and is part of its
fingerprint, so a finished fold or adapter of the other dtype is trained again, not reused
(an fp32 run keeps the fingerprint it had before the setting existed).

Validation loss: TRL's `eval_loss` with one example per eval batch, i.e. the mean over
validation examples of each one's token-mean completion NLL (not a token mean over the set).

Resume: checkpoints go to `<out>/checkpoints/checkpoint-N` every `save_every` steps (adapter,
optimizer, scheduler, RNG and trainer state; the last two kept); a killed run continues from the
last complete one (the one with `trainer_state.json`, which the `Trainer` writes last). The
run's fingerprint (data, settings, steps, base) is kept in `<out>/run.json`; checkpoints of a
different run are refused rather than silently continued. A finished run's checkpoints are
deleted (its result file marks it done). Not covered: early stopping inside a run, packing,
other losses than TRL's NLL, choosing anything but the epoch count by CV, and multi-process
runs (`accelerate launch` goes through the same `SFTTrainer`, but the record files here are
written by every rank: untested).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from whale.config import above, at_least, check_choices, part
from whale.records import record_dir, replace_dir
from whale.train.precision import (
    Dtype,
    TrainDtype,
    keep_fp32,
    lora_in_base_dtype,
    resolve,
    torch_dtype,
)
from whale.train.sft import LoraSettings

if TYPE_CHECKING:
    from datasets import Dataset

Say = Callable[[str], None]
# The learning-rate schedules of TRL's SFTConfig (transformers' SchedulerType) offered here.
Scheduler = Literal["cosine", "linear", "constant", "cosine_with_restarts", "polynomial",
                    "inverse_sqrt"]  # fmt: skip
COLUMNS = ("prompt", "completion")


@dataclass
class ProposerSFTSettings:
    lora: LoraSettings = field(default_factory=LoraSettings)
    lr: float = 1e-4
    scheduler: Scheduler = "cosine"
    folds: int = 4  # family-disjoint CV folds (capped by the number of families)
    max_epochs: float = 4.0  # CV evaluates the validation loss every `eval_every` epochs up to this
    eval_every: float = 0.5
    epochs: float | None = None  # given: skip CV and train this long
    batch_size: int = 8  # examples per optimizer step (gradient accumulation over micro batches)
    micro_batch: int = 1
    max_len: int = 4096  # longer examples are dropped with a recorded reason (never truncated)
    threads: int = 2
    seed: int = 0
    save_every: int = 1  # optimizer steps between checkpoints (resume granularity)
    dtype: TrainDtype = "auto"  # bf16 base weights where the hardware has bf16 units

    def validate(self) -> None:
        with part("lora"):
            self.lora.validate()
        above(self, 0.0, "lr", "max_epochs", "eval_every", "epochs")
        at_least(self, 2, "folds")
        at_least(self, 1, "batch_size", "micro_batch", "max_len", "threads", "save_every")
        check_choices(self)
        if self.eval_every > self.max_epochs:
            raise ValueError("eval_every: must be at most max_epochs")
        if self.batch_size % self.micro_batch:
            raise ValueError("batch_size: must be a multiple of micro_batch")


# -- folds and epoch selection (pure) ---------------------------------------------------------
def family_folds(families: Sequence[str], k: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """(train families, validation families) per fold. The distinct families are shuffled
    (seeded) and dealt round-robin into k groups; fold i validates on group i and trains on the
    rest, so each family validates in exactly one fold. k is capped by the number of families."""
    distinct = sorted(set(families))
    if len(distinct) < 2:
        raise ValueError(
            f"cross-validation needs at least 2 families, got {len(distinct)}: set `epochs`"
        )
    if k < 2:
        raise ValueError(f"folds: must be at least 2 (got {k})")
    k = min(k, len(distinct))
    random.Random(f"folds/{seed}").shuffle(distinct)
    groups = [distinct[i::k] for i in range(k)]
    return [
        (sorted(f for j, g in enumerate(groups) if j != i for f in g), sorted(groups[i]))
        for i in range(k)
    ]


def eval_epochs(max_epochs: float, eval_every: float) -> list[float]:
    """The epochs CV evaluates at: eval_every, 2·eval_every, ... up to max_epochs (included)."""
    n = math.floor(max_epochs / eval_every + 1e-9)
    grid = [round(i * eval_every, 9) for i in range(1, n + 1)]
    if not grid or grid[-1] < max_epochs - 1e-9:
        grid.append(max_epochs)
    return grid


def steps_for(epochs: float, steps_per_epoch: int) -> int:
    """Optimizer steps of `epochs` epochs (at least one)."""
    return max(1, math.ceil(epochs * steps_per_epoch - 1e-9))


def pick_epochs(
    curves: Sequence[Sequence[tuple[float, float]]],
) -> tuple[float, list[tuple[float, float]]]:
    """The epoch count with the lowest mean validation loss over the folds' (epoch, loss)
    curves, and the mean curve; only epochs every fold evaluated count; ties go to fewer."""
    if not curves or not all(curves):
        raise ValueError("pick_epochs: every fold needs at least one (epoch, loss) point")
    tables = [dict(c) for c in curves]
    common = sorted(set.intersection(*(set(t) for t in tables)))
    if not common:
        raise ValueError("pick_epochs: the folds share no evaluated epoch")
    mean = [(e, sum(t[e] for t in tables) / len(tables)) for e in common]
    best = min(mean, key=lambda p: (p[1], p[0]))
    return best[0], mean


@dataclass
class CVResult:
    epochs: float
    folds: list[dict[str, Any]]  # train/val families, n examples, curve [(epoch, val_loss)]
    mean_curve: list[tuple[float, float]]


# -- data ---------------------------------------------------------------------------------------
def fit_examples(data: Dataset, tokenizer: Any, max_len: int) -> tuple[Dataset, list[dict]]:
    """The rows of `data` whose prompt + completion fits in `max_len` tokens (rendered by the
    chat template as TRL renders them), and a record per dropped row."""
    keep, dropped = [], []
    for i, row in enumerate(data):
        n = len(tokenizer.apply_chat_template(
            list(row["prompt"]) + list(row["completion"]), tokenize=True, return_dict=True
        )["input_ids"])  # fmt: skip
        if n > max_len:
            dropped.append({"context": row.get("context"), "family": row.get("family"),
                            "tokens": n, "reason": f"{n} tokens > max_len {max_len}"})  # fmt: skip
        else:
            keep.append(i)
    return data.select(keep), dropped


def _fingerprint(data: Dataset, **extra: Any) -> str:
    h = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for row in data:
        h.update(json.dumps([row[c] for c in COLUMNS], sort_keys=True).encode())
    return h.hexdigest()[:16]


def _run_fingerprint(
    checkpoint: Path, settings: ProposerSFTSettings, train: Dataset, val: Dataset | None,
    epochs: float, grid: Sequence[float],
) -> str:  # fmt: skip
    """What makes two runs the same run: data, settings, step count, eval grid, base, and the
    dtype trained in ("auto" resolved; named only when bf16, so an fp32 run keeps the
    fingerprint of a run made before the setting existed)."""
    steps = steps_for(epochs, _steps_per_epoch(len(train), settings))
    dtype = _dtype(settings)
    extra = {"dtype": dtype} if dtype != "fp32" else {}
    return _fingerprint(
        train, val=None if val is None else _fingerprint(val), steps=steps,
        settings={k: v for k, v in asdict(settings).items() if k != "dtype"}, grid=list(grid),
        base=str(checkpoint), **extra,
    )  # fmt: skip


def _dtype(settings: ProposerSFTSettings) -> Dtype:
    """What the `SFTTrainer` trains in: on CUDA where there is a device, else on the CPU."""
    return resolve(settings.dtype)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars from datasets' maps or transformers' weight loading."""
    import datasets
    from transformers.utils import logging as hf_logging

    bars = datasets.is_progress_bar_enabled(), hf_logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars[0]:
            datasets.enable_progress_bars()
        if bars[1]:
            hf_logging.enable_progress_bar()


def _last_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint; incomplete ones (killed mid save) are removed."""
    found = sorted(
        (int(p.name.split("-")[1]), p)
        for p in folder.glob("checkpoint-*") if p.name.split("-")[1].isdigit()
    )  # fmt: skip
    while found and not (found[-1][1] / "trainer_state.json").exists():
        shutil.rmtree(found.pop()[1])
    return found[-1][1] if found else None


# -- one TRL run ----------------------------------------------------------------------------
def _steps_per_epoch(n: int, settings: ProposerSFTSettings) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batches = math.ceil(n / (settings.micro_batch * world))
    return max(1, math.ceil(batches / (settings.batch_size // settings.micro_batch)))


def _trainer(
    checkpoint: Path, settings: ProposerSFTSettings, train: Dataset, val: Dataset | None,
    out: Path, max_steps: int, eval_at: dict[int, list[float]], say: Say, callbacks: Sequence[Any],
) -> Any:  # fmt: skip
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    class Progress(TrainerCallback):  # type: ignore[misc]
        """Asks for an evaluation at the CV steps; reports progress through `say`."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if state.global_step in eval_at:
                control.should_evaluate = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            logs = logs or {}
            if "eval_loss" in logs:
                say(f"{out.parent.name}: step {state.global_step}/{max_steps} "
                    f"val loss {logs['eval_loss']:.4f}")  # fmt: skip
            elif "loss" in logs and (state.global_step % 10 == 0 or state.global_step == max_steps):
                say(f"{out.parent.name}: step {state.global_step}/{max_steps} "
                    f"loss {logs['loss']:.4f}")  # fmt: skip

    torch.set_num_threads(settings.threads)
    set_seed(settings.seed)
    cuda = torch.cuda.is_available()
    dtype = _dtype(settings)
    config = SFTConfig(
        output_dir=str(out), learning_rate=settings.lr, lr_scheduler_type=settings.scheduler,
        max_steps=max_steps, per_device_train_batch_size=settings.micro_batch,
        per_device_eval_batch_size=1,
        gradient_accumulation_steps=settings.batch_size // settings.micro_batch,
        save_strategy="steps", save_steps=settings.save_every, save_total_limit=2,
        eval_strategy="no", logging_steps=1, report_to=[], disable_tqdm=True,
        use_cpu=not cuda, bf16=False,  # bf16 is in the base weights, not autocast (precision)
        seed=settings.seed, data_seed=settings.seed,
        max_length=None, completion_only_loss=True,
    )  # fmt: skip
    lora = settings.lora
    peft_config = LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        target_modules=list(lora.targets), task_type="CAUSAL_LM",
    )  # fmt: skip
    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch_dtype(dtype))
        trainer: Any = SFTTrainer(
            model=model, args=config, processing_class=AutoTokenizer.from_pretrained(checkpoint),
            train_dataset=train.select_columns(list(COLUMNS)),
            eval_dataset=None if val is None else val.select_columns(list(COLUMNS)),
            peft_config=peft_config, callbacks=[Progress(), *callbacks],
        )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # progress goes through `say`
    keep_fp32(p for p in trainer.model.parameters() if p.requires_grad)
    if dtype == "bf16":
        lora_in_base_dtype(trainer.model)
    if len(trainer.train_dataset) != len(train):  # max_length=None: TRL must keep every row
        raise RuntimeError(f"TRL kept {len(trainer.train_dataset)} of {len(train)} examples")
    return trainer


def _run(
    checkpoint: Path, settings: ProposerSFTSettings, train: Dataset, val: Dataset | None,
    out: Path, epochs: float, eval_grid: Sequence[float], say: Say, callbacks: Sequence[Any],
    save: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train (resuming from `out/checkpoints`) for `epochs`; evaluate on `val` at `eval_grid`
    epochs; save the adapter to `save` if given. Returns the run's record."""
    t0 = time.monotonic()
    spe = _steps_per_epoch(len(train), settings)
    max_steps = steps_for(epochs, spe)
    eval_at: dict[int, list[float]] = {}
    for e in eval_grid:
        eval_at.setdefault(steps_for(e, spe), []).append(e)
    folder = out / "checkpoints"
    record_dir(folder)  # never a link (whale.records)
    fingerprint = _run_fingerprint(checkpoint, settings, train, val, epochs, eval_grid)
    run_file = out / "run.json"
    resume = _last_checkpoint(folder)
    if resume is not None:
        old = json.loads(run_file.read_text()).get("fingerprint") if run_file.exists() else None
        if old != fingerprint:
            raise ValueError(f"{folder} holds checkpoints of another run (data, settings or "
                             f"epochs differ): remove it to start over")  # fmt: skip
        say(f"{out.name}: resuming from {resume.name}")
    _write_json(run_file, {"fingerprint": fingerprint, "max_steps": max_steps})
    trainer = _trainer(checkpoint, settings, train, val, folder, max_steps, eval_at, say, callbacks)
    try:
        result = trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
        history = trainer.state.log_history
        if save is not None:
            tmp = save.with_name(save.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            trainer.save_model(str(tmp))
            replace_dir(tmp, save)
        step = int(trainer.state.global_step)
    finally:
        del trainer
        gc.collect()
    by_step = {int(h["step"]): float(h["eval_loss"]) for h in history if "eval_loss" in h}
    curve = [(e, by_step[s]) for s, es in sorted(eval_at.items()) if s in by_step for e in es]
    losses = [float(h["loss"]) for h in history if "loss" in h]
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "fingerprint": fingerprint, "epochs": epochs, "steps": step, "max_steps": max_steps,
        "steps_per_epoch": spe, "final_loss": losses[-1] if losses else None,
        "mean_loss": float(result.training_loss), "curve": curve,
        "resumed_from": None if resume is None else int(resume.name.split("-")[1]),
        "wall_s": round(time.monotonic() - t0, 3), "dtype": _dtype(settings),
    }  # fmt: skip


def _tokenizer(checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


# -- public -----------------------------------------------------------------------------------
def cross_validate(
    data: Dataset, checkpoint: Path, settings: ProposerSFTSettings, out: Path,
    say: Say = print, *, callbacks: Sequence[Any] = (),
) -> CVResult:  # fmt: skip
    """Family-disjoint k-fold CV of the training length: one TRL run per fold in `out/fold_K/`
    (train on the fold's training families for `max_epochs`, validation loss on its held-out
    families every `eval_every` epochs), then the epoch count with the lowest mean validation
    loss. A finished fold (`fold_K/result.json`) is not run again; a killed one resumes from its
    last checkpoint. Writes `out/cv.json`. `callbacks` are extra `TrainerCallback`s."""
    settings.validate()
    out, checkpoint = Path(out), Path(checkpoint)
    record_dir(out)
    kept, dropped = fit_examples(data, _tokenizer(checkpoint), settings.max_len)
    grid = eval_epochs(settings.max_epochs, settings.eval_every)
    folds: list[dict[str, Any]] = []
    fam = kept["family"]
    splits = family_folds(fam, settings.folds, settings.seed)
    for k, (train_f, val_f) in enumerate(splits):
        fold_dir = out / f"fold_{k}"
        done = fold_dir / "result.json"
        train_set, val_set = set(train_f), set(val_f)
        train = kept.select([i for i, f in enumerate(fam) if f in train_set])
        val = kept.select([i for i, f in enumerate(fam) if f in val_set])
        same = _run_fingerprint(checkpoint, settings, train, val, settings.max_epochs, grid)
        if done.exists():
            record = json.loads(done.read_text())
            if record.get("fingerprint") == same:
                say(f"fold_{k}: done before (val loss curve in {done})")
                record["curve"] = [tuple(p) for p in record["curve"]]
                folds.append(record)
                continue
        say(f"fold_{k}: {len(train)} train / {len(val)} val examples, val families {val_f}")
        record_dir(fold_dir)
        run = _run(checkpoint, settings, train, val, fold_dir, settings.max_epochs, grid, say,
                   callbacks)  # fmt: skip
        record = {"fold": k, "train_families": train_f, "val_families": val_f,
                  "n_train": len(train), "n_val": len(val)} | run  # fmt: skip
        _write_json(done, record)
        folds.append(record)
    epochs, mean = pick_epochs([f["curve"] for f in folds])
    result = CVResult(epochs=epochs, folds=folds, mean_curve=mean)
    _write_json(out / "cv.json", asdict(result) | {"examples": len(kept), "dropped": dropped})
    say(f"cv: {epochs} epochs (mean val loss {dict(mean)[epochs]:.4f})")
    return result


def train_sft(
    data: Dataset, checkpoint: Path, settings: ProposerSFTSettings, epochs: float, out: Path,
    say: Say = print, *, callbacks: Sequence[Any] = (),
) -> Path:  # fmt: skip
    """Train the final adapter on all of `data` for `epochs` epochs; the PEFT folder lands at
    `out/adapter/`. Resumes from `out/checkpoints/checkpoint-N` if present (a killed run
    continues). Writes `out/train.json` (epochs, steps, final loss, examples used, dropped rows
    with reasons, resumed_from, wall_s); a run already finished with the same fingerprint is
    returned as is. `callbacks` are extra `TrainerCallback`s."""
    settings.validate()
    if not epochs > 0:
        raise ValueError(f"epochs: must be greater than 0 (got {epochs!r})")
    out, checkpoint = Path(out), Path(checkpoint)
    record_dir(out)
    adapter, record_file = out / "adapter", out / "train.json"
    kept, dropped = fit_examples(data, _tokenizer(checkpoint), settings.max_len)
    if len(kept) == 0:
        raise ValueError(f"no example fits in max_len {settings.max_len} ({len(dropped)} dropped)")
    if record_file.exists() and (adapter / "adapter_config.json").exists():
        record = json.loads(record_file.read_text())
        if record.get("fingerprint") == _run_fingerprint(
            checkpoint, settings, kept, None, epochs, []
        ):
            say(f"{out.name}: trained before ({record_file})")
            return adapter
    say(f"{out.name}: {len(kept)} examples ({len(dropped)} dropped), {epochs} epochs")
    run = _run(checkpoint, settings, kept, None, out, epochs, [], say, callbacks, save=adapter)
    run.pop("curve")
    _write_json(record_file, run | {"examples": len(kept), "dropped": dropped})
    say(f"{out.name}: {run['steps']} steps, final loss {run['final_loss']}, adapter {adapter}")
    return adapter
