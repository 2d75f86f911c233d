"""Fixtures shared by the training tests: the tiny local model (see tests/tiny.py)."""

from pathlib import Path

import pytest

from tests.tiny import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny tokenizer + random Qwen2 model, built once per test session."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_model"))
