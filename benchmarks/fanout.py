"""Rollouts per second against the number of executors: the local pool with 1, 2 and 4
worker threads, and Ray with 1 and 2 actors (one rollout in flight on each: a "worker" is a
rollout in flight), on a simulated backend: an OpenAI-compatible server in its own process
that answers every request after a fixed DELAY_S with a fixed answer. Every rollout is a real
jailed run of the `single_call` seed harness on rg:basic_arithmetic, graded in the driver.

    python -m benchmarks.fanout [--per-worker 8] [--delay 0.5] [--skip-ray]

Ratio: the rate over the ideal, k x the 1-executor rate of the same kind (local k threads
against 1 thread; Ray k actors against 1 actor); `of latency` is the rate over k / DELAY_S.
Target (issue 13): >= 0.8. Ray's cluster and actors are started before the clock (a warm-up
evaluation); the local pool's warm workers are not. Not covered: a multi-node cluster, a
real model (whose own throughput, not the fan-out, bounds a real run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
from typing import Any

from whale.evaluation import evaluate
from whale.harness import Runtime, load_harness
from whale.models import OpenAICompatible
from whale.tasks import load_task


async def _serve(text: str, delay_s: float) -> None:
    """The fixed-latency backend: asyncio, so that its own CPU stays small next to what is
    measured; prints its base URL, then serves until killed."""
    body = json.dumps({
        "id": "x", "object": "chat.completion", "created": 0, "model": "fixed",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }).encode()  # fmt: skip
    reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
             + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip

    async def handle(reader: Any, writer: Any) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                await asyncio.sleep(delay_s)
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


def start_backend(delay_s: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.fanout", "--serve", "Answer: 1", str(delay_s)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def measure(rt: Runtime, k: int, per_worker: int, seed: int) -> tuple[int, float]:
    task = load_task("rg:basic_arithmetic", size=k * per_worker, seed=seed)
    r = evaluate(rt, load_harness("single_call"), task, task.questions(), workers=k)
    assert r.rho_run == 1.0, r.summary()
    return r.n, r.wall_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-worker", type=int, default=8, help="rollouts per executor")
    ap.add_argument("--delay", type=float, default=0.5, help="backend latency, seconds")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--serve", nargs=2, metavar=("TEXT", "DELAY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve[0], float(args.serve[1])))
        return
    server, base_url = start_backend(args.delay)
    rows: list[tuple[str, int, int, float]] = []
    try:
        model = OpenAICompatible("fixed", base_url)
        for k in (1, 2, 4):
            rt = Runtime(model=model, warm=2 * k)
            n, wall = measure(rt, k, args.per_worker, seed=k)
            rt.close()
            rows.append(("local", k, n, wall))
        if not args.skip_ray:
            import ray

            from whale.harness.ray_executor import RayExecutor

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)  # fmt: skip
            try:
                for k in (1, 2):
                    rt = Runtime(model=model, warm=2,
                                 executor=RayExecutor(actors=k, per_actor=1))  # fmt: skip
                    measure(rt, k, 1, seed=100 + k)  # warm-up: actors started
                    n, wall = measure(rt, k, args.per_worker, seed=10 + k)
                    rt.close()
                    rows.append(("ray", k, n, wall))
            finally:
                ray.shutdown()
        model.close()
    finally:
        server.terminate()
        server.wait()
    print(f"backend latency {args.delay:g} s; single_call on rg:basic_arithmetic, jailed")
    print(f"{'executor':>9} {'k':>3} {'rollouts':>9} {'wall s':>8} {'rollouts/s':>11} "
          f"{'ideal/s':>8} {'ratio':>6} {'of latency':>11}")  # fmt: skip
    base = {kind: n / wall for kind, k, n, wall in rows if k == 1}
    for kind, k, n, wall in rows:
        rate = n / wall
        ideal = k * base[kind]
        print(f"{kind:>9} {k:>3} {n:>9} {wall:>8.2f} {rate:>11.2f} {ideal:>8.2f} "
              f"{rate / ideal:>6.2f} {rate * args.delay / k:>11.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
