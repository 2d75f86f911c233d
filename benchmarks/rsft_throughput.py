"""Training tokens/s of `LoraTrainer.train` in bf16 and fp32, and against plain TRL
`SFTTrainer`, on the same examples.

Both train one pass over the SAME pre-tokenized examples (chat prompts masked, loss on the
completion tokens: TRL gets `input_ids` + `completion_mask` with `completion_only_loss=True`)
with the same LoRA config (r, alpha, dropout, all attention and MLP projections), batch size
(examples per optimizer step, as micro batches x gradient accumulation), learning rate
(constant), AdamW, grad clipping and fp32. TRL's own defaults that would make the two differ in
kind are turned off: gradient checkpointing (TRL's default is on; `LoraTrainer` has none), bf16
(TRL's default), truncation at 1024 tokens. Only the pass itself is timed (TRL: its
`train_runtime`, the Trainer's clock of its loop; ours: `StepStats.wall_s`), not model loading,
optimizer creation or TRL's dataset preparation; tokens/s counts the trained (completion) tokens,
the same number for both. Runs alternate (ours, TRL, TRL, ours, ...) and each side keeps its
fastest run, so drift on a shared machine hits both alike.

    python -m benchmarks.rsft_throughput [--model-dir DIR] [--examples N | --steps N] [--tiny]
        [--arms fp32,bf16,trl] [--profile] [--words PROMPT,COMPLETION]

Arms (`--arms`, run in turn, the order reversed every repeat): `fp32` and `bf16` are
`LoraTrainer` with `sft.dtype` "fp32" / "bf16" (bf16 = frozen base weights in bf16, LoRA
weights fp32: whale.train.precision); `autocast` (fp32 weights under
`torch.autocast("cpu", bfloat16)`) and `bf16-autocast` (bf16 weights under autocast) are the
alternatives the choice was measured against (before `lora_in_base_dtype`: since, both bf16 arms
compute the LoRA path in bf16, so the figures quoted for them in whale.train.precision describe
the arms as they were); `trl` is TRL's `SFTTrainer` in fp32. Printed: per
arm the best wall time of the pass (all of it is gradient steps: forward, backward, AdamW) and
the best CPU time of this process over it (steadier than wall time on a shared machine), the
pass's loss and the loss after the pass (`LoraTrainer.loss`, no dropout, in the arm's dtype);
then each arm's ratio of step time to fp32's and its loss difference to fp32's after the N
optimizer steps. Target (issue 25): the gradient step >= 2.5x faster in bf16 on a CPU with bf16
units. First, the ceiling: GFLOP/s (CPU time, best of 7) of the model's largest linear layer
(hidden x intermediate) on as many tokens as the median example, forward and the backward's
input gradient, fp32 and bf16. `--profile`: then one optimizer step of each LoraTrainer arm
under torch's profiler, the ops that took the most CPU time (which part of the step dominates).
`--attention`: first, torch's SDPA forward + backward at 129 to 1,500 keys in fp32 and bf16 (why
a bf16 step computes attention on few keys in fp32: whale.train.precision).

Default (`--tiny`, or no `--model-dir`): the tiny test tokenizer (tests/tiny.py) with a
moderately larger random Qwen2 (hidden 256, 4 layers, intermediate 704: ~3 M parameters; the
2-layer hidden-64 test model takes ~1 ms a step, so timings would measure Python overhead
only). `--model-dir` takes a real HF checkpoint, e.g. ~/.cache/whale/models/qwen-coder-0.5b-hf,
with `--examples 16`. Target (issue): ratio ours / TRL >= 0.9.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from whale.train.data import IGNORE, Example, end_of_turn_id, template_ids
from whale.train.sft import LoraSettings, LoraTrainer, SFTSettings, trained_positions

WORDS = (
    "the quick brown fox jumps over a lazy dog while a careful student adds numbers and checks "
    "every answer twice before writing it down in the notebook what is the sum of two and three "
    "it is five please think step by step then give the answer as a single number at the end "
    "def add x y return x plus y print add 3 4 for i in range 10 if i is even total"
).split()


def make_bench_model(out: Path) -> Path:
    """The tiny test tokenizer with a larger random Qwen2 (see module docstring)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from tests.tiny import make_tiny_model

    make_tiny_model(out)
    tok = AutoTokenizer.from_pretrained(out)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=256, intermediate_size=704, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=end_of_turn_id(tok),
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    Qwen2ForCausalLM(config).to(torch.float32).save_pretrained(out)
    return out


def make_examples(tok, n: int, seed: int = 0,  # noqa: ANN001
                  words: tuple[int, int] | None = None) -> list[Example]:  # fmt: skip
    """`n` chat examples: system + user prompt of 30-90 words, completion of 15-60 words; or, with
    `words` (prompt, completion), exactly that many words each (a word is 1-2 tokens)."""
    rng = random.Random(seed)
    eot = end_of_turn_id(tok)
    out = []
    for i in range(n):
        question = " ".join(rng.choices(WORDS, k=words[0] if words else rng.randint(30, 90)))
        answer = " ".join(rng.choices(WORDS, k=words[1] if words else rng.randint(15, 60)))
        p = template_ids(tok, [{"role": "system", "content": "Solve it. End with Answer: X."},
                               {"role": "user", "content": question}])  # fmt: skip
        c = list(tok(answer, add_special_tokens=False)["input_ids"]) + [eot]
        out.append(Example(p + c, [IGNORE] * len(p) + c, f"bench{i}#0"))
    return out


class AutocastTrainer(LoraTrainer):
    """`LoraTrainer` whose forward runs under CPU bf16 autocast (an alternative measured, not
    what whale trains with: see whale.train.precision)."""

    def _nll_of(self, ids: Any, labels: Any, attention: Any) -> Any:
        import torch

        with torch.autocast("cpu", dtype=torch.bfloat16):
            return super()._nll_of(ids, labels, attention)


# arm -> (trainer class, sft.dtype)
OURS: dict[str, tuple[type[LoraTrainer], str]] = {
    "fp32": (LoraTrainer, "fp32"), "bf16": (LoraTrainer, "bf16"),
    "autocast": (AutocastTrainer, "fp32"), "bf16-autocast": (AutocastTrainer, "bf16"),
}  # fmt: skip


def make_ours(arm: str, model_dir: Path, lora: LoraSettings, sft: SFTSettings) -> LoraTrainer:
    cls, dtype = OURS[arm]
    return cls(model_dir, lora, replace(sft, dtype=dtype), seed=0)  # type: ignore[arg-type]


def run_ours(arm: str, model_dir: Path, examples: list[Example], lora: LoraSettings,
             sft: SFTSettings) -> tuple[float, float, float, float]:  # fmt: skip
    """(wall s, CPU s, pass loss, loss after the pass) of one pass."""
    t = make_ours(arm, model_dir, lora, sft)
    try:
        cpu = time.process_time()
        s = t.train(examples)
        cpu = time.process_time() - cpu
        after = t.loss(examples)
    finally:
        t.close()
    return s.wall_s, cpu, s.loss, after


def matmul_ceiling(model_dir: Path, tokens: int) -> str:
    """fp32 and bf16 GFLOP/s of the MLP's up projection, forward (x W^T) and input gradient
    (g W), on `tokens` rows: what bf16 can gain where matmuls are all the step does."""
    import json

    import torch

    cfg = json.loads((model_dir / "config.json").read_text())
    k, n = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    flop = 2 * tokens * k * n / 1e9
    rates = []
    for dt in (torch.float32, torch.bfloat16):
        x, w, g = (torch.randn(*shape).to(dt) for shape in ((tokens, k), (n, k), (tokens, n)))
        for a, b in ((x, w.t()), (g, w)):  # forward x W^T; input gradient g W
            a @ b
            rates.append(flop / min(_cpu(lambda a=a, b=b: a @ b) for _ in range(7)))
    f32, g32, f16, g16 = rates
    return (
        f"matmul {tokens}x{k}x{n}, GFLOP/s fp32 / bf16: forward {f32:.0f} / {f16:.0f} "
        f"({f16 / f32:.2f}x), input gradient {g32:.0f} / {g16:.0f} ({g16 / g32:.2f}x)"
    )


def attention_crossover(model_dir: Path,
                        lengths: tuple[int, ...] = (129, 258, 288, 384, 512, 700, 1500)
                        ) -> str:  # fmt: skip
    """CPU ms of torch's SDPA (causal, the model's query and KV heads), forward + backward, in
    fp32 and bf16 at several sequence lengths: where a bf16 training step computes attention in
    fp32 (whale.train.precision.FP32_ATTENTION_BELOW)."""
    import json

    import torch
    import torch.nn.functional as F

    cfg = json.loads((model_dir / "config.json").read_text())
    heads, kv = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads", 0) or 0)
    kv, dim = kv or heads, int(cfg["hidden_size"]) // heads
    rows = []
    for n in lengths:
        ms = []
        for dt in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(1, h, n, dim).to(dt).requires_grad_() for h in (heads, kv, kv))

            def once(q=q, k=k, v=v) -> None:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                     enable_gqa=kv != heads)  # fmt: skip
                out.backward(torch.ones_like(out))

            once()
            ms.append(1e3 * min(_cpu(once) for _ in range(7)))
        rows.append(f"{n}: {ms[0]:.1f} / {ms[1]:.1f} ({ms[0] / ms[1]:.2f}x)")
    return "attention fwd+bwd ms, fp32 / bf16, by keys: " + ", ".join(rows)


def _cpu(f: Any) -> float:
    t = time.process_time()
    f()
    return time.process_time() - t


def profile_step(
    arm: str,
    model_dir: Path,
    examples: list[Example],
    lora: LoraSettings,
    sft: SFTSettings,
    rows: int = 8,
) -> str:
    """The top ops by self CPU time of one optimizer step (`batch_size` examples)."""
    from torch.profiler import ProfilerActivity, profile

    t = make_ours(arm, model_dir, lora, sft)
    try:
        step = examples[: sft.batch_size]
        t.train(step)  # warm: oneDNN's kernels for these shapes, AdamW's state
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t.train(step)
    finally:
        t.close()
    table: str = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    return table


def run_trl(model_dir: Path, examples: list[Example], lora: LoraSettings,
            sft: SFTSettings) -> tuple[float, float, float, float]:  # fmt: skip
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    data = Dataset.from_list([
        {"input_ids": e.input_ids, "completion_mask": [int(y != IGNORE) for y in e.labels]}
        for e in examples
    ])  # fmt: skip
    # TRL's micro batches: the largest divisor of the batch size up to micro_batch, so that its
    # optimizer steps hold batch_size examples too (no token limit: TRL has none)
    most = min(sft.micro_batch, sft.batch_size)
    mb = max(d for d in range(1, most + 1) if sft.batch_size % d == 0)
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out, num_train_epochs=1, learning_rate=sft.lr,
            per_device_train_batch_size=mb, gradient_accumulation_steps=sft.batch_size // mb,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=sft.weight_decay,
            max_grad_norm=sft.max_grad_norm, optim="adamw_torch", adam_beta1=0.9,
            adam_beta2=0.999, adam_epsilon=1e-8, completion_only_loss=True, max_length=None,
            gradient_checkpointing=False, bf16=False, fp16=False, use_cpu=True, seed=0,
            save_strategy="no", report_to=[], logging_steps=10_000, disable_tqdm=True,
            dataloader_num_workers=0,
        )  # fmt: skip
        peft = LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.targets), task_type="CAUSAL_LM",
        )  # fmt: skip
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                             peft_config=peft)  # fmt: skip
        cpu = time.process_time()
        result = trainer.train()
        cpu = time.process_time() - cpu
    # The Trainer's own clock of its training loop: its setup inside train() (optimizer,
    # accelerate) is left out, as LoraTrainer's is (done in __init__); the CPU time has it.
    loss = float(result.training_loss)
    return float(result.metrics["train_runtime"]), cpu, loss, float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, help="a real HF checkpoint dir (default: tiny)")
    ap.add_argument("--tiny", action="store_true", help="the tiny random model (the default)")
    ap.add_argument("--examples", type=int, default=None, help="default 32 tiny, 16 real")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps of the pass: examples = steps x batch size",
    )
    ap.add_argument(
        "--arms", default="fp32,bf16,trl", help=f"comma list of {', '.join([*OURS, 'trl'])}"
    )
    ap.add_argument("--profile", action="store_true", help="profile one step of each arm")
    ap.add_argument("--attention", action="store_true",
                    help="first, SDPA forward+backward, fp32 and bf16, at 7 lengths")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=2, help="runs of each arm (alternating)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=SFTSettings.micro_batch,
                    help="examples per forward, at most (1: pad-free)")  # fmt: skip
    ap.add_argument("--micro-tokens", type=int, default=SFTSettings.micro_tokens,
                    help="padded tokens per forward, at most (whale's default)")  # fmt: skip
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--words",
        default=None,
        help="PROMPT,COMPLETION words per example (default: 30-90 and 15-60, drawn per example);"
        " the proposer's x_t is 1,500-3,000 tokens, a solver's rollout a few hundred",
    )
    args = ap.parse_args()
    arms = args.arms.split(",")
    if not arms or any(a not in (*OURS, "trl") for a in arms) or len(set(arms)) < len(arms):
        ap.error(f"--arms: distinct names of {', '.join([*OURS, 'trl'])}")

    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    if args.model_dir is None or args.tiny:
        model_dir, label = make_bench_model(Path(tmp.name) / "bench"), "tiny (hidden 256, 4 layers)"
        n = args.examples or 32
    else:
        model_dir, label = args.model_dir, str(args.model_dir)
        n = args.examples or 16
    if args.steps:
        n = args.steps * args.batch_size
    tok = AutoTokenizer.from_pretrained(model_dir)
    words = None
    if args.words:
        q, _, a = args.words.partition(",")
        if not (q.isdigit() and a.isdigit()):
            ap.error(f"--words: PROMPT,COMPLETION word counts, e.g. 500,150; not {args.words!r}")
        words = (int(q), int(a))
    examples = make_examples(tok, n, words=words)
    tokens = sum(trained_positions(e) for e in examples)
    total = sum(len(e.input_ids) for e in examples)
    lora = LoraSettings(r=args.r, alpha=2 * args.r)
    longest = max(len(e.input_ids) for e in examples)
    sft = SFTSettings(lr=args.lr, batch_size=args.batch_size, micro_batch=args.micro_batch,
                      micro_tokens=args.micro_tokens,
                      threads=args.threads, max_len=max(4096, longest))  # fmt: skip
    steps = -(-n // sft.batch_size)
    print(f"model {label}; {n} examples, {total} tokens, {tokens} trained; {steps} optimizer "
          f"steps; LoRA r={lora.r} alpha={lora.alpha}; batch {sft.batch_size} (micro "
          f"{sft.micro_batch}, <= {sft.micro_tokens} tokens); lr {sft.lr}; {args.threads} "
          "threads")  # fmt: skip
    print(matmul_ceiling(Path(model_dir), sorted(len(e.input_ids) for e in examples)[n // 2]),
          flush=True)  # fmt: skip
    if args.attention:
        print(attention_crossover(Path(model_dir)), flush=True)
    walls: dict[str, list[float]] = {a: [] for a in arms}
    cpus: dict[str, list[float]] = {a: [] for a in arms}
    losses: dict[str, tuple[float, float]] = {}
    for i in range(args.repeats):
        for arm in arms if i % 2 == 0 else list(reversed(arms)):
            if arm == "trl":
                wall, cpu, loss, after = run_trl(model_dir, examples, lora, sft)
            else:
                wall, cpu, loss, after = run_ours(arm, model_dir, examples, lora, sft)
            walls[arm].append(wall)
            cpus[arm].append(cpu)
            losses[arm] = (loss, after)
            print(f"  run {i + 1} {arm:<14} {wall:8.2f} s wall {cpu:8.2f} s CPU", flush=True)
    print(f"{'arm':<14} {'best s':>8} {'best CPU s':>10} {'tokens/s':>9} {'pass loss':>10} "
          f"{'loss after':>10}")  # fmt: skip
    for arm in arms:
        w = min(walls[arm])
        print(f"{arm:<14} {w:>8.2f} {min(cpus[arm]):>10.2f} {tokens / w:>9.1f} "
              f"{losses[arm][0]:>10.4f} {losses[arm][1]:>10.4f}")  # fmt: skip
    if "fp32" in arms:
        for arm in (a for a in arms if a not in ("fp32", "trl")):
            print(f"step time fp32 / {arm}: {min(walls['fp32']) / min(walls[arm]):.2f}x wall, "
                  f"{min(cpus['fp32']) / min(cpus[arm]):.2f}x CPU (target for bf16: >= 2.5x); "
                  f"loss after {steps} steps, {arm} - fp32: "
                  f"{losses[arm][1] - losses['fp32'][1]:+.4f}")  # fmt: skip
        if "trl" in arms:
            print(f"ratio LoraTrainer / TRL (fp32): {min(walls['trl']) / min(walls['fp32']):.2f} "
                  "(target >= 0.9)")  # fmt: skip
    if args.profile:
        for arm in (a for a in arms if a != "trl"):
            print(f"--- one step of {arm}, top ops by self CPU time")
            print(profile_step(arm, model_dir, examples, lora, sft))
    tmp.cleanup()


if __name__ == "__main__":
    main()
