"""The LoRA trainer of the weight phase: rejection-sampling SFT on accepted model calls.

A plain PyTorch loop, not TRL's `SFTTrainer`, computing the loss TRL computes: the sum of the
token NLL over the unmasked label positions of one optimizer step divided by their count
(token-normalized across the accumulated micro batches, as transformers' Trainer does with
`num_items_in_batch`), AdamW with TRL's defaults (betas 0.9/0.999, eps 1e-8), gradient-norm
clipping, constant learning rate. Why not TRL underneath:
- the weight phase calls `train` once per step, many times per run; a Trainer is built around
  one `train()` of a fixed dataset, and rebuilding it each step re-creates its optimizer and
  scheduler (their state would have to be carried by hand) and re-runs dataset preparation;
- this loop applies the LM head to the trained (completion) positions only: on a 151k
  vocabulary the head is ~28% of a 0.5B model's compute per token. TRL 1.16's fused head
  tiles the logits, but off CUDA/XPU it scores every position, prompt included, and adds
  entropy and top-1 accuracy for its logs. (Checked at start: the fast head must give the
  model's own logits, else the model's full forward is used.);
- examples come pre-tokenized from `whale.train.data` (the tokens that were sampled), so none
  of TRL's tokenization, truncation or silent dropping of fully masked examples is wanted.
`benchmarks/rsft_throughput.py` measures this loop against TRL on the same examples.

Micro batches (`micro_batches`): the examples of a step are sorted by length (the step's gradient is
a sum, so the order inside a step does not change it) and cut into micro batches of at most
`micro_batch` examples (default 8) and `micro_tokens` padded tokens (default 1,024: a micro batch
never holds more activations than one example of that length, and the default `max_len` allows
4,096), right-padded to the longest one, with an attention mask; 1 is pad-free. Why: a forward over
a few short examples at once multiplies larger matrices, which bf16 units do much faster per row
than one short example's (on ~130-token examples of the 0.5B, 1 thread, a quiet Xeon with AMX: a
bf16 step 1.35x faster with a step's 4 examples in one forward than with one per forward, fp32
1.06x; `python -m benchmarks.rsft_throughput --model-dir <0.5B> --examples 8 --batch-size 4
[--micro-batch 1] --arms fp32,bf16 --threads 1`). Padding-free packing of several sequences into one
row needs flash-attention's varlen kernels, which CPUs do not have.

Several processes: `whale.train.launch` runs this loop under `accelerate launch` (DDP,
DeepSpeed, FSDP; each rank trains on a disjoint shard of every step, and the loss is scaled so
N processes make the update one process makes); `SFTSettings.launcher = "accelerate"` makes
the weight phase train that way, in a subprocess. One process without accelerate is this class,
unchanged.

dtype (`SFTSettings.dtype`, "auto" | "bf16" | "fp32"; `whale.train.precision`): the frozen base
weights in bf16 where the CPU has bf16 units ("auto"), the LoRA weights, their AdamW state and
the saved adapter fp32 either way; the dtype trained in is recorded in `StepStats.dtype` and
`trainer_state.json`.

Not covered: the learning-rate schedule (constant here: the caller knows how many steps a run
will take and may set `sft.lr` per trainer), gradient checkpointing, and devices other than the
CPU in this class (`whale.train.launch` moves the model where accelerate says).
"""

from __future__ import annotations

import gc
import json
import logging
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from whale.config import check_choices
from whale.records import record_dir, replace_dir
from whale.train.data import IGNORE, Example
from whale.train.precision import (
    Device,
    TrainDtype,
    keep_fp32,
    lora_in_base_dtype,
    resolve,
    torch_dtype,
)

log = logging.getLogger(__name__)

STATE_VERSION = 1
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.json"
LAUNCHERS = ("inprocess", "accelerate")


@dataclass
class LoraSettings:
    r: int = 32
    alpha: int = 64
    dropout: float = 0.0
    targets: tuple[str, ...] = (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )  # fmt: skip

    def validate(self) -> None:
        if self.r < 1 or self.alpha <= 0:
            raise ValueError("lora: r must be >= 1 and alpha > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("lora: dropout must be in [0, 1)")
        if not self.targets:
            raise ValueError("lora: targets must name at least one module")


@dataclass
class SFTSettings:
    lr: float = 1e-4
    batch_size: int = 8  # examples per optimizer step
    micro_batch: int = 8  # examples per forward pass, at most; 1 is pad-free
    micro_tokens: int = 1024  # padded tokens per forward pass (examples x longest), at most
    max_len: int = 4096
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # 0 turns clipping off
    threads: int = 2  # torch threads per process
    # Where the weight phase trains: "inprocess" (this process, LoraTrainer) or "accelerate"
    # (a subprocess `accelerate launch --config_file <accelerate_config> -m whale.train.launch`,
    # any number of processes; configs/accelerate/ has configs).
    launcher: str = "inprocess"
    accelerate_config: str | None = None  # path of an accelerate config (yaml or json)
    num_processes: int = 0  # 0: the config's num_processes; else passed to accelerate launch
    launch_timeout_s: float | None = None  # a launched step running longer is killed
    # "auto": bf16 base weights where the hardware has bf16 units, else fp32 (whale.train.precision)
    dtype: TrainDtype = "auto"

    def validate(self) -> None:
        check_choices(self)
        if self.lr <= 0:
            raise ValueError("sft: lr must be > 0")
        for name in ("batch_size", "micro_batch", "micro_tokens", "max_len", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft: {name} must be >= 1")
        if self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ValueError("sft: weight_decay and max_grad_norm must be >= 0")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"sft: launcher must be one of {LAUNCHERS}, not {self.launcher!r}")
        if self.launcher == "accelerate" and not self.accelerate_config:
            raise ValueError("sft: launcher 'accelerate' needs accelerate_config (a config path)")
        if self.launcher == "accelerate" and not Path(str(self.accelerate_config)).is_file():
            # checked when the config loads, not at the first weight step (after its rollouts
            # were paid); a relative path is the working directory's, as at launch
            raise ValueError(f"sft: accelerate_config {self.accelerate_config!r} is not a file "
                             f"(from {Path.cwd()})")  # fmt: skip
        if self.num_processes < 0:
            raise ValueError("sft: num_processes must be >= 0 (0: the config's)")
        if self.launch_timeout_s is not None and self.launch_timeout_s <= 0:
            raise ValueError("sft: launch_timeout_s must be > 0")


class EmptyTrainingSet(ValueError):
    """Nothing to train on: no example, or every label of every example is masked."""


@dataclass
class StepStats:
    examples: int
    tokens: int  # unmasked (trained) tokens
    loss: float  # token mean over the pass, each step's loss taken before its update
    optimizer_steps: int
    wall_s: float
    tokens_per_s: float
    dtype: str = "fp32"  # what the step computed in: "bf16" (base weights) or "fp32"


def trained_positions(ex: Example) -> int:
    """Label positions that count: a causal LM predicts token t from tokens < t, so the label
    of position 0 is never predicted."""
    return sum(1 for x in ex.labels[1:] if x != IGNORE)


def usable_examples(examples: Sequence[Example], max_len: int) -> list[Example]:
    """The examples a step trains on: every example checked (ids and labels non-empty and of one
    length, at most `max_len` tokens: else ValueError), those with every label masked left out
    (EmptyTrainingSet when none is left)."""
    if not examples:
        raise EmptyTrainingSet("no training examples (every call skipped, or none given)")
    out = []
    for e in examples:
        if len(e.input_ids) != len(e.labels) or not e.input_ids:
            raise ValueError(f"{e.source}: input_ids and labels must be non-empty and equal")
        if len(e.input_ids) > max_len:
            raise ValueError(
                f"{e.source}: {len(e.input_ids)} tokens is over max_len {max_len}"
            )
        if trained_positions(e) > 0:
            out.append(e)
    if not out:
        raise EmptyTrainingSet(
            f"every label of all {len(examples)} examples is masked: nothing to train on"
        )
    if len(out) < len(examples):
        log.warning("%d of %d examples have every label masked: left out",
                    len(examples) - len(out), len(examples))  # fmt: skip
    return out


def micro_batches(step: Sequence[Example], most: int, tokens: int) -> list[list[Example]]:
    """The micro batches of one optimizer step: its examples sorted by length (the step's
    gradient is a sum, so the order inside a step does not change it), cut greedily so that each
    holds at most `most` examples and at most `tokens` padded tokens (examples x the longest);
    an example longer than `tokens` is a micro batch alone. `most` 1: one example each, in the
    step's order (pad-free)."""
    if most == 1:
        return [[e] for e in step]
    out: list[list[Example]] = []
    for e in sorted(step, key=lambda e: len(e.input_ids)):
        if not out or len(out[-1]) >= most or (len(out[-1]) + 1) * len(e.input_ids) > tokens:
            out.append([])
        out[-1].append(e)
    return out


class LoraTrainer:
    """A LoRA adapter on a base checkpoint, with its AdamW state, kept in memory across
    `train` calls. `adapter` resumes from a directory written by `save` (weights, optimizer
    state, pass count: a resumed trainer continues as the saved one would have). `device`:
    where "auto" looks for bf16 units (this class trains on the CPU; a subclass may move it)."""

    def __init__(
        self,
        base_dir: Path,
        lora: LoraSettings,
        sft: SFTSettings,
        seed: int,
        adapter: Path | None = None,
        device: Device = "cpu",
    ) -> None:
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM

        lora.validate()
        sft.validate()
        self.base_dir, self.lora, self.sft, self.seed = Path(base_dir), lora, sft, seed
        self.passes = 0
        self.optimizer_steps = 0
        torch.set_num_threads(sft.threads)
        torch.manual_seed(seed)
        self.dtype = resolve(sft.dtype, device)
        state: dict[str, Any] | None = None
        if adapter is not None:
            adapter = Path(adapter)
            state = json.loads((adapter / STATE_FILE).read_text())
            if state.get("version") != STATE_VERSION:
                raise ValueError(f"{adapter}: trainer state version {state.get('version')!r}")
            # A resumed trainer continues in the dtype the saved one trained in (fp32 before
            # the setting existed): "auto" follows it; a dtype named in sft.dtype is obeyed.
            was = state.get("dtype", "fp32")
            if sft.dtype == "auto":
                self.dtype = was
            elif was != self.dtype:
                log.warning("%s was trained in %s; sft.dtype %s continues it in %s", adapter,
                            was, self.dtype, self.dtype)  # fmt: skip
        base = AutoModelForCausalLM.from_pretrained(self.base_dir, dtype=torch_dtype(self.dtype))
        if adapter is not None and state is not None:
            saved = state["lora"]
            saved["targets"] = tuple(saved["targets"])
            if saved != asdict(lora) | {"targets": tuple(lora.targets)}:
                raise ValueError(f"{adapter} was trained with LoRA {saved}, not {asdict(lora)}")
            self.model = PeftModel.from_pretrained(base, str(adapter), is_trainable=True)
        else:
            config = LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                target_modules=list(lora.targets), task_type="CAUSAL_LM",
            )  # fmt: skip
            self.model = get_peft_model(base, config)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        keep_fp32(self.params)  # PEFT's default already; the saved adapter's format depends on it
        if self.dtype == "bf16":
            lora_in_base_dtype(self.model)
        self.optimizer = torch.optim.AdamW(
            self.params, lr=sft.lr, weight_decay=sft.weight_decay, betas=(0.9, 0.999), eps=1e-8
        )
        if adapter is not None and state is not None:
            if (adapter / OPTIMIZER_FILE).is_file() or state.get("optimizer", True):
                saved_opt = torch.load(adapter / OPTIMIZER_FILE, weights_only=True)
                self.optimizer.load_state_dict(saved_opt["optimizer"])
                torch.set_rng_state(saved_opt["torch_rng"])
            else:  # saved by a sharded (ZeRO / FSDP) launch: see whale.train.launch
                log.warning("%s has no optimizer state: AdamW starts afresh", adapter)
            for group in self.optimizer.param_groups:  # the settings given now win
                group["lr"], group["weight_decay"] = sft.lr, sft.weight_decay
            self.passes = int(state["passes"])
            self.optimizer_steps = int(state["optimizer_steps"])
        causal: Any = self.model.get_base_model()
        self._decoder: Any = causal.get_decoder()
        self._head: Any = causal.get_output_embeddings()
        self._fast_head = self._head is not None and self._fast_head_matches()

    # -- the loss --------------------------------------------------------------------------
    def _fast_head_matches(self) -> bool:
        """Whether logits == head(decoder's last hidden state) for this model (no softcapping
        or scaling in between), checked once on a short sequence."""
        import torch

        vocab = int(self._head.weight.shape[0])
        ids = torch.arange(7).remainder(vocab)[None]
        self.model.eval()
        with torch.no_grad():
            full = self.model(input_ids=ids).logits[0]
            fast = self._head(self._decoder(input_ids=ids).last_hidden_state)[0]
        ok = bool(torch.allclose(full.float(), fast.float(), atol=1e-4, rtol=1e-4))
        if not ok:
            log.warning("%s: logits are not head(hidden): using full logits", self.base_dir)
        return ok

    def _nll_sum(self, batch: Sequence[Example]) -> Any:
        """Summed token NLL over the trained positions of one micro batch (a 0-d tensor)."""
        return self._nll_of(*self._tensors(batch))

    def _tensors(self, batch: Sequence[Example]) -> tuple[Any, Any, Any]:
        """(input ids, labels, attention mask or None) of a micro batch, right-padded."""
        import torch

        width = max(len(e.input_ids) for e in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, e in enumerate(batch):
            n = len(e.input_ids)
            ids[i, :n] = torch.tensor(e.input_ids)
            labels[i, :n] = torch.tensor(e.labels)
            mask[i, :n] = 1
        return ids, labels, (None if len(batch) == 1 else mask)

    def _nll_of(self, ids: Any, labels: Any, attention: Any) -> Any:
        import torch.nn.functional as F

        targets = labels[:, 1:]
        keep = targets != IGNORE
        if self._fast_head:
            hidden = self._decoder(input_ids=ids, attention_mask=attention).last_hidden_state
            logits = self._head(hidden[:, :-1][keep])
        else:
            logits = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1][keep]
        return F.cross_entropy(logits.float(), targets[keep], reduction="sum")

    def _usable(self, examples: Sequence[Example]) -> list[Example]:
        if self.model is None:
            raise RuntimeError("trainer is closed")
        return usable_examples(examples, self.sft.max_len)

    def _micro_batches(self, step: list[Example]) -> list[list[Example]]:
        return micro_batches(step, self.sft.micro_batch, self.sft.micro_tokens)

    # -- public ----------------------------------------------------------------------------
    def train(self, examples: Sequence[Example]) -> StepStats:
        """One pass over `examples` in a seeded shuffle (seed and pass number), one optimizer
        step per `batch_size` examples (the last step may have fewer)."""
        import torch

        usable = self._usable(examples)
        t0 = time.monotonic()
        order = list(range(len(usable)))
        random.Random(f"{self.seed}/{self.passes}").shuffle(order)
        self.model.train()
        total_nll, total_tokens, steps = 0.0, 0, 0
        bs = self.sft.batch_size
        for start in range(0, len(order), bs):
            step = [usable[i] for i in order[start : start + bs]]
            tokens = sum(trained_positions(e) for e in step)
            self.optimizer.zero_grad(set_to_none=True)
            for mb in self._micro_batches(step):
                nll = self._nll_sum(mb)
                (nll / tokens).backward()
                total_nll += float(nll.detach())
            if self.sft.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(self.params, self.sft.max_grad_norm)
            self.optimizer.step()
            total_tokens += tokens
            steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.passes += 1
        self.optimizer_steps += steps
        wall = time.monotonic() - t0
        return StepStats(
            examples=len(usable),
            tokens=total_tokens,
            loss=total_nll / total_tokens,
            optimizer_steps=steps,
            wall_s=wall,
            tokens_per_s=total_tokens / wall if wall > 0 else 0.0,
            dtype=self.dtype,
        )

    def loss(self, examples: Sequence[Example]) -> float:
        """Token-mean NLL over the trained positions of `examples`, with no gradient and no
        dropout."""
        import torch

        usable = self._usable(examples)
        self.model.eval()
        total, tokens = 0.0, 0
        with torch.no_grad():
            for mb in self._micro_batches(list(usable)):
                total += float(self._nll_sum(mb))
                tokens += sum(trained_positions(e) for e in mb)
        return total / tokens

    def save(self, out: Path) -> Path:
        """Write the adapter (PEFT `save_pretrained`), `optimizer.pt` and `trainer_state.json`
        to `out.tmp`, then move it to `out`. A crash leaves either the old `out` or the new one
        (a crash between the two renames leaves `out.old` and `out`'s content in `out.tmp`)."""
        return self._save(out)

    def _save(self, out: Path, weights: dict[str, Any] | None = None,
              optimizer: dict[str, Any] | None = None) -> Path:  # fmt: skip
        """`save`, with the adapter weights from `weights` (a state dict of the PEFT model; the
        model's own when None) and the optimizer state `optimizer` (this optimizer's when None;
        `{}` writes none: a sharded launch's state is not in one process)."""
        import torch

        if self.model is None:
            raise RuntimeError("trainer is closed")
        out = Path(out)
        record_dir(out.parent)  # never through a linked folder (whale.records)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(str(tmp), state_dict=weights)
        opt = self.optimizer.state_dict() if optimizer is None else optimizer
        if opt:
            torch.save({"optimizer": opt, "torch_rng": torch.get_rng_state()}, tmp / OPTIMIZER_FILE)
        state = {
            "version": STATE_VERSION,
            "base_dir": str(self.base_dir),
            "seed": self.seed,
            "passes": self.passes,
            "optimizer_steps": self.optimizer_steps,
            "optimizer": bool(opt),
            "lora": asdict(self.lora) | {"targets": list(self.lora.targets)},
            "sft": asdict(self.sft),
            "dtype": self.dtype,  # what the base computed in ("auto" resolved)
        }
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        replace_dir(tmp, out)
        return out

    def close(self) -> None:
        """Drop the model and optimizer (their memory is freed); later calls raise."""
        self.model = None  # type: ignore[assignment]
        self.optimizer = None  # type: ignore[assignment]
        self.params = []
        self._decoder = self._head = None
        gc.collect()
