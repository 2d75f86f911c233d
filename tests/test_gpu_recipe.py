"""The GPU recipe's configs (docs/gpu/) are real configs of their commands: they load and pass
every check a run makes before it starts, and every file they name ships with the repo."""

from __future__ import annotations

from pathlib import Path

import pytest

from whale import config as cfgmod
from whale.schedule.cotrain import CotrainConfig
from whale.train.proposer.run import ProposerTrainConfig

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"cotrain-8gpu.toml": CotrainConfig, "train-proposer-8gpu.toml": ProposerTrainConfig}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_config_loads_and_validates(name: str) -> None:
    cfg = cfgmod.load(RECIPES[name], ROOT / "docs" / "gpu" / name, [])
    assert cfg.runtime.executor.kind == "ray"


def test_cotrain_recipe_names_a_shipped_accelerate_config() -> None:
    cfg = cfgmod.load(CotrainConfig, ROOT / "docs" / "gpu" / "cotrain-8gpu.toml", [])
    assert cfg.rsft.sft.launcher == "accelerate"
    assert (ROOT / cfg.rsft.sft.accelerate_config).is_file()


def test_recipe_document_names_only_files_that_exist() -> None:
    text = (ROOT / "docs" / "gpu-recipe.md").read_text()
    for rel in ("docs/gpu/cotrain-8gpu.toml", "docs/gpu/train-proposer-8gpu.toml",
                "configs/accelerate/ddp.yaml", "benchmarks/recipe_estimate.py"):  # fmt: skip
        assert rel in text, rel
        assert (ROOT / rel).is_file(), rel
