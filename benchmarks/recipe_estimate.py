"""Rollouts, tokens and GPU hours per phase of each paper's protocol, from measured per-rollout
costs.

    python -m benchmarks.recipe_estimate --rg runs/demo --qa runs/diagnose-mhqa \
        [--proposer runs/proposer-real] [--solver-tok-s 20000] [--proposer-tok-s 30000] [--json]

What is measured and what is assumed:
- measured, from the run directories given: per solver rollout, the mean prompt and completion
  tokens and model calls (every trajectory's model-call usage, one row per rollout, read with
  the ledger's fingerprint so a resumed run's rows count once); per proposer proposal, the mean
  completion tokens (the GRPO updates' `completion_tokens` / G) and the teacher's keep rate
  (`teacher/summary.json`). These come from small models on this machine (a 0.5B solver);
  an 8B solver writes answers of about the same length on the same harness, but a harness
  that loops (retries, interpreter) spends what its solver makes it spend: re-measure on a
  pilot of the real solver (`whale eval --n 50` on the node) and pass that run instead.
- from the papers (seeds): the protocol's counts (G, contexts per update, updates, scoring
  instances per context, the harness phase's 4,608 rollouts for I = 6 on Math, 46,080 for
  harness-only; the 432 kept teacher examples).
- assumed, and flags: the node's aggregate decoding throughput (`--solver-tok-s`,
  `--proposer-tok-s`: completion tokens/s over all replicas of one 8-GPU node at full batch)
  and prompt throughput (`--prefill-ratio`: prompt tokens cost 1/ratio of a completion token),
  one sequence's decoding speed at full batch (`--seq-tok-s`) and the rollouts in flight
  (`--concurrency`): a phase takes the larger of its token-bound and latency-bound times,
  plus `--barrier-s` for each of its sequential steps (GRPO updates, rounds, iterations),
  WHALE's prompt pool (`--pool`) and G (`--g`), which the WHALE seed does not give. None of
  these was measured here (no GPU): hours scale as 1 / throughput, so replace them with a
  pilot's numbers. Training time (LoRA SFT/GRPO steps) is not estimated: it is small beside
  generation at these sizes only if the GPUs are shared well; measure it with
  `benchmarks/rsft_throughput.py` and `benchmarks/grpo_step.py` on the node.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale.records import RecordError, iter_jsonl


@dataclass
class RolloutCost:
    rollouts: int
    prompt_tokens: float
    completion_tokens: float
    calls: float


def rollout_cost(run: Path) -> RolloutCost:
    """Mean per-rollout usage over every trajectory file under `run` (each row one rollout)."""
    prompt: list[int] = []
    completion: list[int] = []
    calls: list[int] = []
    for path in sorted(run.rglob("trajectories/*.jsonl")):
        try:
            rows = iter_jsonl(path)
        except RecordError:
            continue  # a cut or foreign file: its rollouts are not counted
        for _, row in rows:
            events = [e for e in row.get("events", []) if e.get("kind") == "model"]
            usage = [e.get("usage") or {} for e in events]
            prompt.append(sum(int(u.get("prompt_tokens", 0)) for u in usage))
            completion.append(sum(int(u.get("completion_tokens", 0)) for u in usage))
            calls.append(len(events))
    if not calls:
        raise SystemExit(f"{run}: no trajectories found (trajectories/*.jsonl)")
    return RolloutCost(len(calls), statistics.fmean(prompt), statistics.fmean(completion),
                       statistics.fmean(calls))  # fmt: skip


def proposer_cost(run: Path) -> tuple[float, float | None]:
    """(mean completion tokens per proposal, teacher keep rate or None) of a train-proposer run."""
    per: list[float] = []
    for path in sorted(run.rglob("updates.jsonl")):
        for _, row in iter_jsonl(path):
            n = len(row.get("rewards") or [])
            if n and row.get("completion_tokens"):
                per.append(float(row["completion_tokens"]) / n)
    keep = None
    summary = run / "teacher" / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        cand, kept = s.get("proposals"), s.get("kept")
        if isinstance(cand, int) and isinstance(kept, int) and cand:
            keep = kept / cand
    return (statistics.fmean(per) if per else 300.0), keep


def phases(rg: RolloutCost, qa: RolloutCost, prop_tokens: float, keep: float | None,
           a: argparse.Namespace) -> list[dict[str, Any]]:  # fmt: skip
    """Each phase: solver rollouts (and their cost row), proposer proposals."""
    keep_rate = keep if keep else 0.2
    teacher_contexts = round(432 / keep_rate / 8)
    whale_weight = round(0.6 * a.pool * a.g)  # E = 0.6 epochs of the pool, G per prompt
    rows = [
        # Harness Learning (Reasoning Gym): teacher data, SFT, single-step GRPO, test-time adapt
        ("HL-RG teacher data (432 kept; keep rate measured)", rg, teacher_contexts * 8 * 25,
         teacher_contexts * 8, "teacher", 1),
        ("HL-RG GRPO: 16 updates x 40 contexts x G 8 x 25", rg, 16 * 40 * 8 * 25, 16 * 40 * 8,
         "proposer", 16),
        ("HL-RG adapt, 1 family: 5 rounds x G 8 x 25 dev + 2 x 75", rg, 5 * 8 * 25 + 150, 5 * 8,
         "proposer", 5),
        # Harness Learning (multi-hop QA): GRPO from the base proposer, 6 feedback + 64 scoring
        ("HL-QA GRPO: 16 x 40 contexts x G 8 x (64 + 6)", qa, 16 * 40 * (8 * 64 + 6),
         16 * 40 * 8, "proposer", 16),
        ("HL-QA adapt, 1 benchmark: 10 rounds x G 8 x 64 + 6", qa, 10 * (8 * 64 + 6), 10 * 8,
         "proposer", 10),
        # WHALE: one cycle of the main schedule (E, I) = (0.6, 6), and harness-only's budget
        (f"WHALE weight phase: 0.6 epoch x pool {a.pool} x G {a.g}", qa, whale_weight, 0,
         "proposer", 3),
        ("WHALE harness phase: I = 6 (4,608 rollouts, Math)", qa, 4608, 6 * 2, "proposer", 6),
        ("WHALE harness-only budget (46,080, Math)", qa, 46080, 60 * 2, "proposer", 60),
    ]  # fmt: skip
    out = []
    for name, cost, rollouts, proposals, who, steps in rows:
        prompt = rollouts * cost.prompt_tokens
        completion = rollouts * cost.completion_tokens
        calls = rollouts * cost.calls
        # Two bounds: the node's token throughput, and the calls' own latency at the node's
        # concurrency (a multi-call harness waits on each call in turn); the larger one holds.
        tokens_s = (completion + prompt / a.prefill_ratio) / a.solver_tok_s
        per_call = cost.completion_tokens / max(cost.calls, 1e-9) / a.seq_tok_s
        latency_s = calls * per_call / a.concurrency
        prop_rate = a.proposer_tok_s if who == "proposer" else a.teacher_tok_s
        prop_s = proposals * prop_tokens / prop_rate
        out.append({
            "phase": name, "solver_rollouts": rollouts, "solver_calls": round(calls),
            "prompt_tokens": round(prompt), "completion_tokens": round(completion),
            "proposals": proposals, "bound": "tokens" if tokens_s >= latency_s else "latency",
            "steps": steps,
            "hours": round((max(tokens_s, latency_s) + prop_s + steps * a.barrier_s) / 3600, 2),
        })  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rg", type=Path, required=True, help="a Reasoning Gym run directory")
    ap.add_argument("--qa", type=Path, required=True, help="a multi-hop QA run directory")
    ap.add_argument("--proposer", type=Path, help="a train-proposer run directory")
    ap.add_argument("--solver-tok-s", type=float, default=20000.0,
                    help="ASSUMED: node completion tokens/s of the 8B solver (all replicas)")
    ap.add_argument("--proposer-tok-s", type=float, default=30000.0,
                    help="ASSUMED: node completion tokens/s of the 4B proposer")
    ap.add_argument("--teacher-tok-s", type=float, default=5000.0,
                    help="ASSUMED: completion tokens/s of the 35B teacher")
    ap.add_argument("--prefill-ratio", type=float, default=10.0,
                    help="ASSUMED: prompt tokens are this many times cheaper than completions")
    ap.add_argument("--seq-tok-s", type=float, default=40.0,
                    help="ASSUMED: decoding tokens/s of one sequence of the solver at full batch")
    ap.add_argument("--concurrency", type=int, default=256,
                    help="ASSUMED: rollouts in flight on the node (executor actors x per_actor)")
    ap.add_argument("--barrier-s", type=float, default=120.0,
                    help="ASSUMED: seconds each sequential step waits beyond its throughput "
                    "(the slowest rollout of a scoring batch, a training step, a checkpoint)")
    ap.add_argument("--pool", type=int, default=2000, help="ASSUMED: WHALE's training prompts")
    ap.add_argument("--g", type=int, default=8, help="ASSUMED: WHALE's samples per prompt")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rg, qa = rollout_cost(a.rg), rollout_cost(a.qa)
    prop_tokens, keep = proposer_cost(a.proposer) if a.proposer else (300.0, None)
    rows = phases(rg, qa, prop_tokens, keep, a)
    measured = {
        "rg": vars(rg) | {"run": str(a.rg)}, "qa": vars(qa) | {"run": str(a.qa)},
        "proposal_completion_tokens": prop_tokens, "teacher_keep_rate": keep,
    }  # fmt: skip
    if a.json:
        names = ("solver_tok_s", "proposer_tok_s", "teacher_tok_s", "prefill_ratio", "seq_tok_s",
                 "concurrency", "barrier_s", "pool", "g")
        assumed = {k: getattr(a, k) for k in names}
        print(json.dumps({"measured": measured, "phases": rows, "assumed": assumed}, indent=2))
        return
    for k in ("rg", "qa"):
        c = measured[k]
        print(f"measured {k}: {c['rollouts']} rollouts of {c['run']}: {c['prompt_tokens']:.0f} "
              f"prompt + {c['completion_tokens']:.0f} completion tokens, "
              f"{c['calls']:.2f} calls per rollout")  # fmt: skip
    print(f"measured proposer: {prop_tokens:.0f} completion tokens per proposal; teacher keep "
          f"rate {keep if keep is None else round(keep, 3)}")
    print(f"assumed: solver {a.solver_tok_s:.0f} tok/s, proposer {a.proposer_tok_s:.0f} tok/s, "
          f"teacher {a.teacher_tok_s:.0f} tok/s per node, prefill x{a.prefill_ratio:.0f}, "
          f"{a.seq_tok_s:.0f} tok/s per sequence, {a.concurrency} rollouts in flight, "
          f"WHALE pool {a.pool} x G {a.g}")
    print(f"{'phase':<58} {'rollouts':>9} {'calls':>9} {'tokens':>13} {'proposals':>9} "
          f"{'bound':>7} {'steps':>5} {'hours':>6}")
    for r in rows:
        tok = r["prompt_tokens"] + r["completion_tokens"]
        print(f"{r['phase']:<58} {r['solver_rollouts']:>9,} {r['solver_calls']:>9,} {tok:>13,} "
              f"{r['proposals']:>9,} {r['bound']:>7} {r['steps']:>5} {r['hours']:>6.2f}")


if __name__ == "__main__":
    main()
