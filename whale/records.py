"""Files a run writes and a later run reads back: JSONL records, atomic writes, the run lock.

What a harness returns ends up in these files, so nothing here trusts their content:
- JSONL is written ASCII-only (`ensure_ascii`), one record per line, and read back split on
  b"\\n" only. An answer holding U+2028, U+0085, "\\r" or a lone surrogate stays inside its
  record (`str.splitlines()` would have cut it). Each line is decoded and parsed on its own.
- A line that does not parse as a JSON object is a `RecordError` naming the file and the line,
  except the last line of a file that does not end in "\\n": that is a record a killed writer
  left half-written, and it is dropped. `JsonlWriter` cuts such a torn tail off before it
  appends, so it never becomes a malformed line in the middle.
- `write_atomic` writes a temporary file beside the target and renames it over: a killed
  write leaves the old file or the new one, never a part. Not covered: power loss (no fsync).
  `replace_dir` does the same for a folder (a saved adapter), by swapping the two names.
- `RunLock` is an exclusive `flock` on `<run dir>/.lock`, held for a command's life and
  dropped by the kernel when the process dies (kill -9 included), so a stale lock never
  blocks. Not covered: filesystems where flock is not shared between machines (some NFS).
- A run directory's record files are opened without following links (O_NOFOLLOW) and must
  be regular files (`open_record`): a ledger replaced by a symlink to a file outside the run,
  or by a FIFO, is a `RecordError` naming it, never written through (or read from, or blocked
  on). `write_atomic` makes its temporary file with O_EXCL | O_NOFOLLOW and renames it over
  the name, so a link there is replaced, never followed. `record_dir` refuses a sub-folder
  that is a link. Not covered: a link in the path above the run directory (the user's
  choice of path), hard links.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

from whale.errors import WhaleError

LOCK_NAME = ".lock"


class RecordError(WhaleError, ValueError):
    """A record file is missing, cut or malformed; the message names the file (and line)."""


class RunDirInUse(WhaleError, RuntimeError):
    """Another process holds the run directory's lock."""


def open_record(path: Path, flags: int) -> int:
    """A descriptor of run-directory record file `path` (os.open `flags`, plus O_CREAT where
    given), or RecordError naming it when it is a symbolic link or not a regular file: a
    record is never written through (or read from) a link that may point out of the run."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):  # before open: a FIFO would block
        raise RecordError(_not_regular(path, st.st_mode))
    try:  # O_NONBLOCK: a FIFO swapped in after the lstat fails or returns, never blocks
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # swapped for a link / a FIFO meanwhile
            raise RecordError(_not_regular(path, stat.S_IFLNK)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise RecordError(_not_regular(path, st.st_mode))
    os.set_blocking(fd, True)
    return fd


def _not_regular(path: Path, mode: int) -> str:
    what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
    return (f"{path}: {what}; whale neither reads nor writes a run directory's records "
            "through it (replace it with the run's own file, or start a new run directory)")


def record_dir(path: Path) -> Path:
    """Sub-folder `path` of a run directory, made if absent; RecordError when it is a link
    (records written under it would land wherever it points) or not a folder."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a dangling link or a file: refused below
        pass
    except (FileNotFoundError, NotADirectoryError):  # a dangling link or a file on the way
        raise RecordError(f"{path}: a folder on the way is a dangling link or a file; whale "
                          "does not write a run's records there") from None  # fmt: skip
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise RecordError(f"{path}: a folder on the way is a dangling link") from None
    if not stat.S_ISDIR(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
        raise RecordError(f"{path}: {what}; whale does not write a run's records through it "
                          "(replace it with the run's own folder, or start a new run directory)")
    return path


def write_atomic(path: Path, text: str | bytes, errors: str = "strict") -> None:
    """`text` as UTF-8 (bytes as they are) into `path`, whole or not at all (`errors`: as for
    str.encode). The
    temporary file is made new (O_EXCL | O_NOFOLLOW), and the rename replaces a link at
    `path` rather than writing through it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a leftover of a killed process with the same pid
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)  # fmt: skip
        with open(fd, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode("utf-8", errors))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` in one step (Linux renameat2 RENAME_EXCHANGE); False where
    the kernel, the C library or the filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28 (or not Linux)
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # EINVAL: the fs has no exchange
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(new: Path, out: Path) -> None:
    """Put the folder `new` at `out` (an adapter a trainer saved beside it), replacing the old
    `out` whole: a kill at any point leaves the old folder or the new one at `out`, never
    neither. Where the two names cannot be swapped in one step (not Linux), the old folder is
    moved aside first and a kill between the two renames leaves `out` missing (the old one
    at `out.old`)."""
    if not out.exists():
        os.replace(new, out)
        return
    if _exchange(new, out):
        if new.is_symlink() or not new.is_dir():  # `out` was a link or a file: removed,
            new.unlink()  # a link never followed
        else:
            shutil.rmtree(new)  # now the old folder
        return
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)


def read_json(path: Path) -> Any:
    """The JSON value in `path`, or RecordError naming the file (missing, cut, not JSON, a
    link or not a regular file: `open_record`)."""
    try:
        fd = open_record(path, os.O_RDONLY)
    except FileNotFoundError:
        raise RecordError(f"{path}: missing") from None
    except OSError as e:
        raise RecordError(f"{path}: {e.strerror or e}") from None
    with open(fd, "rb") as f:
        data = f.read()
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON (cut short, edited)
        raise RecordError(f"{path}: not valid JSON, cut short or edited? ({e})") from None


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def iter_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every record; [] when the file does not exist. A link or a
    FIFO there is a RecordError (`open_record`)."""
    try:
        fd = open_record(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    with open(fd, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends in "\n"; else what a killed writer left
    out = []
    for n, raw in enumerate(lines, 1):
        rec = _parse(raw)
        if rec is None:
            shown = raw[:80].decode("utf-8", "replace")
            raise RecordError(f"{path}:{n}: not a JSON object: {shown!r}")
        out.append((n, rec))
    if tail:
        rec = _parse(tail)
        if rec is not None:  # the writer was killed before the "\n" only
            out.append((len(lines) + 1, rec))
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file (see the module docstring for what is an error)."""
    return [rec for _, rec in iter_jsonl(path)]


class JsonlWriter:
    """Append-only JSONL, flushed per record, so a killed run keeps what it paid for."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Not open(path, "ab"): that follows a link (a resumed run appended its rows to
        # whatever file a symlinked ledger named). Read-write for _mend, on this descriptor.
        fd = open_record(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        self._f = open(fd, "ab")
        self._mend()

    def _mend(self) -> None:
        """End a torn last line: kept (with its "\\n") if it is a whole record, else cut off."""
        fd = self._f.fileno()
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        start, chunk = size, 1 << 16
        while start > 0:  # find the last "\n", reading back from the end
            start = max(0, start - chunk)
            at = os.pread(fd, min(chunk, size - start), start).rfind(b"\n")
            if at >= 0:
                start += at + 1
                break
        tail = os.pread(fd, size - start, start)
        if _parse(tail) is not None:
            self._f.write(b"\n")
            self._f.flush()
        else:
            os.ftruncate(fd, start)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=True) + "\n"  # ASCII: no raw line separators
        self._f.write(line.encode("ascii"))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


# --- the run directory lock ---------------------------------------------------------------

_held: dict[str, list[int]] = {}  # real path -> [fd, holders in this process]
_held_lock = threading.Lock()


class UnsafeRead(OSError):
    """A run-directory file that a reader of untrusted runs refuses (see `read_untrusted`)."""


def read_untrusted(path: Path, root: Path, limit: int) -> bytes:
    """The bytes of `path`, a file inside the run directory `root`, read as a reader of a run
    someone else wrote must read it (`whale report`, `whale audit`): a symlink anywhere under
    `root` that resolves outside it, anything that is not a regular file (a FIFO would block
    for ever, a device could be endless), or more than `limit` bytes is an `UnsafeRead`, an
    OSError, so callers that already turn OSError into a note need nothing new. Opened with
    O_NOFOLLOW | O_NONBLOCK and checked with fstat on the open descriptor, so a swap between
    the check and the read gains nothing. Not covered: hard links to files outside `root`
    (they are regular files inside it; a run directory is not a security boundary for hard
    links the reader's own user could make)."""
    try:
        real = path.resolve(strict=True)
        inside = real.is_relative_to(root.resolve(strict=True))
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        raise UnsafeRead(f"{path}: cannot resolve ({e})") from None
    if not inside:
        raise UnsafeRead(f"{path}: a link out of the run directory ({real}): not read")
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeRead(f"{path}: not a regular file: not read")
        if st.st_size > limit:
            raise UnsafeRead(f"{path}: {st.st_size} bytes, over the limit of {limit}: not read")
        chunks, left = [], limit + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > limit:  # grew while being read
            raise UnsafeRead(f"{path}: over the limit of {limit} bytes: not read")
        return data
    finally:
        os.close(fd)


class RunLock:
    """An exclusive lock on a run directory, for as long as this object is not released.

    Re-entrant within one process (the CLI takes it, then `run_adapt` takes it again); a
    second process gets RunDirInUse naming the directory and the holder's pid. Not covered:
    two threads of one process share the lock, as they share everything else."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self._key = os.path.realpath(run_dir)
        self._released = False
        with _held_lock:
            if self._key in _held:
                _held[self._key][1] += 1
                return
            path = Path(self._key) / LOCK_NAME
            try:  # O_NOFOLLOW: the pid written below must not truncate a linked file
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise OSError(e.errno, f"{path} is a symbolic link (not followed)") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                raise RunDirInUse(
                    f"run directory {run_dir} is in use by another whale command (pid {holder}); "
                    "wait for it to finish"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _held[self._key] = [fd, 1]

    def release(self) -> None:
        with _held_lock:
            if self._released:
                return
            self._released = True
            entry = _held[self._key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self._key]
                os.close(entry[0])  # closing the descriptor drops the flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
