"""Allowed packages (`runtime.packages`): the third-party packages a jailed harness may import.

The jail shows a harness the standard library only (sandbox.py masks every site-packages).
`runtime.packages` names a set it may import besides, in one of two ways:

- a list of requirements (`["openai>=1.40", "./wheels/mylib-1.0-py3-none-any.whl"]`): whale
  installs them once with `pip install --target` into `<cache>/packages/<key>` (the cache is
  `$WHALE_CACHE` or ~/.cache/whale), where the key covers the sorted requirements, the content
  of those that are local files, and the interpreter (version, ABI, platform). The install runs
  in a temporary folder renamed into place once pip succeeded, so a killed build leaves
  nothing that is later trusted (its leftovers are removed by the next build of that key), and
  under a lock file so that two commands never build one folder at once (the second waits,
  then reuses it). Later commands with the same set reuse the folder without running pip;
  delete it to install again (say, for a newer release that `>=` would now pick).
- a path to a virtual environment: its site-packages is used as it is. Its Python must be the
  jail's major.minor version (compiled modules are built for one ABI); whale's own environment
  is refused, as it holds whale and the tasks' packages (a question generator is an oracle).

pip runs under whale's own interpreter (`sys.executable`): in a venv that is a link to the
base interpreter the jail runs (`sandbox.python_executable()`), so the tags pip picks, compiled
wheels included, are the jail's. The folder is mounted read-only, nosuid and nodev at
`PACKAGES_INSIDE` (workers.py), and the worker puts it on sys.path after the standard library
with its .pth files processed (`site.addsitedir`); only then, so a run without packages starts
as before. Files are made world-readable after the install: the jail runs as another uid.

Not covered: what pip resolves for a requirement is fixed by the first build of its key (the
key holds the text of a requirement, not what an index serves); a local folder named as a
requirement is keyed by its path, not its content; links in a venv that point outside its
site-packages (editable installs) do not resolve inside the jail; a venv of the same version
but another build of Python (debug, free-threaded) is not told apart.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from whale.config import ConfigError, FieldError

PACKAGES_INSIDE = "/whale/packages"  # where the jail sees the set (read-only)
FIELD = "runtime.packages"
BUILD_TIMEOUT_S = 1800  # one pip install, downloads included
PIP_TAIL_LINES = 20  # of pip's output, in the ConfigError of a failed install
MAX_REQUIREMENTS = 256
MAX_NAMES = 64  # the most package names the proposer is told (a venv may hold hundreds)
_FORMAT = 1  # of the build key: bumped when what a folder holds changes meaning


@dataclass(frozen=True)
class PackageSet:
    """A resolved `runtime.packages`: the host folder the jail mounts, and the names a proposer
    is told (the requirements' names, or the distributions of a venv)."""

    folder: str
    names: tuple[str, ...]


# -- the config value --------------------------------------------------------------------------


def check_packages(value: list[str] | str) -> None:
    """The shape of a `runtime.packages` value (FieldError naming `packages`); what it names
    is checked by `resolve_packages`."""
    if isinstance(value, str):
        if not value.strip() or _control(value):
            raise FieldError("packages", f"{value!r} is not a path to a virtual environment "
                             "(give a list of requirements, or a venv's path)")  # fmt: skip
        return
    if not isinstance(value, list | tuple):  # the Python API takes what a caller passes
        raise FieldError("packages", f"{type(value).__name__} is not a list of requirements "
                         "or a venv's path")  # fmt: skip
    if len(value) > MAX_REQUIREMENTS:
        raise FieldError("packages", f"at most {MAX_REQUIREMENTS} requirements "
                         f"(got {len(value)})")  # fmt: skip
    for req in value:
        if not isinstance(req, str):
            raise FieldError("packages", f"{req!r:.80} is not a requirement (a string)")
        if not req.strip() or _control(req) or len(req) > 1000:
            raise FieldError("packages", f"{req[:80]!r} is not a requirement")
        if req.strip().startswith("-"):  # pip options (-r, -e, --index-url) are not packages
            raise FieldError("packages", f"{req[:80]!r} is a pip option, not a requirement")


def _control(text: str) -> bool:
    return any(ord(c) < 32 or c == "\x7f" for c in text)


_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_WHEELS = (".whl", ".tar.gz", ".tar.bz2", ".zip")  # file names of the form NAME-VERSION...


def requirement_name(req: str) -> str:
    """The package a requirement names: `openai>=1.40` -> openai, `x[extra] @ URL` -> x, a
    path or URL of a wheel or sdist -> the name in its file name, a folder or a repository
    -> its name."""
    text = req.split(";", 1)[0].strip()
    if "@" in text and "://" not in text.split("@", 1)[0]:
        text = text.split("@", 1)[0].strip()
    elif "/" in text or "\\" in text or text.endswith(_WHEELS):
        base = re.split(r"[/\\]", text.rstrip("/\\"))[-1].removesuffix(".git")
        text = base.split("-", 1)[0] if base.endswith(_WHEELS) else base
    m = _NAME.match(text)
    return m.group(0) if m else text[:80]


# -- resolving -----------------------------------------------------------------------------------


def packages_root() -> Path:
    return Path(os.environ.get("WHALE_CACHE") or Path.home() / ".cache" / "whale") / "packages"


def resolve_packages(value: list[str] | str, root: Path | None = None) -> PackageSet | None:
    """The folder `value` (a RuntimeConfig's `packages`) stands for: None for the empty list
    (the standard library only); a venv's site-packages, checked; or the folder its
    requirements are installed in, built now unless an earlier command built it.
    ConfigError naming runtime.packages when a venv does not fit or pip fails."""
    try:
        check_packages(value)
    except FieldError as e:
        raise ConfigError(f"runtime.{e}", FIELD) from None
    if isinstance(value, str):
        return venv_packages(value)
    if not value:
        return None
    folder = build_folder(value, root or packages_root())
    _refuse_whale(folder, "its requirements install")
    return PackageSet(str(folder), _told(list(dict.fromkeys(requirement_name(r) for r in value))))


def _refuse_whale(site: Path, how: str) -> None:
    """ConfigError when the set holds whale (its task generators and graders are an oracle in
    the jail, the reason whale's own environment is refused): a venv it is installed in, or
    requirements that install it, directly or as a dependency."""
    if (site / "whale").is_dir() or any(site.glob("whale-*.dist-info")):
        raise ConfigError(f"{FIELD}: {how} whale itself, which a harness must not import (its "
                          "tasks' generators and graders answer the questions); give a set "
                          "without it", FIELD)  # fmt: skip


def venv_packages(path: str) -> PackageSet:
    """The site-packages of the venv at `path`, if its Python is the jail's version."""
    venv = Path(path).expanduser().absolute()
    if not venv.is_dir():
        raise ConfigError(f"{FIELD}: no virtual environment at {path}", FIELD)
    cfg = venv / "pyvenv.cfg"
    if not cfg.is_file():
        raise ConfigError(f"{FIELD}: {path} is not a virtual environment (no pyvenv.cfg)", FIELD)
    if venv.resolve() == Path(sys.prefix).resolve():
        raise ConfigError(f"{FIELD}: {path} is whale's own environment, which holds whale and "
                          "the tasks' packages; make a venv that holds only what the harness "
                          "needs", FIELD)  # fmt: skip
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    have = _venv_version(cfg.read_text(encoding="utf-8", errors="replace"))
    if have is not None and ".".join(have.split(".")[:2]) != want:
        raise ConfigError(f"{FIELD}: {path} is a Python {have} environment; the jail runs "
                          f"Python {platform.python_version()} (compiled modules are built for "
                          "one version)", FIELD)  # fmt: skip
    site = venv / "lib" / f"python{want}" / "site-packages"
    if not site.is_dir():
        others = sorted(p.parent.name for p in (venv / "lib").glob("*/site-packages"))
        has = f" (it has {', '.join(others)})" if others else ""
        raise ConfigError(f"{FIELD}: {path} has no lib/python{want}/site-packages{has}", FIELD)
    _refuse_whale(site, f"{path} holds")
    names = sorted({p.name.split("-", 1)[0] for p in site.glob("*.dist-info")}, key=str.lower)
    return PackageSet(str(site.resolve()), _told(names))


def _told(names: list[str]) -> tuple[str, ...]:
    """At most MAX_NAMES names, then how many more: a prompt line of bounded length."""
    if len(names) <= MAX_NAMES:
        return tuple(names)
    return (*names[:MAX_NAMES], f"{len(names) - MAX_NAMES} more")


def _venv_version(text: str) -> str | None:
    """`version` (venv) or `version_info` (uv, virtualenv) of a pyvenv.cfg."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() in ("version", "version_info"):
            return value.strip()
    return None


def build_key(requirements: Sequence[str]) -> str:
    """What a built folder holds: the sorted requirements, the bytes of those that are local
    files (a rebuilt wheel of one version gets a new folder), and the interpreter."""
    reqs = sorted({r.strip() for r in requirements})
    files = {r: _digest(r) for r in reqs if os.path.isfile(r)}
    # A local folder by where it is: "." (or "../lib") is another folder in another project,
    # and was one key, so one project's build was reused for the other's.
    folders = {r: os.path.abspath(r) for r in reqs if os.path.isdir(r)}
    what = {
        "format": _FORMAT,
        "requirements": reqs,
        "files": files,
        **({"folders": folders} if folders else {}),  # none: the keys of builds before them
        "python": platform.python_version(),
        "cache_tag": sys.implementation.cache_tag,
        "soabi": sysconfig.get_config_var("SOABI"),
        "platform": sysconfig.get_platform(),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_folder(requirements: Sequence[str], root: Path) -> Path:
    """`root/<key>`, pip-installed once: under `root/<key>.lock`, in `root/<key>.tmp-*`, then
    renamed into place. A folder of that name is complete (the rename is the last step)."""
    root.mkdir(parents=True, exist_ok=True)
    key = build_key(requirements)
    final = root / key
    if final.is_dir():
        return final
    with open(root / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or its owner dies)
        if final.is_dir():  # built by the command that held the lock before us
            return final
        for stale in root.glob(f"{key}.tmp-*"):  # a build that was killed: never trusted
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f"{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            print(f"whale: {FIELD}: installing {len(requirements)} requirement(s) into {final} "
                  "(once; later commands reuse it)", file=sys.stderr, flush=True)  # fmt: skip
            pip_install(sorted({r.strip() for r in requirements}), tmp)
            _make_readable(tmp)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; else a failure's
    return final


def pip_install(requirements: Sequence[str], target: Path) -> None:
    """`pip install --target` under whale's interpreter (the jail's, see the module docstring);
    ConfigError with pip's last lines when it fails or runs past BUILD_TIMEOUT_S."""
    cmd = [sys.executable, "-m", "pip", "install", "--target", str(target), "--no-input",
           "--disable-pip-version-check", "--no-warn-script-location", "--progress-bar", "off",
           "--", *requirements]  # fmt: skip
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=BUILD_TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{FIELD}: pip ran past {BUILD_TIMEOUT_S} s installing "
                          f"{', '.join(requirements)}", FIELD) from None  # fmt: skip
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        tail = "\n".join(lines[-PIP_TAIL_LINES:]) or f"exit status {done.returncode}"
        raise ConfigError(f"{FIELD}: pip could not install {', '.join(requirements)}:\n{tail}",
                          FIELD)  # fmt: skip


def _make_readable(folder: Path) -> None:
    """Folders a+rx, files a+r (executables keep their x bits): the jail's uid is not ours,
    and a umask of 077 would hide the set from it."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                continue
            extra = 0o555 if stat.S_ISDIR(mode) else 0o444
            os.chmod(path, stat.S_IMODE(mode) | extra)
    os.chmod(folder, stat.S_IMODE(os.stat(folder).st_mode) | 0o555)
