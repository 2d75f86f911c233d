import os
import signal

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


# A suite started in the background by a non-interactive shell (`make test &`, `nohup ... &`)
# inherits SIGINT ignored, and so does every interpreter it starts: the Ctrl-C tests
# (tests/test_interrupt.py, the launcher's and the Ray executor's) would then see no
# KeyboardInterrupt. The suite tests what Ctrl-C does, so it starts from Python's default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _signal_handlers_are_put_back():
    """A test that leaves a SIGINT/SIGTERM handler of its own behind (a command run in-process
    whose handlers were not restored, a library that installs one) would change what Ctrl-C
    does in every later test (tests/test_interrupt.py sends real signals). Put the handlers
    back after each test, and warn naming the test, so the leak is seen and does not spread."""
    import signal
    import warnings

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in before.items():
        if signal.getsignal(s) is not h:
            warnings.warn(f"{s.name} handler left changed: {signal.getsignal(s)!r}", stacklevel=1)
            signal.signal(s, h)
