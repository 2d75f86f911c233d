"""One `run` contract (whale/harness/contract.py), the same verdict from Apply and the runtime."""

import pytest

from whale.harness import Runtime
from whale.harness.contract import MAX_SOURCE_CHARS, run_contract_fault
from whale.harness.sandbox import Sandbox
from whale.revise.edits import check_harness

KW_ONLY = "def run(q, env, *, k):\n    return q\n"
ASSIGNED = "def make():\n    return lambda q, env: q\n\nrun = make()\n"


def runtime_accepts(sandbox, source):
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(source, "x")
    assert t.status == "ok" or t.error.startswith("load: "), t.error
    return t.status == "ok"


@pytest.mark.parametrize("source", [KW_ONLY, ASSIGNED], ids=["kw-only", "assigned"])
def test_apply_and_the_runtime_refuse_alike(sandbox, source):
    # Before: Apply accepted KW_ONLY (the worker refused it) and refused ASSIGNED (the worker
    # ran it).
    assert check_harness(source) is not None
    assert not runtime_accepts(sandbox, source)


@pytest.mark.parametrize(
    "source",
    [
        "def run(*args):\n    return 'x'\n",
        "def run(q, env, *, k=1):\n    return 'x'\n",
        "def run(q, env, /, tries=3):\n    return 'x'\n",
    ],
)
def test_apply_and_the_runtime_accept_alike(sandbox, source):
    assert check_harness(source) is None
    assert runtime_accepts(sandbox, source)


def test_a_contract_fault_is_a_load_error_with_its_reason(runtime):
    t = runtime.run(KW_ONLY, "x")
    assert t.status == "error"
    assert t.error == "load: harness " + run_contract_fault(KW_ONLY)
    assert "keyword-only parameter k has no default" in t.error


@pytest.mark.parametrize(
    "source",
    [
        "def run(q, env):\n    return q\nrun = 3\n",
        "def run(q, env):\n    return q\ndef f():\n    global run\n",
        "def run(q, env):\n    return q\nfrom subprocess import *\n",
        "def run(q, env):\n    return q\ndef run(q, env):\n    return q\n",
        "if True:\n    def run(q, env):\n        return q\n",
        "from subprocess import run\n",
        "class run:\n    def __init__(self, q, env):\n        pass\n",
        "async def run(q, env):\n    return q\n",
        "import functools\n@functools.cache\ndef run(q, env):\n    return q\n",
    ],
)
def test_run_bound_other_than_by_one_plain_def_is_refused(source):
    assert run_contract_fault(source) is not None


@pytest.mark.parametrize(
    "source",
    [
        "def run(q, env):\n    return q\nclass A:\n    run = 1\n",
        "def run(q, env):\n    return q\nxs = [run for run in range(3)]\n",
        "def run(q, env):\n    run = 2\n    return q\n",
        "from math import *\ndef run(q, env):\n    return q\n",
    ],
)
def test_names_run_in_other_scopes_are_fine(source):
    assert run_contract_fault(source) is None


@pytest.mark.parametrize(
    "source",
    [
        "x = " + "-" * 100_000 + "1\n",  # the parser runs out of memory or stack
        "x = " + "(" * 300 + ")" * 300 + "\n",
        "x = 1\0\n",
        "x = '" + "a" * (MAX_SOURCE_CHARS + 1) + "'\n",
    ],
    ids=["unary-100k", "parens-300", "nul", "too-long"],
)
def test_hostile_source_gets_a_verdict_not_an_exception(source):
    fault = run_contract_fault(source)
    assert fault is not None and ("does not parse" in fault or "over the limit" in fault)
