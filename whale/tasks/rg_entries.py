"""Reasoning Gym entries that are the same in every process.

Eight generators of reasoning_gym 0.1.25 draw from their seeded RNG while iterating a set of
strings (`rng.choice(list(self.letters))`), whose order follows the process's string hashing,
random per process unless PYTHONHASHSEED is set. The same family, seed and size then gave other
questions in another process: a stopped run could not be resumed ("the feedback split is not
the one the run started with") and a rerun measured other questions. Measured by generating 30
entries of every family (105) under PYTHONHASHSEED=1 and =2 and comparing them; the eight are
`HASH_DEPENDENT`. Their entries are made in a child interpreter with PYTHONHASHSEED=0 (about
2 s for the import, once per task object); every other family's in process, as before. Where
this process's own hashing is seed 0 there is no child (but see `UNSEEDED`).

Two of them (`UNSEEDED`) also draw from an unseeded global generator: list_functions from
`random`, codeio's code samples from numpy.random; their entries differed between two processes
even with PYTHONHASHSEED=0 (5 and 3 of 60 at seed 0). They are always made in the child, which
seeds both from (family, seed, index) before each entry. Measured by generating 60 entries at
seeds 0 and 7 of every family in two processes with PYTHONHASHSEED=0.

Not covered: a generator that becomes hash-dependent in a later reasoning_gym (tests/tasks/
test_rg_entries.py checks that the eight still are, and that whale's questions are not).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from typing import Any

HASH_DEPENDENT = frozenset({
    "codeio", "intermediate_integration", "isomorphic_strings", "knight_swap",
    "list_functions", "polynomial_multiplication", "ransom_note", "word_ladder",
})  # fmt: skip
UNSEEDED = frozenset({"codeio", "list_functions"})

# The child's sys.path is set before anything else imports: the folder holding this process's
# whale, then this process's own path (`python -c` would put the working folder first, so a
# `whale` folder or a random.py there would be imported instead).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHILD = """
import sys
sys.path[:] = sys.argv[1:]
import json, os, pickle, random
pipe = os.dup(1)
os.dup2(2, 1)  # what a generator prints (codeio does) goes to stderr, not into the pickle
import numpy
from whale.tasks.rg import ReasoningGymTask
family, size, seed, config = json.loads(sys.stdin.read())
t = ReasoningGymTask(family, size=size, seed=seed, config=config)
entries = []
for i in range(len(t.dataset)):
    random.seed(f"whale:{family}:{seed}:{i}")  # a str seed does not follow the hashing
    numpy.random.seed(random.getrandbits(32))
    entries.append(t.dataset[i])
with os.fdopen(pipe, "wb") as f:
    f.write(pickle.dumps(entries))
"""


def needs_child(family: str, plain_config: dict[str, Any]) -> bool:
    """Whether this process would make other entries than the child (`made_in_child`)."""
    names = {family}
    if family == "composite":
        specs = plain_config.get("datasets") or []
        names = {str(s.get("name")) for s in specs if isinstance(s, dict)}
    if names & UNSEEDED:
        return True
    # PYTHONHASHSEED=0 here: the child's own hashing
    return sys.flags.hash_randomization != 0 and bool(names & HASH_DEPENDENT)


def made_in_child(family: str, size: int, seed: int, plain_config: dict[str, Any]) -> list[Any]:
    """The dataset's entries, made by a child interpreter that hashes with seed 0 and seeds
    the global generators before each entry (its own code, not a harness's: what it sends
    back is unpickled as is)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, _ROOT, *(os.path.abspath(p) for p in sys.path)],
        input=json.dumps([family, size, seed, plain_config]).encode(),
        capture_output=True, env=env, timeout=1800, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        tail = p.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"rg:{family}: making its questions failed: {' / '.join(tail)}")
    entries: list[Any] = pickle.loads(p.stdout)
    return entries
