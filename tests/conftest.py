import os

import pytest

from whale.models.catalog import is_installed, model_path


def require_model(name: str):
    """Path of an installed catalog model. `make test` installs them; a missing model is a
    failure (not a skip) unless WHALE_SKIP_MODEL_TESTS=1 says why it is absent."""
    if not is_installed(name):
        if os.environ.get("WHALE_SKIP_MODEL_TESTS") == "1":
            pytest.skip(f"{name} not installed and WHALE_SKIP_MODEL_TESTS=1")
        pytest.fail(
            f"model {name} is not installed: run `whale models install {name}` (make install)"
        )
    return model_path(name)
