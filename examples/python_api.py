"""whale from Python: evaluate a harness, improve it with `adapt` and with `search`, resume.

    .venv/bin/python examples/python_api.py            # the README's budget (about an hour)
    WHALE_EXAMPLE_SMALL=1 .venv/bin/python examples/python_api.py   # a few minutes (the test)

Runs on the embedded models (`make install` installs them); every run directory goes under
runs/py-*, and a second start of this script resumes each run instead of paying again.
"""

import os

import whale

SMALL = os.environ.get("WHALE_EXAMPLE_SMALL") == "1"
SOLVER = "smollm2-135m" if SMALL else "qwen-coder-0.5b"
PROPOSER = "smollm2-135m" if SMALL else "qwen-coder-1.5b"
TASK, SEED = "rg:basic_arithmetic", "single_call"
OUT = os.environ.get("WHALE_EXAMPLE_OUT", "runs")
SPLITS = {"dev": 3, "eval": 3} if SMALL else {"dev": 25, "eval": 75}
# The small run asks for short replies (the 135M model writes until the limit).
REPLY = {"propose.max_tokens": 192} if SMALL else {}
STEP = {"agent.max_steps": 2, "agent.step_tokens": 192} if SMALL else {"agent.max_steps": 4}


def resumed(fn, out, **kwargs):
    """A run of `fn` in `out`: resumed when a run is there (nothing paid twice), else new."""
    if os.path.exists(os.path.join(out, "config.toml")):
        return fn(resume=out)
    return fn(out=out, **kwargs)


# 1. The seed harness, as it is.
seed = whale.evaluate(TASK, SEED, SOLVER, n=3 if SMALL else 20, out=f"{OUT}/py-eval-{os.getpid()}")
print("seed:", seed.held_out["harness"])

# 2. Harness Learning's revision loop: report, propose, apply, score, select.
adapted = resumed(whale.adapt, f"{OUT}/py-adapt", task=TASK, harness=SEED, solver=SOLVER,
                  proposer=PROPOSER, rounds=1 if SMALL else 3, g=1 if SMALL else 4,
                  feedback=2 if SMALL else 8, fields=REPLY, **SPLITS)
print("adapt:", adapted.held_out["seed"], "->", adapted.held_out["final"])
print(adapted.harness)

# 3. Meta-Harness search over an archive of every candidate.
found = resumed(whale.search, f"{OUT}/py-search", task=TASK, harness=SEED, solver=SOLVER,
                proposer=PROPOSER, iterations=1 if SMALL else 3, m=1 if SMALL else 2,
                fields=STEP, **SPLITS)
print("search:", found.held_out["seed"], "->", found.held_out["final"])

# 4. Resume: the same call on the same directory answers from the records.
again = whale.adapt(resume=adapted.run_dir)
print("resumed adapt paid", again.records["rollouts_paid_this_invocation"], "rollouts")
