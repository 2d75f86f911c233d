"""BM25 at scale: index time, memory and queries/s at 100k and 1M generated passages, load time
of the saved index (mmap), and the extrapolation to the 5.23M Wikipedia abstracts of the paper.

Passages come from whale's generated multi-hop world (`whale.tasks.mhqa.World`, scaled);
queries are that world's own questions. Queries/s is one query per call on one thread, after a
warm-up (numba compiles on first use).

    python -m benchmarks.bm25_scale [--sizes 100000,1000000 --queries 2000]
Targets (issue 5): >= 1,000 queries/s on one thread; a 1M-passage index loads in < 1 s.
"""

from __future__ import annotations

import argparse
import random
import resource
import tempfile
import time

from whale.retrieval import BM25Index
from whale.tasks.mhqa import World, WorldSize

WIKI = 5_230_000


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--queries", type=int, default=2000)
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        t = time.perf_counter()
        world = World(0, WorldSize().scaled(n))
        passages = world.passages
        gen_s = time.perf_counter() - t
        rng = random.Random(1)
        queries = [world.question(rng)[0] for _ in range(args.queries)]
        before = rss_mb()
        t = time.perf_counter()
        index = BM25Index.build(passages)
        build_s = time.perf_counter() - t
        with tempfile.TemporaryDirectory() as tmp:
            index.save(tmp)
            t = time.perf_counter()
            # The whole load: bm25s arrays (mmap) and the passage file (offsets, mmap).
            loaded = BM25Index.load(tmp, expect_hash=index.corpus_hash)
            load_s = time.perf_counter() - t
            for q in queries[:50]:  # warm-up: numba compiles on first use
                loaded.retrieve(q, 10)
            t = time.perf_counter()
            for q in queries:
                loaded.retrieve(q, 10)
            qps = len(queries) / (time.perf_counter() - t)
        rows.append((len(passages), gen_s, build_s, rss_mb() - before, load_s, qps))
        del index, loaded
    print(
        f"{'passages':>10} {'generate s':>10} {'index s':>8} {'+peak MB':>9} {'load s':>7} "
        f"{'queries/s':>10}"
    )
    for n, g, b, m, ld, q in rows:
        print(f"{n:>10} {g:>10.1f} {b:>8.1f} {m:>9.0f} {ld:>7.3f} {q:>10.0f}")
    n, _, b, m, ld, q = rows[-1]
    f = WIKI / n
    print(
        f"extrapolated to {WIKI:,} passages, linearly from the largest row: index ~{b * f:.0f} s,"
        f" ~{m * f:.0f} MB more peak memory while indexing, load ~{ld * f:.2f} s; a query's cost"
        f" grows with its posting lists, at worst linearly: >= {q / f:.0f} queries/s"
    )
    print("targets: >= 1000 queries/s on one thread; 1M-passage index loads in < 1 s")


if __name__ == "__main__":
    main()
