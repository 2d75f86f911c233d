"""The per-round records of `whale adapt`: `round_NN/` and the diffs of its candidates.

The rollout ledger these rounds score through is every command's, in `whale.runs.ledger`.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

from whale.records import RecordError, open_record, read_json, record_dir, write_atomic


class RoundDir:
    """round_NN/: report, prompt, proposals, candidates with diffs, decision. Every file is
    written whole (tmp + rename), and read back as RecordError when it is not valid."""

    def __init__(self, run_dir: Path, t: int) -> None:
        self.path = record_dir(run_dir / f"round_{t:02d}")

    def has(self, name: str) -> bool:
        return (self.path / name).exists()

    def write_text(self, name: str, text: str) -> None:
        # Reports quote harness output, which may hold lone surrogates: escaped, not a crash.
        write_atomic(self.path / name, text, errors="backslashreplace")

    def write_json(self, name: str, obj: Any) -> None:
        write_atomic(self.path / name, json.dumps(obj, indent=2))

    def read_json(self, name: str) -> Any:
        return read_json(self.path / name)

    def read_bytes(self, name: str) -> bytes | None:
        """The file as written, None when it is not there (never through a link)."""
        try:
            fd = open_record(self.path / name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RecordError(f"{self.path / name}: {e.strerror or e}") from None
        with open(fd, "rb") as f:
            return f.read()

    def remove(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)


def diff(parent: str, child: str) -> str:
    return "".join(
        difflib.unified_diff(
            parent.splitlines(keepends=True),
            child.splitlines(keepends=True),
            "parent.py",
            "candidate.py",
        )
    )
