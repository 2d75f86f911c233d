"""The Python API takes a folder harness by its path, or its bundle as source text."""

from __future__ import annotations

import whale
from tests.bundles import write
from tests.fakes import ScriptedModel
from tests.revise.conftest import SumTask
from whale.harness.bundle import read_folder


def test_evaluate_takes_a_folder_by_path_and_records_it_as_one_harness(tmp_path):
    seed = write(tmp_path / "seed")
    run = whale.evaluate(SumTask(), str(seed), ScriptedModel(["7"]), n=3, out=tmp_path / "e")
    assert run.harness == read_folder(seed)
    assert (run.run_dir / "harness.py").read_text() == run.harness
    assert run.held_out["harness"].n == 3 and [o.answer for o in run.outcomes] == ["7!"] * 3


def test_evaluate_takes_the_bundle_text_as_source(tmp_path):
    src = read_folder(write(tmp_path / "seed"))
    run = whale.evaluate(SumTask(), src, ScriptedModel(["7"]), n=2, out=tmp_path / "e")
    assert run.harness == src and run.records["harness"] == "<source>"
