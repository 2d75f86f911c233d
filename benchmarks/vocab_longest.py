"""The longest token, in bytes, of each test vocabulary llama.cpp ships (in the llama-cpp-python
sdist that `make install` downloads), read by `whale.models.vocab.longest_token_bytes`: why the
broker's prompt bound reads it from the model file instead of assuming a chars-per-token factor.

    python -m benchmarks.vocab_longest [--sdist PATH]   (default: the one in ~/.cache/whale)
"""

from __future__ import annotations

import argparse
import tarfile
import tempfile
from pathlib import Path

from whale.models.vocab import longest_token_bytes

SDIST = Path.home() / ".cache/whale/wheels/llama_cpp_python-0.3.36.tar.gz"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdist", type=Path, default=SDIST)
    a = ap.parse_args()
    found: dict[str, int | None] = {}
    with tarfile.open(a.sdist) as tar, tempfile.TemporaryDirectory() as tmp:
        for m in tar.getmembers():
            name = Path(m.name).name
            if m.isfile() and name.startswith("ggml-vocab-") and name.endswith(".gguf"):
                out = Path(tmp) / name
                src = tar.extractfile(m)
                assert src is not None
                out.write_bytes(src.read())
                found[name] = longest_token_bytes(out)
    for name, n in sorted(found.items()):
        print(f"{name:40s} {n}")
    sizes = [n for n in found.values() if n is not None]
    print(f"{len(found)} vocabularies; longest token {min(sizes)} to {max(sizes)} bytes")


if __name__ == "__main__":
    main()
