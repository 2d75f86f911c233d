"""One GRPO update of the proposer, split into generation, reward execution and the gradient
step, for both generation backends, on the real models.

    python -m benchmarks.grpo_step [--family rg:letter_counting] [--contexts 1] [--g 4]
        [--max-completion 256] [--score 6] [--generation trl,embedded] [--adapter DIR]

Proposer: Qwen2.5-Coder-0.5B (its trainable fp32 checkpoint, LoRA r = 32 on all projections),
solver: the same model's GGUF on the embedded llama.cpp server, through the isolated runtime.
For each backend, in its own temporary run directory (so no rollout is answered from another
backend's ledger): `contexts` revision contexts of `family` (the single_call seed, a report
on 6 feedback questions), one update of `contexts` × `g` samples; printed per backend:
- generation_s: TRL's in-process `generate` ("trl") or the embedded llama.cpp server with the
  current adapter ("embedded": adapter saved, converted to a LoRA GGUF, server restarted, then
  sampled), as `whale.train.proposer.grpo` times it;
- reward_s: applying and screening each sample and running the valid candidates on `score`
  questions (distinct candidates concurrently, `--workers`);
- gradient_s: the rest of the update (TRL's forward, backward and optimizer step);
- solver fraction: over the reward's rollouts, time inside solver calls / rollout wall time.
The generation ratio (trl / embedded) says which backend is faster here; both train on the
same loss (see grpo.py for what "exact" means for each). `--dtype` sets `grpo.dtype`.

bf16 against fp32 (`--fixed`): the gradient step alone, in both dtypes, on the same
completions:

    python -m benchmarks.grpo_step --fixed [--tiny] [--updates 3] [--contexts 1] [--g 4]
        [--max-completion 64] [--prompt-words 120] [--repeats 2] [--no-checkpointing]

No solver and no sandbox: the completions are fixed by each request's seed (random words from a
small vocabulary, the same in every arm, whatever the weights), the reward is the share of "e" in
the text, and each arm is one `train_grpo` run of `--updates` updates from the same random fp32
init adapter (LoRA r = 32 on all projections), gradient checkpointing on (the default; off with
`--no-checkpointing`), through the "embedded" path (so the adapter is saved every update, as in
real runs). Arms alternate (fp32, bf16, bf16, fp32, ...); each keeps its fastest run. Printed: the
gradient step time per update (`gradient_s`, TRL's forward, backward and AdamW, wall clock) and
this process's CPU time per update (the whole run over the updates, model loading included:
steadier than wall time on a shared machine), their ratios fp32 / bf16, TRL's grad norm of each
update in both dtypes, and how far apart the adapters end after the N updates: |W_bf16 - W_fp32| /
|W_fp32 - W_init| over all LoRA weights (0: the same update; the loss itself is no measure here:
on-policy GRPO's loss is 0 at every update, the group's advantages summing to zero). Proposer:
`--tiny` (the random hidden-256 model of rsft_throughput) or the real 0.5B checkpoint
(`--proposer`). Target (issue 25): >= 2.5x.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.rsft_throughput import WORDS, make_bench_model
from whale.harness import RuntimeConfig, make_runtime
from whale.models import ModelConfig, build_model, close_model
from whale.models.base import Completion, Sampling
from whale.revise.report import ReportConfig
from whale.train.checkpoint import resolve_gguf, trainable_checkpoint
from whale.train.proposer.contexts import ContextSettings, build_contexts, open_family
from whale.train.proposer.grpo import GRPOSettings, train_grpo
from whale.train.proposer.reward import ExecutionReward, echo_screen
from whale.train.serving import EmbeddedServing

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up when piped


def one(generation: str, a: argparse.Namespace, ckpt: Path, root: Path) -> dict[str, float]:
    run = root / generation
    cs = ContextSettings(dev=a.score + 10, score=a.score, eval=4, feedback=6,
                         contexts=a.contexts, report=ReportConfig(char_budget=2500))  # fmt: skip
    solver_cfg = ModelConfig(name=a.solver, cache=False)
    rt_cfg = RuntimeConfig()
    fam = open_family(a.family, cs, run, solver_cfg, rt_cfg)
    solver = build_model(solver_cfg)
    runtime = make_runtime(rt_cfg, solver, workers=a.workers)
    serving = None
    try:
        ctxs = build_contexts(fam, runtime, cs, a.workers, print)
        reward = ExecutionReward(ctxs, {a.family: fam}, runtime, run / "rewards.jsonl",
                                 a.workers, echo={a.family: echo_screen(fam, "")})  # fmt: skip
        if generation == "embedded":
            alias, gguf = resolve_gguf(a.proposer)
            serving = EmbeddedServing(gguf, alias, threads=a.threads, timeout_s=600.0)
        s = GRPOSettings(g=a.g, contexts_per_update=a.contexts, updates=1,
                         max_completion=a.max_completion, generation=generation,
                         threads=a.threads, dtype=a.dtype)  # fmt: skip
        t0 = time.monotonic()
        _, stats = train_grpo([(c.id, c.prompt) for c in ctxs], reward, ckpt, s, run / "grpo",
                              init_adapter=Path(a.adapter) if a.adapter else None,
                              serving=serving, say=print)  # fmt: skip
        wall = time.monotonic() - t0
        reward.close()
        u = stats[-1]
        return {"generation_s": u.generation_s, "reward_s": u.reward_s,
                "gradient_s": u.gradient_s, "update_wall_s": wall,
                "completion_tokens": u.completion_tokens, "reward_mean": u.reward_mean,
                "solver_fraction": reward.solver_fraction}  # fmt: skip
    finally:
        if serving is not None:
            serving.close()
        runtime.close()
        fam.store.close()
        close_model(solver)


# --- bf16 against fp32 on fixed completions ------------------------------------------------
class FixedChat:
    """A completion fixed by the request's seed (not by the weights): random words, up to
    `max_tokens` tokens, ending in a stop."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def chat(self, messages: Any, sampling: Sampling, timeout: float | None = None) -> Completion:
        rng = random.Random(sampling.seed)
        words: list[str] = []
        while True:
            more = [*words, rng.choice(WORDS)]
            n = len(self.tok(" ".join(more), add_special_tokens=False)["input_ids"])
            if n > sampling.max_tokens - 1:
                break
            words = more
        text = " ".join(words)
        n = len(self.tok(text, add_special_tokens=False)["input_ids"])
        return Completion(text, "stop", usage={"completion_tokens": n})


class FixedServing:
    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def serve(self, adapter: Path | None) -> FixedChat:
        return FixedChat(self.tok)

    def close(self) -> None:
        pass


def letter_reward(contexts: Any, texts: Any) -> list[float]:
    return [t.count("e") / max(1, len(t)) for t in texts]


def _init_adapter(ckpt: Path, out: Path, r: int) -> Path:
    """A random fp32 LoRA adapter (A and B nonzero): both arms start from these weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 1e-3)
    model.save_pretrained(str(out))
    return out


def _weights(adapter: Path) -> Any:
    import torch
    from safetensors.torch import load_file

    w = load_file(str(adapter / "adapter_model.safetensors"))
    return torch.cat([w[k].flatten().double() for k in sorted(w)])


def fixed(a: argparse.Namespace) -> None:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tmp = Path(tempfile.mkdtemp(prefix="grpo-dtype-"))
    if a.tiny:
        ckpt, label = make_bench_model(tmp / "bench"), "tiny (hidden 256, 4 layers)"
    else:
        ckpt = trainable_checkpoint(a.proposer)
        label = str(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    rng = random.Random(0)
    prompts = [(f"ctx{i}", " ".join(rng.choices(WORDS, k=a.prompt_words)))
               for i in range(a.contexts)]  # fmt: skip
    init = _init_adapter(ckpt, tmp / "init", a.r)
    arms = ["fp32", "bf16"]
    grads: dict[str, list[float]] = {d: [] for d in arms}
    cpus: dict[str, list[float]] = {d: [] for d in arms}
    rows: dict[str, Any] = {}
    finals: dict[str, Path] = {}
    for i in range(a.repeats):
        for d in arms if i % 2 == 0 else arms[::-1]:
            s = GRPOSettings(g=a.g, contexts_per_update=a.contexts, updates=a.updates,
                             max_completion=a.max_completion, max_prompt=100_000,
                             generation="embedded", threads=a.threads, dtype=d,  # type: ignore[arg-type]
                             gradient_checkpointing=not a.no_checkpointing)  # fmt: skip
            out = tmp / f"{d}_{i}"
            cpu = time.process_time()
            adapter, stats = train_grpo(prompts, letter_reward, ckpt, s, out, init_adapter=init,
                                        serving=FixedServing(tok), say=lambda m: None)  # type: ignore[arg-type]  # fmt: skip
            cpus[d].append((time.process_time() - cpu) / a.updates)
            per = [u.gradient_s for u in stats]
            print(f"  run {i + 1} {d}: gradient s per update {[round(x, 2) for x in per]}; "
                  f"CPU s per update {cpus[d][-1]:.2f}", flush=True)  # fmt: skip
            grads[d].append(statistics.fmean(per))
            rows[d], finals[d] = stats, adapter
    w0, w32, w16 = _weights(init), _weights(finals["fp32"]), _weights(finals["bf16"])
    apart = float((w16 - w32).norm() / (w32 - w0).norm())
    tokens = rows["fp32"][0].completion_tokens
    print(f"\nmodel {label}; {a.contexts} context(s) x G={a.g}, {a.updates} updates, prompt "
          f"{a.prompt_words} words, {tokens} completion tokens per update; {a.threads} "
          f"threads; gradient checkpointing {'off' if a.no_checkpointing else 'on'}")  # fmt: skip
    print("| dtype | best mean gradient s per update | best CPU s per update | grad norm per "
          "update |\n|---|---|---|---|")  # fmt: skip
    for d in arms:
        norms = ", ".join(f"{u.grad_norm:.4g}" for u in rows[d])
        print(f"| {d} | {min(grads[d]):.2f} | {min(cpus[d]):.2f} | {norms} |")
    print(f"gradient step fp32 / bf16: {min(grads['fp32']) / min(grads['bf16']):.2f}x wall, "
          f"{min(cpus['fp32']) / min(cpus['bf16']):.2f}x CPU (target >= 2.5x)")  # fmt: skip
    print(f"adapters after {a.updates} updates: |W_bf16 - W_fp32| / |W_fp32 - W_init| = "
          f"{apart:.4f}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="rg:letter_counting")
    p.add_argument("--proposer", default="qwen-coder-0.5b")
    p.add_argument("--solver", default="qwen-coder-0.5b")
    p.add_argument("--contexts", type=int, default=1)
    p.add_argument("--g", type=int, default=4)
    p.add_argument("--max-completion", type=int, default=256)
    p.add_argument("--score", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--generation", default="trl,embedded")
    p.add_argument("--adapter", default=None,
                   help="start from this PEFT adapter (e.g. a train-proposer sft/adapter, "
                   "whose edits apply, so that the reward runs candidates)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--fixed", action="store_true", help="bf16 against fp32, fixed completions")
    p.add_argument("--tiny", action="store_true", help="--fixed on the tiny random model")
    p.add_argument("--updates", type=int, default=3, help="--fixed: updates per arm")
    p.add_argument("--prompt-words", type=int, default=120, help="--fixed: words per prompt")
    p.add_argument("--no-checkpointing", action="store_true",
                   help="--fixed: gradient checkpointing off (grpo.gradient_checkpointing)")
    p.add_argument("--repeats", type=int, default=2, help="--fixed: runs of each arm")
    p.add_argument("--r", type=int, default=32, help="--fixed: LoRA rank")
    a = p.parse_args()
    if a.fixed:
        if a.max_completion == p.get_default("max_completion"):
            a.max_completion = 64
        fixed(a)
        return
    ckpt = trainable_checkpoint(a.proposer)
    results = {}
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as tmp:
        for gen in a.generation.split(","):
            print(f"--- generation: {gen}")
            results[gen] = one(gen, a, ckpt, Path(tmp))
    print(f"\nOne GRPO update: {a.contexts} context(s) x G={a.g} of {a.family}, "
          f"max {a.max_completion} completion tokens, {a.score} scoring questions")  # fmt: skip
    print("| generation | generation s | reward s | gradient s | update wall s | "
          "completion tokens | gen tokens/s | solver fraction of reward |")
    print("|---|---|---|---|---|---|---|---|")
    for gen, r in results.items():
        tps = r["completion_tokens"] / r["generation_s"] if r["generation_s"] else 0.0
        print(f"| {gen} | {r['generation_s']:.1f} | {r['reward_s']:.1f} | "
              f"{r['gradient_s']:.1f} | {r['update_wall_s']:.1f} | "
              f"{r['completion_tokens']} | {tps:.1f} | {r['solver_fraction']:.2f} |")
    if {"trl", "embedded"} <= set(results):
        t, e = results["trl"], results["embedded"]
        tps = [r["completion_tokens"] / r["generation_s"] for r in (t, e)]
        print(f"generation tokens/s, embedded / trl: {tps[1] / tps[0]:.2f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
