"""Reasoning Gym questions are the same in every process: eight generators follow the
process's string hashing (whale/tasks/rg_entries.py), so whale makes their entries in a child
that hashes with seed 0."""

import os
import subprocess
import sys

import pytest

from whale.tasks.rg_entries import HASH_DEPENDENT, needs_child

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WHALE_QUESTIONS = """
import hashlib, sys
from whale.tasks import load_task
size, seed = (int(a) for a in sys.argv[2:4]) if len(sys.argv) > 2 else (40, 3)
t = load_task("rg:" + sys.argv[1], size=size, seed=seed)
print(hashlib.sha256("|".join(q.prompt for q in t.questions()).encode()).hexdigest())
"""

RAW_QUESTIONS = """
import hashlib, sys, reasoning_gym
ds = reasoning_gym.create_dataset(sys.argv[1], seed=3, size=40)
print(hashlib.sha256("|".join(ds[i]["question"] for i in range(len(ds))).encode()).hexdigest())
"""


def _digest(code: str, family: str, hash_seed: str, *size_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", code, family, *size_seed], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return out.stdout.strip()


@pytest.mark.parametrize("family", ["isomorphic_strings", "ransom_note"])
def test_whales_questions_do_not_follow_the_processs_hashing(family):
    assert _digest(WHALE_QUESTIONS, family, "1") == _digest(WHALE_QUESTIONS, family, "2")


@pytest.mark.parametrize("family", ["isomorphic_strings", "ransom_note"])
def test_the_generators_themselves_still_do(family):
    """Else the child is no longer needed for them (a newer reasoning_gym fixed them)."""
    assert _digest(RAW_QUESTIONS, family, "1") != _digest(RAW_QUESTIONS, family, "2")


def test_the_child_is_used_only_where_hashing_would_change_the_entries():
    assert needs_child("ransom_note", {}) == (sys.flags.hash_randomization != 0)
    assert not needs_child("gcd", {})
    mixed = {"datasets": [{"name": "gcd"}, {"name": "word_ladder"}]}
    assert needs_child("composite", mixed) == (sys.flags.hash_randomization != 0)
    assert not needs_child("composite", {"datasets": [{"name": "gcd"}]})
    assert len(HASH_DEPENDENT) == 8


def test_the_child_imports_the_whale_that_runs_whatever_the_working_folder(tmp_path, monkeypatch):
    """`python -c` puts the working folder first on the child's sys.path: a folder there named
    `whale` (or json.py, random.py) was imported instead of this process's modules."""
    from whale.tasks.rg_entries import made_in_child

    (tmp_path / "whale").mkdir()
    (tmp_path / "whale" / "__init__.py").write_text("raise ImportError('not the whale that runs')")
    (tmp_path / "random.py").write_text("raise ImportError('not the random module')")
    monkeypatch.chdir(tmp_path)
    entries = made_in_child("ransom_note", 2, 0, {})
    assert len(entries) == 2 and all("question" in e for e in entries)


@pytest.mark.parametrize("family", ["list_functions", "codeio"])
def test_whales_questions_are_the_same_in_two_processes_that_hash_alike(family):
    """These two generators also draw from the unseeded global `random` (list_functions) and
    numpy.random (codeio's code samples): the same hashing is not enough."""
    digest = _digest(WHALE_QUESTIONS, family, "0", "60", "0")
    assert _digest(WHALE_QUESTIONS, family, "0", "60", "0") == digest
    assert _digest(WHALE_QUESTIONS, family, "1", "60", "0") == digest


def test_what_a_generator_prints_does_not_reach_the_entries_pipe():
    """codeio prints to stdout when a code sample raises (seed 0's entry 149, made here as
    seed 149's entry 0): the child's stdout carried the pickle, which then did not load."""
    from whale.tasks.rg_entries import made_in_child

    (entry,) = made_in_child("codeio", 1, 149, {})
    assert entry["question"]
