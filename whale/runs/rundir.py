"""The run directory: made new or taken for a resume, locked for the run's life, with the
config it was started with.

Each function raises a typed error naming the path (`whale.runs.errors`), never exits; the
CLI prints the message and exits 2. A lock (`whale.records.RunLock`) is returned to the caller,
who releases it when the command ends: the kernel drops it anyway when the process dies.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TypeVar

import tomli_w

from whale import config as cfgmod
from whale.records import LOCK_NAME, RecordError, RunLock, write_atomic
from whale.runs.errors import OutNotADirectory, RunDirError, RunDirNotEmpty

T = TypeVar("T")
CONFIG_NAME = "config.toml"


def check_out(out: str | None) -> None:
    """OutNotADirectory when `out` cannot become a run directory: it, or the nearest of its
    parents that exists, is not a directory. Nothing is made; None (the default place) passes."""
    if out is None:
        return
    path = Path(out)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise OutNotADirectory(f"--out {out}: {p} exists and is not a directory")
            return


def hold_run_dir(path: Path) -> RunLock:
    """The lock of run directory `path`, held until released: RunDirInUse when another whale
    process holds it, RunDirError when it cannot be locked (no such folder, a linked lock)."""
    try:
        return RunLock(path)
    except OSError as e:
        raise RunDirError(f"{path}: cannot lock it ({e.strerror or e})") from None


def new_run_dir(out: str | None, kind: str, label: str,
                root: Path = Path("runs")) -> tuple[Path, RunLock]:  # fmt: skip
    """A new run directory and its lock (`hold_run_dir`). `out`: made if absent, refused
    (RunDirNotEmpty) unless empty, OutNotADirectory when it is a file. Default:
    ROOT/KIND-LABEL-STAMP, made by an atomic mkdir; when two commands start in the same second
    the later one takes a -2, -3, ... suffix."""
    if out is None:
        return _stamped_dir(root, kind, label)
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise OutNotADirectory(f"--out {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"--out {path}: cannot create it ({e.strerror or e})").at(
            "out") from None
    lock = hold_run_dir(path)  # before the emptiness check: no other command fills it now
    if any(p.name != LOCK_NAME for p in path.iterdir()):
        lock.release()
        raise RunDirNotEmpty(f"run directory {path} is not empty (choose a new --out)")
    return path, lock


def _stamped_dir(root: Path, kind: str, label: str) -> tuple[Path, RunLock]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = root / f"{kind}-{label.replace(':', '_').replace('/', '_')}-{stamp}"
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot create {base.parent}: {e.strerror or e}") from None
    for n in range(1, 1000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            os.mkdir(path)  # no exist_ok: of two commands, one makes it, one moves on
        except FileExistsError:
            continue
        except OSError as e:
            raise RunDirError(f"cannot create run directory {path}: {e.strerror or e}") from None
        return path, hold_run_dir(path)
    raise RunDirError(f"cannot create a run directory {base}: 999 of that name exist")


def load_run_config(run_dir: Path, cls: type[T], name: str = CONFIG_NAME,
                    command: str = "whale") -> T:  # fmt: skip
    """The config a run directory was started (or last resumed) with, `run_dir/name`, checked
    as any config is (`whale.config.load`); RecordError naming the file when it is missing or
    does not load (`command`: named in the message, "whale adapt")."""
    path = run_dir / name
    if not path.exists():
        raise RecordError(f"{path}: missing (is {run_dir} a run directory of {command}?)")
    try:
        return cfgmod.load(cls, path)
    except cfgmod.ConfigError as e:
        raise RecordError(f"{path}: {e}") from None


def save_run_config(run_dir: Path, cfg: object, name: str = CONFIG_NAME) -> None:
    """Write `cfg` as `run_dir/name`, whole or not at all: what a resume is checked against."""
    write_atomic(run_dir / name, tomli_w.dumps(cfgmod.to_dict(cfg)))
