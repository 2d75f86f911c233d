"""The longest token of a GGUF vocabulary (the unit of the broker's prompt bound)."""

import pytest

from tests.conftest import require_model
from tests.models.gguf_writer import vocab_gguf, write_gguf
from whale.models.vocab import longest_token_bytes


def test_the_longest_token_is_measured_in_bytes_of_its_stored_text(tmp_path):
    # "Ġ" (the GPT-2 map of a space) is 2 bytes: 128 of them are 256, Qwen2's longest.
    path = vocab_gguf(tmp_path / "v.gguf", ["a", "hello", "Ġ" * 128, "<|im_start|>"])
    assert longest_token_bytes(path) == 256


def test_a_file_without_a_vocabulary_gives_none(tmp_path):
    path = write_gguf(tmp_path / "v.gguf", [("general.architecture", 8, "llama")])
    assert longest_token_bytes(path) is None


@pytest.mark.parametrize("data", [b"", b"GGUF", b"not a gguf at all", b"GGUF\x01\0\0\0" + b"\0" * 16])
def test_a_file_that_is_not_a_gguf_gives_none(tmp_path, data):
    (tmp_path / "v.gguf").write_bytes(data)
    assert longest_token_bytes(tmp_path / "v.gguf") is None


def test_a_truncated_vocabulary_gives_none(tmp_path):
    path = vocab_gguf(tmp_path / "v.gguf", ["a", "b" * 40, "c"])
    path.write_bytes(path.read_bytes()[:-60])  # into the last token (the merges: 56 bytes)
    assert longest_token_bytes(path) is None


def test_a_missing_file_gives_none(tmp_path):
    assert longest_token_bytes(tmp_path / "absent.gguf") is None


def test_a_replaced_file_is_read_again(tmp_path):
    path = vocab_gguf(tmp_path / "v.gguf", ["ab"])
    assert longest_token_bytes(path) == 2
    vocab_gguf(path, ["abc" * 10])
    assert longest_token_bytes(path) == 30


@pytest.mark.model
def test_the_default_solver_s_longest_token_is_256_bytes():
    # Qwen2.5's vocabulary, as measured with llama.cpp's own gguf reader.
    assert longest_token_bytes(require_model("qwen-coder-0.5b")) == 256
