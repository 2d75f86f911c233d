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
same loss (see grpo.py for what "exact" means for each).
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

from whale.harness import RuntimeConfig, make_runtime
from whale.models import ModelConfig, build_model, close_model
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
                         threads=a.threads)  # fmt: skip
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
    a = p.parse_args()
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
