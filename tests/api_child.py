"""A `whale.adapt` from Python with slow scripted models, for tests/test_api.py to kill."""

import sys
from pathlib import Path

import whale
from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, SumTask, prose_solver

if __name__ == "__main__":
    solver = prose_solver()
    solver.delay_s = 0.2  # slow enough to be killed mid-run
    whale.adapt(SumTask(), SEED, solver, ScriptedModel([GOOD_EDIT]), out=Path(sys.argv[1]),
                rounds=1, g=2, dev=6, eval=6, feedback=3, workers=2)
