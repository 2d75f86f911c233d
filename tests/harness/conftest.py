import shutil

import pytest

from tests.fakes import ScriptedModel
from whale.harness import Budget, Limits, Runtime, launcher
from whale.harness.sandbox import Sandbox, nsjail_binary

_AVAILABLE = {"nsjail": nsjail_binary() is not None, "bwrap": shutil.which("bwrap") is not None}


@pytest.fixture
def model():
    return ScriptedModel()


@pytest.fixture(params=["nsjail", "bwrap"])
def sandbox(request) -> str:
    """Each jail backend by name; a test taking it runs once per backend (CI has both)."""
    if not _AVAILABLE[request.param]:
        pytest.skip(f"{request.param} is not installed")
    return request.param


@pytest.fixture(scope="session")
def helper() -> str:
    """The built whale-launch (built here as `make launcher` does, where it is missing)."""
    try:
        launcher.build()
    except launcher.LauncherBuildError as e:
        pytest.skip(f"whale-launch cannot be built here: {e}")
    path = launcher.helper()
    assert path is not None
    return path


@pytest.fixture(params=["helper", "chain"])
def launch(request) -> str:
    """Each way of starting a jail that a machine with util-linux has (launcher.py)."""
    if request.param == "helper":
        request.getfixturevalue("helper")
    elif launcher.chain_tools() is None:
        pytest.skip("sh, setpriv or prlimit is missing")
    return request.param


@pytest.fixture
def runtime(model, sandbox):
    """A runtime on `sandbox` with short timeouts so the hostile-harness tests stay fast."""
    return Runtime(
        model=model,
        budget=Budget(run_timeout_s=5.0),
        limits=Limits(cpu_s=10),
        sandbox=Sandbox(sandbox),
    )
