"""What a chat completion through the in-jail OpenAI-compatible endpoint costs, against
`env.llm` for the same request, measured in one run.

A jailed harness makes N calls one way or the other:
- env.llm: `env.llm(messages, max_tokens=8)`, the broker's round trip;
- endpoint (http.client): the same request as `POST $OPENAI_BASE_URL/chat/completions` over a
  kept-alive connection, with the standard library's client;
- endpoint (openai): the same through `openai.OpenAI().chat.completions.create`, when the
  `openai` package is allowed in the jail (`--packages openai`: runtime.packages).
The model answers in this process at once by default (`--model instant`: a constant reply),
so that what is measured is whale's part alone; `--model embedded` uses the embedded default
model instead (then the model's own time dominates and the difference is within its noise).
Each per-call cost is (a run of N + 10 calls - a run of 10 calls) / N, medians over runs, so the
worker's start and the run's fixed costs (the client's import) cancel out.

    python -m benchmarks.endpoint_overhead [--calls 1000] [--runs 5] [--packages openai]
Target (issue 24): under 5 ms added per call over env.llm.
"""

from __future__ import annotations

import argparse

from benchmarks.runtime_overhead import median_s
from whale.harness import Budget, Runtime
from whale.models.base import Completion

CALLS = r"""
import http.client, json, os

def run(q, env):
    n, how = q.split()
    messages = [{"role": "user", "content": "Say OK."}]
    if how == "llm":
        for _ in range(int(n)):
            env.llm(messages, max_tokens=8)
        return "ok"
    if how == "openai":
        import openai
        client = openai.OpenAI()
        for _ in range(int(n)):
            client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        return "ok"
    host, port = os.environ["OPENAI_BASE_URL"][7:].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port))
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 8})
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
               "Content-Type": "application/json"}
    for _ in range(int(n)):
        conn.request("POST", "/v1/chat/completions", body, headers)
        r = conn.getresponse()
        r.read()
        assert r.status == 200, r.status
    return "ok"
"""


class Instant:
    """Answers at once with a constant reply: the benchmark's model, so that the time measured
    is the endpoint's and the broker's."""

    name = "instant"

    def chat(self, messages, sampling, timeout=None):  # noqa: ANN001, ANN201
        return Completion("OK", "stop", {"prompt_tokens": 4, "completion_tokens": 1,
                                         "total_tokens": 5})  # fmt: skip


def per_call_s(rt: Runtime, how: str, n: int, runs: int) -> float:
    def one(k: int) -> None:
        t = rt.run(CALLS, f"{k} {how}")
        assert t.status == "ok", (t.error, t.stderr_tail)

    base = median_s(lambda: one(10), runs)
    many = median_s(lambda: one(n + 10), runs)
    return (many - base) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", choices=["instant", "embedded"], default="instant")
    ap.add_argument("--packages", nargs="*", default=[], help="runtime.packages, e.g. openai")
    args = ap.parse_args()
    n = args.calls
    if args.model == "embedded":
        from whale.models.embedded import EmbeddedLlama

        model: object = EmbeddedLlama()
    else:
        model = Instant()
    extra = {}
    if args.packages:
        from whale.harness.packages import resolve_packages

        extra["packages"] = resolve_packages(args.packages)
    rt = Runtime(model=model, budget=Budget(model_calls=n + 10, run_timeout_s=600), **extra)  # type: ignore[arg-type]
    ways = ["llm", "http"] + (["openai"] if "openai" in " ".join(args.packages) else [])
    try:
        rt.run(CALLS, "1 http")  # warm the page cache
        cost = {how: per_call_s(rt, how, n, args.runs) for how in ways}
    finally:
        rt.close()
    print(f"sandbox: {rt.sandbox.resolved()}   model: {args.model}   calls per run: {n}   "
          f"runs: {args.runs}")  # fmt: skip
    base = cost["llm"]
    print(f"env.llm:                     {base * 1e3:8.3f} ms per call")
    for how in ways[1:]:
        print(f"endpoint ({how + '):':<12}        {cost[how] * 1e3:8.3f} ms per call   "
              f"added {(cost[how] - base) * 1e3:.3f} ms   target < 5 ms   "
              f"ratio {cost[how] / base:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
