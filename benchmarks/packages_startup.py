"""What allowed packages (`runtime.packages`) cost a run's start-up.

Medians over `--runs` of one jailed run (spawn, load, answer) of a harness that makes no call:
- stdlib: no packages (the default: no mount, no `import site`);
- mounted: a set mounted (one pure package, pydantic_core and typing_extensions, a .pth
  file), the harness importing none of it: the mount and `site.addsitedir`;
- imported: the same set, the harness importing pydantic_core (a compiled module).
The set is built once from wheels made on the spot (no index); the runs are interleaved so
that the machine's load falls on all three alike, each first in a round in turn.

    python -m benchmarks.packages_startup [--runs 30] [--sandbox auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from tests.harness.wheels import rewheel, write_wheel
from whale.harness import Runtime
from whale.harness.packages import PackageSet, build_folder
from whale.harness.sandbox import Sandbox

PLAIN = "def run(q, env):\n    return 'x'\n"
IMPORTS = "import pydantic_core\n\ndef run(q, env):\n    return pydantic_core.__version__\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--sandbox", default="auto")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        made = [write_wheel(wheels, "allowed", "1.0", {"allowed/__init__.py": "VALUE = 42\n",
                                                      "allowed.pth": "import allowed\n"}),
                rewheel("pydantic_core", wheels), rewheel("typing_extensions", wheels)]  # fmt: skip
        os.environ["PIP_NO_INDEX"] = "1"
        folder = build_folder([str(w) for w in made], Path(tmp) / "cache")
        packages = PackageSet(str(folder), ("allowed", "pydantic_core", "typing_extensions"))
        cases = {
            "stdlib": (Runtime(sandbox=Sandbox(args.sandbox)), PLAIN),  # type: ignore[arg-type]
            "mounted": (Runtime(sandbox=Sandbox(args.sandbox), packages=packages), PLAIN),  # type: ignore[arg-type]
            "imported": (Runtime(sandbox=Sandbox(args.sandbox), packages=packages), IMPORTS),  # type: ignore[arg-type]
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for rt, src in cases.values():  # warm the page cache
            assert rt.run(src, "q").status == "ok"
        names = list(cases)
        for i in range(args.runs):
            for name in names[i % 3 :] + names[: i % 3]:  # each case first in turn
                rt, src = cases[name]
                t = time.perf_counter()
                traj = rt.run(src, "q")
                times[name].append(time.perf_counter() - t)
                assert traj.status == "ok", traj.error
        sandbox = cases["stdlib"][0].sandbox.resolved()
    base = statistics.median(times["stdlib"])
    print(f"sandbox: {sandbox}   runs: {args.runs}   load average: {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:10s} {m * 1000:8.1f} ms (median)   {(m - base) * 1000:+7.1f} ms")


if __name__ == "__main__":
    main()
