"""The orders example from Python: evaluate the seed, improve it with `adapt` and `search`.

    .venv/bin/python examples/byo/run.py                        # the README's budget
    WHALE_EXAMPLE_SMALL=1 .venv/bin/python examples/byo/run.py  # a few minutes (the test)

Runs on the embedded models (`make install` installs them) from any folder: it writes the
data with make_data.py where there is none yet ($WHALE_BYO_DATA, else data/ beside this
file), reads whale.toml, the same config the CLI commands take, and names its files from
here instead of from the repository root. Run directories go under $WHALE_EXAMPLE_OUT (else
runs/), byo-*; a second start resumes each run instead of paying again.
"""

import os
import sys
from pathlib import Path

import whale

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_data  # noqa: E402 - beside this file

DATA = make_data.default_out().resolve()
os.environ["WHALE_BYO_DATA"] = str(DATA)  # where the tools process finds the database
if not (DATA / make_data.QUESTIONS_NAME).is_file():
    make_data.generate(DATA)

SMALL = os.environ.get("WHALE_EXAMPLE_SMALL") == "1"
SOLVER = "qwen-coder-0.5b"  # the smallest catalog model that calls the tool
PROPOSER = "smollm2-135m" if SMALL else "qwen-coder-1.5b"
OUT = os.environ.get("WHALE_EXAMPLE_OUT", "runs")
SPLITS = {"dev": 3, "eval": 3} if SMALL else {"dev": 20, "eval": 40}
CONFIG = HERE / "whale.toml"
# whale.toml names these from the repository root; here they are named from this folder. The
# tools process has this script's sys.path, so `tools` (tools.py beside it) imports there.
PATHS = {
    "harness": str(HERE / "seed_harness.py"),
    "task.id": f"jsonl:{DATA / make_data.QUESTIONS_NAME}",
    "task.config.grader.name": f"py:{HERE / 'grader.py'}:grade",
    "runtime.tools.sql.function": "tools:sql",
}
# The small run asks for short replies (the 135M proposer writes until the limit).
PROPOSE = {"propose.max_tokens": 192} if SMALL else {}
STEP = {"agent.max_steps": 2, "agent.step_tokens": 192} if SMALL else {"agent.max_steps": 4}


def paid(run):
    """Rollouts this call paid for (adapt and search name the count differently)."""
    r = run.records
    return r.get("rollouts_paid_this_invocation", r.get("rollouts paid this invocation"))


def resumed(fn, out, **kwargs):
    """A run of `fn` in `out`: resumed when a run is there (nothing paid twice), else new."""
    if os.path.exists(os.path.join(out, "config.toml")):
        return fn(resume=out)
    return fn(out=out, config=str(CONFIG), overrides=PATHS, **kwargs)


# 1. The seed harness, as it is.
seed = whale.evaluate(model=SOLVER, n=3 if SMALL else 20, out=f"{OUT}/byo-eval-{os.getpid()}",
                      config=str(CONFIG), overrides=PATHS)  # fmt: skip
print("seed:", seed.held_out["harness"])

# 2. Harness Learning's revision loop: report, propose, apply, score, select.
adapted = resumed(whale.adapt, f"{OUT}/byo-adapt", solver=SOLVER, proposer=PROPOSER,
                  rounds=1 if SMALL else 2, g=1 if SMALL else 2, feedback=2 if SMALL else 4,
                  fields=PROPOSE, **SPLITS)  # fmt: skip
print("adapt:", adapted.held_out["seed"], "->", adapted.held_out["final"], f"paid {paid(adapted)}")

# 3. Meta-Harness search over an archive of every candidate.
found = resumed(whale.search, f"{OUT}/byo-search", solver=SOLVER, proposer=PROPOSER,
                iterations=1 if SMALL else 2, m=1 if SMALL else 2, fields=STEP,
                **SPLITS)  # fmt: skip
print("search:", found.held_out["seed"], "->", found.held_out["final"], f"paid {paid(found)}")

# 4. Resume: the same call on the same directory answers from the records.
again = whale.adapt(resume=adapted.run_dir)
print("resumed adapt paid", paid(again), "rollouts")
