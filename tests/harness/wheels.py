"""Wheels made on the spot, so that tests of `runtime.packages` install with pip from local
files only (no index): a wheel from given files, and one from a distribution installed in
whale's own environment (a compiled one, pydantic_core, as PyPI built it)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import zipfile
from collections.abc import Mapping
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(folder: Path, name: str, version: str, files: Mapping[str, bytes | str],
                tag: str = "py3-none-any", requires: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """`folder/NAME-VERSION-TAG.whl` holding `files` (path in the wheel -> content)."""
    dist = f"{name}-{version}.dist-info"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents: dict[str, bytes] = {
        path: data.encode() if isinstance(data, str) else data for path, data in files.items()
    }
    contents[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}"
    ).encode()
    purelib = "true" if tag.endswith("none-any") else "false"
    contents[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: whale-tests\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n"
    ).encode()
    record = [_record_line(p, d) for p, d in contents.items()] + [f"{dist}/RECORD,,"]
    contents[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in contents.items():
            z.writestr(p, d)
    return path


def rewheel(dist_name: str, folder: Path) -> Path:
    """The installed distribution `dist_name` as a wheel again (its files as installed, no
    byte code), with its own first tag: a compiled one stays the build PyPI made."""
    dist = importlib.metadata.distribution(dist_name)
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]  # fmt: skip
    files: dict[str, bytes | str] = {}
    for f in dist.files or []:
        path = str(f)
        if "__pycache__" in path or ".dist-info/" in path or path.startswith(".."):
            continue
        files[path] = Path(str(f.locate())).read_bytes()
    meta = dist.metadata
    requires = tuple(r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r)
    name = meta["Name"].replace("-", "_")
    return write_wheel(folder, name, meta["Version"], files, tags[0], requires)
