import pytest

from tests.fakes import ScriptedModel
from whale.harness import Budget, Limits, Runtime


@pytest.fixture
def model():
    return ScriptedModel()


@pytest.fixture
def runtime(model):
    """An nsjail runtime with short timeouts so the hostile-harness tests stay fast."""
    return Runtime(model=model, budget=Budget(run_timeout_s=5.0), limits=Limits(cpu_s=10))
