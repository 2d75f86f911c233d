"""The typed errors of the run machinery: what a caller catches instead of an exit.

Each is a `whale.WhaleError` (its `field` names the config field at fault where there is one)
and a ValueError; each message names the path or the dotted config field, worded as the CLI
prints it (the CLI turns each into exit 2 with the message). `RecordError` (a record file
that cannot be trusted) and `RunDirInUse` (another process holds the lock) are defined beside
the record I/O in `whale.records`, which layers below this one use too.
"""

from __future__ import annotations

from whale.config import ConfigError
from whale.errors import WhaleError
from whale.records import RecordError, RunDirInUse

__all__ = ["OutNotADirectory", "RecordError", "ResumeMismatch", "RunDirError", "RunDirInUse",
           "RunDirNotEmpty"]  # fmt: skip


class ResumeMismatch(ConfigError):
    """A resumed run was asked to change a field that defines its experiment (the message
    names the field, its saved and its requested value, and what may change). A ConfigError
    (a ValueError): a config that cannot be run, like any other."""


class RunDirError(WhaleError, ValueError):
    """A run directory cannot be made or taken: a folder that cannot be created or locked.
    The message names the path."""


class OutNotADirectory(RunDirError):
    """`out` (`--out`), or the nearest of its parents that exists, is not a directory."""

    field = "out"


class RunDirNotEmpty(RunDirError):
    """`out` names a directory that already holds something: a new run needs an empty one."""

    field = "out"
