"""A small harness of several files, written as a folder for the tests of folder harnesses.

The entry imports a module (`util`) and a module of a package folder without `__init__.py`
(`helpers/text.py`), and that module imports a sibling of its package relatively.
"""

from __future__ import annotations

from pathlib import Path

from whale.harness.bundle import HEAD, TAIL

FILES = {
    "harness.py": (
        "import util\n"
        "from helpers import text\n"
        "\n"
        "\n"
        "def run(question, env):\n"
        "    reply = env.llm(question)\n"
        "    return text.shout(util.clean(reply))\n"
    ),
    "util.py": "def clean(reply):\n    return str(reply).strip()\n",
    "helpers/text.py": (
        "from . import marks\n\n\ndef shout(s):\n    return s.upper() + marks.BANG\n"
    ),
    "helpers/marks.py": "BANG = '!'\n",
}


def write(root: Path, files: dict[str, str] | None = None) -> Path:
    """`files` (default FILES) as a folder at `root`; returns `root`."""
    for path, text in (files or FILES).items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return root


def bundle(files: dict[str, str]) -> str:
    """The bundle text of `files` written by hand (no checks: for hostile bundles)."""
    return "".join(f"{HEAD}{path}{TAIL}\n{text}" for path, text in files.items())
