"""Training tokens/s of `LoraTrainer.train` against plain TRL `SFTTrainer`, same examples.

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

    python -m benchmarks.rsft_throughput [--model-dir DIR] [--examples N] [--tiny]

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
from pathlib import Path

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


def make_examples(tok, n: int, seed: int = 0) -> list[Example]:  # noqa: ANN001
    """`n` chat examples: system + user prompt of 30-90 words, completion of 15-60 words."""
    rng = random.Random(seed)
    eot = end_of_turn_id(tok)
    out = []
    for i in range(n):
        question = " ".join(rng.choices(WORDS, k=rng.randint(30, 90)))
        answer = " ".join(rng.choices(WORDS, k=rng.randint(15, 60)))
        p = template_ids(tok, [{"role": "system", "content": "Solve it. End with Answer: X."},
                               {"role": "user", "content": question}])  # fmt: skip
        c = list(tok(answer, add_special_tokens=False)["input_ids"]) + [eot]
        out.append(Example(p + c, [IGNORE] * len(p) + c, f"bench{i}#0"))
    return out


def run_ours(model_dir: Path, examples: list[Example], lora: LoraSettings,
             sft: SFTSettings) -> tuple[float, float]:  # fmt: skip
    t = LoraTrainer(model_dir, lora, sft, seed=0)
    try:
        s = t.train(examples)
    finally:
        t.close()
    return s.wall_s, s.loss


def run_trl(model_dir: Path, examples: list[Example], lora: LoraSettings,
            sft: SFTSettings) -> tuple[float, float]:  # fmt: skip
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
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out, num_train_epochs=1, learning_rate=sft.lr,
            per_device_train_batch_size=sft.micro_batch,
            gradient_accumulation_steps=max(1, sft.batch_size // sft.micro_batch),
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
        result = trainer.train()
    # The Trainer's own clock of its training loop: its setup inside train() (optimizer,
    # accelerate) is left out, as LoraTrainer's is (done in __init__).
    return float(result.metrics["train_runtime"]), float(result.training_loss)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, help="a real HF checkpoint dir (default: tiny)")
    ap.add_argument("--tiny", action="store_true", help="the tiny random model (the default)")
    ap.add_argument("--examples", type=int, default=None, help="default 32 tiny, 16 real")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each side (alternating)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

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
    tok = AutoTokenizer.from_pretrained(model_dir)
    examples = make_examples(tok, n)
    tokens = sum(trained_positions(e) for e in examples)
    total = sum(len(e.input_ids) for e in examples)
    lora = LoraSettings(r=args.r, alpha=2 * args.r)
    sft = SFTSettings(lr=args.lr, batch_size=args.batch_size, micro_batch=args.micro_batch,
                      threads=args.threads)  # fmt: skip
    print(f"model {label}; {n} examples, {total} tokens, {tokens} trained; LoRA r={lora.r} "
          f"alpha={lora.alpha}; batch {sft.batch_size} (micro {sft.micro_batch}); lr {sft.lr}; "
          f"{args.threads} threads")  # fmt: skip
    walls: dict[str, list[float]] = {"LoraTrainer": [], "TRL SFTTrainer": []}
    losses: dict[str, float] = {}
    runners = {"LoraTrainer": run_ours, "TRL SFTTrainer": run_trl}
    for i in range(args.repeats):
        order = list(runners) if i % 2 == 0 else list(reversed(runners))
        for name in order:
            wall, loss = runners[name](model_dir, examples, lora, sft)
            walls[name].append(wall)
            losses[name] = loss
            print(f"  run {i + 1} {name:<15} {wall:8.2f} s", flush=True)
    print(f"{'trainer':<16} {'best s':>8} {'tokens/s':>9} {'pass loss':>10}")
    rate = {}
    for name, w in walls.items():
        rate[name] = tokens / min(w)
        print(f"{name:<16} {min(w):>8.2f} {rate[name]:>9.1f} {losses[name]:>10.4f}")
    print(f"ratio LoraTrainer / TRL: {rate['LoraTrainer'] / rate['TRL SFTTrainer']:.2f} "
          "(target >= 0.9)")  # fmt: skip
    tmp.cleanup()


if __name__ == "__main__":
    main()
