"""Proposer GRPO (Harness Learning, Table 7) on TRL's `GRPOTrainer`, with resume and timings.

The paper: G = 8 samples per context, 40 contexts per update, 16 updates, one update per
sampled batch, lr 1e-6, no KL, no entropy bonus, the clipped surrogate with group-normalized
advantages. On TRL 1.16:
- one generation batch = one optimizer update (`steps_per_generation` = gradient accumulation
  = contexts × G / micro_batch, `num_iterations` 1): on-policy, so TRL skips the old log-probs,
  the ratio is exactly 1 and the clip never binds (the plain policy gradient of the surrogate);
- `loss_type="grpo"`: token losses averaged over each completion's own length, then over the
  completions (DeepSeekMath's 1/G Σ_i 1/|o_i| Σ_t). TRL's default `dapo` (and `bnpo`) divide
  by the batch's token count, `dr_grpo` by a constant: not the paper's per-sequence weight;
- `scale_rewards="group"`: A_i = (r_i − mean) / (std + 1e-4), std Bessel-corrected; TRL's
  entropy bonus off (`entropy_coef=0`, not adaptive), `top_entropy_quantile=1` (every token);
- a constant lr (TRL would decay it linearly to 0 over the 16 updates), gradient-norm clipping
  at 1 (transformers' default), TRL's `bf16` (autocast, its config's default) off: `dtype`
  (`whale.train.precision`) loads the base weights in bf16 where the hardware has bf16 units
  ("auto"; the LoRA weights and the saved adapters stay fp32), else fp32. "trl" generation
  samples with the same bf16 weights. The dtype trained in is in `grpo_run.json`, so a run is
  not resumed in the other one.
TRL's sampler drops a partial batch (a pool smaller than `contexts_per_update` would give no
update): `update_schedule` lays out every update's contexts (seeded permutations of the pool,
cycled) and TRL reads them in order. Prompts over `max_prompt` tokens are left out.

Generation "trl": TRL samples with the policy in process (trained tokens = sampled tokens).
"embedded": a `rollout_func` saves the current adapter to `out/serving/step_N`, `serve()`s it
(llama.cpp + LoRA GGUF) and samples G completions per context, seeded by (seed, update,
index), decoded as the run's `Decoding` says (`grammar` "on": each context's parent's edit
grammar, the very grammar `evaluate` decodes under; "off", the default: free, as the paper
samples). "trl" and "vllm" take no GBNF grammar (TRL's in-process generate has none; a vLLM
server ignores llama.cpp's `grammar` field), so `grammar` "on" is refused with them. Ids are
rebuilt: the chat template with the generation prompt; the text's
encoding, plus the end-of-turn id when the model stopped. Where the server's
`completion_tokens` disagrees (llama.cpp does not count the end-of-turn token; one more is
accepted on a stop) the rebuild is not what was sampled: the completion keeps its reward (the
group baseline) but is masked out of the loss and counted in `token_mismatches`. So the loss
is exact only where they agree, and only as far as the GGUF (quantized base, f16 adapter)
samples like the fp32 policy. Ids a backend returns (vLLM) are used as they are when each
is a token of the trainer's tokenizer (else the text is rebuilt as above), and a completion
whose prompt the backend tokenized otherwise than the local chat template is masked out. Logprobs:
`None` (TRL 1.16 reads them only for vLLM importance sampling and off-policy masking, off).
"vllm": the same rollouts on a running vLLM server (`vllm_url`, started with `--enable-lora
--max-lora-rank R` >= the LoRA rank and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, serving the
same base checkpoint, on this machine or a shared disk): each update's adapter is loaded at
run time (`VLLMServing`, the previous one unloaded), and the completion ids trained on are the
ones vLLM returns (`return_token_ids`), so no rebuild; its prompt ids are checked against the
local template (a disagreement is a mismatch). Not TRL's
`use_vllm=True, vllm_mode="server"`: that syncs the full weights over NCCL, and TRL 1.16's
`VLLMClient.init_communicator` raises NotImplementedError on a non-CUDA device (and needs
vllm importable in the trainer's venv); loading the adapter is what a LoRA run needs anyway.

`out`: `checkpoints/checkpoint-N` (TRL's, after every update, the latest kept), `updates.jsonl`
(a row per update, once its checkpoint is complete), `adapter/` (final), `grpo_run.json` (what
a resume must match). A killed run resumes from the last complete checkpoint: no finished
update is redone or lost. Timings: `generation_s` (in `_generate`: rollout, serving),
`reward_s` (in the reward call), `gradient_s` (the rest: forward, backward, optimizer; not the
checkpoint save). Not covered: several processes (accelerate), evaluation, tool calls.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.config import check_choices
from whale.models.base import MAX_TEMPERATURE
from whale.records import JsonlWriter, record_dir
from whale.train.data import template_ids
from whale.train.precision import TrainDtype, keep_fp32, lora_in_base_dtype, resolve, torch_dtype
from whale.train.proposer.grpo_rollout import Clock, make_rollout
from whale.train.sft import LoraSettings

if TYPE_CHECKING:
    from whale.train.proposer.contexts import Decoding
    from whale.train.serving import SolverServing

RewardFn = Callable[[Sequence[str], Sequence[str]], list[float]]
GENERATIONS = ("trl", "embedded", "vllm")
# Where the rollouts run and how often a timed-out one is asked again, not what is trained:
# a resume may change them, and a run saved before one existed resumes.
_WHERE = ("vllm_url", "vllm_model", "generation_retries")
ROWS_FILE = "updates.jsonl"
RUN_FILE = "grpo_run.json"
UPDATE_FILE = "whale_update.json"  # the row of an update, kept inside its checkpoint
_STATE = "trainer_state.json"  # written last into a TRL checkpoint: marks it complete


def _messages(msg: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": msg}]


@dataclass
class GRPOSettings:
    lora: LoraSettings = field(default_factory=LoraSettings)  # used when no init adapter
    g: int = 8
    contexts_per_update: int = 40
    updates: int = 16
    lr: float = 1e-6
    beta: float = 0.0
    epsilon: float = 0.2
    temperature: float = 1.0
    max_completion: int = 1024
    max_prompt: int = 6144
    micro_batch: int = 1  # completions per forward/backward
    # "trl" (in-process generate) | "embedded" (llama.cpp + adapter) | "vllm" (a vLLM server)
    generation: str = "trl"
    vllm_url: str = ""  # "vllm": the server's OpenAI base, http://host:port/v1
    vllm_model: str = ""  # "vllm": its served base model name ("": the first it lists)
    threads: int = 2
    seed: int = 0
    gradient_checkpointing: bool = True  # TRL's default: memory for compute (~30% more)
    concurrency: int = 4  # requests in flight to the served model ("embedded")
    # A sample whose call gets no reply in the server's time is asked again, with its seed (so
    # the same sample), this many times before the update fails: one slow call on a busy
    # machine should not cost the update's other samples. Connection and other errors are
    # not retried here (the client already retries those).
    generation_retries: int = 1
    dtype: TrainDtype = "auto"  # bf16 base weights where the hardware has bf16 units

    def validate(self) -> None:
        check_choices(self)
        self.lora.validate()
        for name in ("g", "contexts_per_update", "updates", "max_completion", "max_prompt",
                     "micro_batch", "threads", "concurrency"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"grpo: {name} must be >= 1")
        if self.generation_retries < 0:
            raise ValueError("grpo: generation_retries must be >= 0")
        checks = [
            (self.g >= 2, "g must be >= 2 (advantages are relative to the group)"),
            ((self.contexts_per_update * self.g) % self.micro_batch == 0,
             "micro_batch must divide contexts_per_update * g"),
            (self.lr > 0 and 0 < self.temperature <= MAX_TEMPERATURE,
             f"lr must be > 0 and temperature in (0, {MAX_TEMPERATURE}]"),
            (self.beta >= 0 and 0 < self.epsilon < 1, "beta must be >= 0, epsilon in (0, 1)"),
            (self.generation in GENERATIONS, f"generation must be one of {GENERATIONS}"),
            (self.generation != "vllm" or self.vllm_url.startswith(("http://", "https://")),
             f"generation 'vllm' needs vllm_url, http(s)://host:port/v1 (got {self.vllm_url!r})"),
        ]  # fmt: skip
        for ok, why in checks:
            if not ok:
                raise ValueError(f"grpo: {why}")


@dataclass
class UpdateStats:
    update: int  # 1-based
    generation_s: float
    reward_s: float
    gradient_s: float
    reward_mean: float
    reward_std: float  # population std over the update's completions
    rewards: list[float]  # in the order the reward function returned them
    completion_tokens: int  # completion ids trained on (end-of-turn ids included)
    serve_s: float = 0.0  # part of generation_s: save + serve the adapter ("embedded")
    token_mismatches: int = 0  # rebuilt ids disagreeing with the server's count: masked out
    grad_norm: float | None = None  # before clipping, as TRL logs it
    generation_retries: int = 0  # samples asked again after a timeout (generation_retries)


def update_schedule(
    prompts: Sequence[tuple[str, str]], contexts_per_update: int, updates: int, seed: int
) -> list[list[tuple[str, str]]]:
    """The contexts of each update: seeded permutations of `prompts`, one after the other, cut
    into updates (a pool smaller than an update repeats contexts inside it)."""
    if not prompts:
        raise ValueError("grpo: no prompts")
    c, pool = contexts_per_update, list(prompts)
    epochs = -(-c * updates // len(pool))
    flat = [p for e in range(epochs) for p in random.Random(f"{seed}/{e}").sample(pool, len(pool))]
    return [flat[u * c : (u + 1) * c] for u in range(updates)]


# -- the run directory -------------------------------------------------------------------------
def _read_rows(path: Path) -> list[UpdateStats]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [UpdateStats(**json.loads(x)) for x in lines if x.strip()]


def _write_rows(path: Path, rows: list[UpdateStats]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    os.replace(tmp, path)


def _last_checkpoint(ckdir: Path) -> Path | None:
    """The complete checkpoint with the most updates; incomplete ones (a kill while saving)
    are removed."""
    found: list[tuple[int, Path]] = []
    for d in ckdir.glob("checkpoint-*") if ckdir.is_dir() else []:
        if (d / _STATE).is_file():
            found.append((int(d.name.split("-")[-1]), d))
        else:
            shutil.rmtree(d, ignore_errors=True)
    return max(found)[1] if found else None


def _restore_rows(out: Path, resume: Path | None) -> list[UpdateStats]:
    """The rows of the updates the checkpoint holds: later ones dropped, the checkpoint's own
    row put back if a kill came between the checkpoint and its row."""
    done = int(resume.name.split("-")[-1]) if resume is not None else 0
    rows = [r for r in _read_rows(out / ROWS_FILE) if r.update <= done]
    saved = resume / UPDATE_FILE if resume is not None else None
    if saved is not None and saved.is_file() and (not rows or rows[-1].update < done):
        rows.append(UpdateStats(**json.loads(saved.read_text())))
    _write_rows(out / ROWS_FILE, rows)
    return rows


def run_identity(settings: GRPOSettings, dtype: str, checkpoint: Path,
                 init_adapter: Path | None, prompts: Sequence[tuple[str, str]],
                 grammars: Mapping[str, str] | None) -> dict[str, Any]:  # fmt: skip
    """What `grpo_run.json` holds and a resume must match: every setting but `_WHERE`'s, the
    dtype resolved ("auto" is bf16 on one machine, fp32 on another), base, init adapter,
    prompts, and the grammars when on (a run made before the setting sampled without one)."""
    run = {
        "settings": {k: v for k, v in json.loads(json.dumps(asdict(settings))).items()
                     if k not in (*_WHERE, "dtype")},  # fmt: skip
        "dtype": dtype,
        "checkpoint": str(Path(checkpoint).resolve()),
        "init_adapter": str(Path(init_adapter).resolve()) if init_adapter else None,
        "prompts": hashlib.sha256(json.dumps(list(prompts)).encode()).hexdigest()[:16],
    }
    if grammars:
        run["grammars"] = hashlib.sha256(json.dumps(sorted(grammars.items())).encode()
                                         ).hexdigest()[:16]  # fmt: skip
    return run


def _check_run(out: Path, run: dict[str, Any]) -> None:
    """A resumed run must be the same run: settings, base, init adapter, prompts and the
    dtype trained in (a run made before the setting existed trained in fp32). `_WHERE`'s
    settings are compared on neither side: a run started at 4778e66 recorded
    `generation_retries`, which a resume may change."""
    path = out / RUN_FILE
    saved = json.loads(path.read_text()) if path.exists() else run
    saved.setdefault("dtype", "fp32")
    if isinstance(saved.get("settings"), dict):  # a where-field a run recorded (4778e66's)
        saved["settings"] = {k: v for k, v in saved["settings"].items() if k not in _WHERE}
    if saved != run:
        diff = sorted(k for k in run if saved.get(k) != run[k])
        raise ValueError(f"{out} holds a different GRPO run (differs in {diff})")
    path.write_text(json.dumps(run, indent=1))


# -- TRL pieces, built on first use (heavy imports) -----------------------------------------
@functools.cache
def _classes() -> tuple[Any, Any]:
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    class Trainer(GRPOTrainer):  # type: ignore[misc]
        whale_clock: Clock

        def _generate(self, prompts: list[Any]) -> Any:
            t0 = time.monotonic()
            try:
                return super()._generate(prompts)
            finally:
                self.whale_clock.generation_s += time.monotonic() - t0

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            # The sampler repeats each generation batch once per accumulation step and TRL
            # reads only the first copy: keep one (a copy is contexts × G decoded prompts).
            first, count = None, 0
            for batch in itertools.islice(epoch_iterator, num_batches):
                first, count = batch if first is None else first, count + 1
            samples = [first] * count
            return samples, self._get_num_items_in_batch(samples, device)

    class Recorder(TrainerCallback):  # type: ignore[misc]
        def __init__(self, clock: Clock, out: Path, total: int, say: Callable[[str], Any]):
            self.clock, self.out, self.total, self.say = clock, out, total, say

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.clock.start = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.clock.end = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "grad_norm" in logs:
                self.clock.grad_norm = float(logs["grad_norm"])

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            c, n = self.clock, int(state.global_step)
            wall = c.end - c.start
            row = UpdateStats(
                update=n, generation_s=c.generation_s, reward_s=c.reward_s,
                gradient_s=max(0.0, wall - c.generation_s - c.reward_s),
                reward_mean=statistics.fmean(c.rewards) if c.rewards else math.nan,
                reward_std=statistics.pstdev(c.rewards) if c.rewards else math.nan,
                rewards=list(c.rewards), completion_tokens=c.completion_tokens,
                serve_s=c.serve_s, token_mismatches=c.mismatches, grad_norm=c.grad_norm,
                generation_retries=c.retries,
            )  # fmt: skip
            text = json.dumps(asdict(row))
            (Path(args.output_dir) / f"checkpoint-{n}" / UPDATE_FILE).write_text(text)
            rows_f = JsonlWriter(self.out / ROWS_FILE)  # never through a link (whale.records)
            try:
                rows_f.write(asdict(row))
            finally:
                rows_f.close()
            self.clock.reset()
            self.say(f"grpo update {n}/{self.total}: reward {row.reward_mean:.3f} ± "
                     f"{row.reward_std:.3f}; generation {row.generation_s:.1f}s, reward "
                     f"{row.reward_s:.1f}s, gradient {row.gradient_s:.1f}s, "
                     f"{row.token_mismatches} token mismatches"
                     + (f", {row.generation_retries} samples asked again after a timeout"
                        if row.generation_retries else ""))  # fmt: skip

    return Trainer, Recorder


def _reward_func(reward: RewardFn, clock: Clock) -> Callable[..., list[float]]:
    def proposer_reward(
        prompts: Any, completions: Any, completion_ids: Any, context: Any, **kw: Any
    ) -> list[float]:
        texts = kw.get("whale_text") or [
            c[-1]["content"] if isinstance(c, list) else c for c in completions
        ]
        t0 = time.monotonic()
        values = [float(x) for x in reward(list(context), list(texts))]
        clock.reward_s += time.monotonic() - t0
        if len(values) != len(texts) or not all(math.isfinite(x) for x in values):
            raise ValueError(f"reward: {len(values)} values for {len(texts)} completions, "
                             "each must be a finite number")  # fmt: skip
        clock.rewards = values
        clock.completion_tokens = sum(len(ids) for ids in completion_ids)
        return values

    return proposer_reward


def train_grpo(
    prompts: Sequence[tuple[str, str]],
    reward: RewardFn,
    checkpoint: Path,
    settings: GRPOSettings,
    out: Path,
    init_adapter: Path | None = None,
    serving: SolverServing | None = None,
    say: Callable[[str], Any] = print,
    decoding: Decoding | None = None,
    parents: Mapping[str, str] | None = None,
) -> tuple[Path, list[UpdateStats]]:
    """GRPO on (context id, proposer message) pairs; `reward(context ids, texts)` is called
    once per update with contexts × g completions. Returns the final adapter (`out/adapter`)
    and the stats of every update. A run directory with a checkpoint resumes from it.
    `decoding` (default: free) decodes the samples; with its grammar on, `parents` (context
    id -> the parent harness's source) gives each context's grammar."""
    settings.validate()
    grammars = _grammars(prompts, settings, decoding, parents or {})
    if settings.generation == "embedded" and serving is None:
        raise ValueError("grpo: generation 'embedded' needs a SolverServing")
    if settings.generation == "vllm" and serving is None:
        from whale.train.serving import VLLMServing

        serving = VLLMServing(settings.vllm_url, settings.vllm_model or None, timeout_s=600.0)
        try:
            return _train(prompts, reward, checkpoint, settings, out, init_adapter, serving, say,
                          grammars)  # fmt: skip
        finally:
            serving.close()
    return _train(prompts, reward, checkpoint, settings, out, init_adapter, serving, say,
                  grammars)  # fmt: skip


def _grammars(prompts: Sequence[tuple[str, str]], settings: GRPOSettings,
              decoding: Decoding | None,
              parents: Mapping[str, str]) -> dict[str, str] | None:  # fmt: skip
    """Each prompt message's grammar when `decoding` has the grammar on, else None."""
    if decoding is None or decoding.grammar == "off":
        return None
    if settings.generation != "embedded":
        raise ValueError(f"grpo: decoding.grammar 'on' needs generation 'embedded' (a llama.cpp "
                         f"server takes the edit grammar); {settings.generation!r} takes none")
    missing = sorted({cid for cid, _ in prompts if cid not in parents})
    if missing:
        raise ValueError(f"grpo: the grammar needs each context's parent; none for {missing[:3]}")
    out: dict[str, str] = {}
    for cid, msg in prompts:
        g = decoding.grammar_for(parents[cid])
        assert g is not None
        out[msg] = g
    return out


def _train(
    prompts: Sequence[tuple[str, str]],
    reward: RewardFn,
    checkpoint: Path,
    settings: GRPOSettings,
    out: Path,
    init_adapter: Path | None,
    serving: SolverServing | None,
    say: Callable[[str], Any],
    grammars: dict[str, str] | None = None,
) -> tuple[Path, list[UpdateStats]]:
    if not prompts:
        raise ValueError("grpo: no prompts")
    out, checkpoint = Path(out), Path(checkpoint)
    record_dir(out)  # never a link (whale.records)
    dtype = resolve(settings.dtype)  # on CUDA where there is a device, as TRL trains
    _check_run(out, run_identity(settings, dtype, checkpoint, init_adapter, prompts, grammars))
    ckdir, final = out / "checkpoints", out / "adapter"
    resume = _last_checkpoint(ckdir)
    rows = _restore_rows(out, resume)
    if len(rows) >= settings.updates and (final / "adapter_config.json").is_file():
        return final, rows
    if resume is not None:
        say(f"grpo: resuming after update {resume.name.split('-')[-1]} of {settings.updates}")

    import torch
    from datasets import Dataset
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig

    torch.set_num_threads(settings.threads)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, padding_side="left")
    cap = settings.max_prompt
    kept = [p for p in prompts if len(template_ids(tokenizer, _messages(p[1]))) <= cap]
    if len(kept) < len(prompts):
        say(f"grpo: {len(prompts) - len(kept)} of {len(prompts)} prompts are over "
            f"{settings.max_prompt} tokens: left out")  # fmt: skip
    if not kept:
        raise ValueError(f"grpo: every prompt is over max_prompt {settings.max_prompt} tokens")
    plan = update_schedule(kept, settings.contexts_per_update, settings.updates, settings.seed)
    dataset = Dataset.from_list(
        [{"prompt": _messages(msg), "context": cid} for update in plan for cid, msg in update]
    )
    model: Any = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch_dtype(dtype))
    peft_config = None
    if init_adapter is not None:
        model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    else:
        lora = settings.lora
        peft_config = LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.targets), task_type="CAUSAL_LM",
        )  # fmt: skip
    steps = settings.contexts_per_update * settings.g // settings.micro_batch
    config = GRPOConfig(
        output_dir=str(ckdir), seed=settings.seed, use_cpu=not torch.cuda.is_available(),
        num_generations=settings.g, beta=settings.beta, epsilon=settings.epsilon, loss_type="grpo",
        scale_rewards="group", num_iterations=1, entropy_coef=0.0, use_adaptive_entropy=False,
        top_entropy_quantile=1.0, learning_rate=settings.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, bf16=False, fp16=False,
        per_device_train_batch_size=settings.micro_batch, gradient_accumulation_steps=steps,
        steps_per_generation=steps, max_steps=settings.updates, save_strategy="steps",
        save_steps=1, save_total_limit=1, temperature=settings.temperature, top_p=1.0, top_k=0,
        max_completion_length=settings.max_completion, mask_truncated_completions=False,
        shuffle_dataset=False, gradient_checkpointing=settings.gradient_checkpointing,
        logging_steps=1, report_to=[], disable_tqdm=True, remove_unused_columns=False,
    )  # fmt: skip
    clock = Clock()
    trainer_cls, recorder_cls = _classes()
    rollout = None
    if serving is not None and settings.generation in ("embedded", "vllm"):
        rollout = make_rollout(serving, settings, out, tokenizer, clock, grammars)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*rollout_func.*experimental")
        trainer = trainer_cls(
            model=model, reward_funcs=[_reward_func(reward, clock)], args=config,
            train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
            callbacks=[recorder_cls(clock, out, settings.updates, say)], rollout_func=rollout,
        )  # fmt: skip
    trainer.whale_clock = clock
    keep_fp32(p for p in trainer.model.parameters() if p.requires_grad)
    if dtype == "bf16":
        lora_in_base_dtype(trainer.model)
    trainer.remove_callback(PrinterCallback)  # TRL's metric dicts on stdout: `say` reports
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    tmp = out / "adapter.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.accelerator.unwrap_model(trainer.model).save_pretrained(str(tmp))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final, _read_rows(out / ROWS_FILE)
