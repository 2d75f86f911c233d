"""What every run's start pays for in the jail: the worker and its endpoint import only built-in
modules and a few extension modules, not `os` (posixpath, stat, _collections_abc: 0.9 ms of
CPU per run on a 2-core Xeon) or `struct` (docs/measurements.md)."""

import subprocess

from whale.harness.sandbox import python_executable
from whale.harness.workers import endpoint_file, worker_file

LOAD = """
import marshal, sys
before = set(sys.modules)
for path, name in ((%r, "worker"), (%r, "endpoint")):
    with open(path, "rb") as f:
        exec(marshal.loads(f.read()[16:]), {"__name__": name})
print(" ".join(sorted(set(sys.modules) - before)))
"""


def test_loading_the_worker_and_its_endpoint_imports_neither_os_nor_struct():
    out = subprocess.run(
        [python_executable(), "-I", "-S", "-c", LOAD % (worker_file(), endpoint_file())],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    assert "_json" in out and "_socket" in out  # what it does load is seen
    for heavy in ("os", "posixpath", "_collections_abc", "struct", "typing", "re", "json"):
        assert heavy not in out, out
