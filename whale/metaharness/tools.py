"""The proposer agent's read-only tools over the archive, and the text tool protocol.

Every tool takes plain JSON arguments and returns text cut to a character budget. Paths are
relative to the archive root; an absolute path, a `..` component, or a path through a symbolic
link (the link itself or any folder on the way) is refused with a message the agent can read,
and never followed. `grep` is a case-insensitive fixed-string search (no regular expressions:
an agent-written pattern could backtrack for minutes).

Scores, as the archive ranks them (`Archive.view`): `top` lists the best candidates by accuracy
under the current solver, then the best of those scored under earlier weights in a section of
their own; `list` of the archive root gives each candidate folder its accuracy, labelled when it
was measured under other weights; `failures` of such a candidate shows first the failures of
its copy scored under the current weights, where there is one.

Nothing an agent sends ends the search: any failure of a call (a path through a file, a name
too long for the file system, a lone surrogate, arguments nested past Python's recursion
limit, an error whale did not foresee) comes back to the agent as an `error:` reply. Only
regular files are ever opened, with O_NONBLOCK | O_NOFOLLOW and checked on the open descriptor,
so a FIFO or a device in the archive is refused, never read (a FIFO would block for ever).

The text protocol (for backends without function calling, such as the embedded llama.cpp
models): one reply is one call,

    CALL name {"json": "arguments"}
    optional body lines (for submit: SEARCH/REPLACE blocks or a fenced full harness)

Anything else is answered with a message that says what was wrong and how a call looks.
"""

from __future__ import annotations

import difflib
import io
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale.metaharness.archive import Archive, ArchiveError
from whale.records import RecordError

CACHE_FILE_BYTES = 256 * 1024
TOOL_NAMES = ("list", "read", "grep", "diff", "top", "failures", "task", "submit")


class ToolRefused(Exception):
    """A call the agent made wrongly; the message goes back to the agent."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, Any]
    body: str = ""


def _clip(text: str, budget: int) -> str:
    if len(text) <= budget:
        return text
    return text[: max(0, budget - 60)] + f"\n…[output cut: {len(text)} chars, budget {budget}]"


class ArchiveTools:
    def __init__(self, archive: Archive, task_description: str, char_budget: int = 4000) -> None:
        self.archive, self.task_description, self.budget = archive, task_description, char_budget
        self.root = archive.root.resolve()
        self._folders_cache: dict[Path, tuple[int, list[tuple[Path, str, str]], str]] = {}

    def call(self, c: ToolCall) -> str:
        """Run one read-only tool. Every failure comes back as text the agent reads: a call is
        untrusted input, and one that raised ended the whole search (issue 20)."""
        handlers: dict[str, Callable[[dict[str, Any]], str]] = {
            "list": self.ls, "read": self.read, "grep": self.grep, "diff": self.diff,
            "top": self.top, "failures": self.failures, "task": lambda a: self.task_description,
        }  # fmt: skip
        if c.name not in handlers:
            return f"error: unknown tool {c.name!r}; tools: {', '.join(TOOL_NAMES)}"
        try:
            out = handlers[c.name](c.args)
        except (ToolRefused, ArchiveError, RecordError) as e:  # a cut record: say so
            out = f"error: {e}"
        except OSError as e:  # the archive's absolute path is none of the agent's business
            out = f"error: {c.name} failed: {e.strerror or e}"
        except Exception as e:  # not foreseen: still the agent's to read, not the run's end
            why = str(e).replace(f"{self.root}/", "")[:300]
            out = f"error: {c.name} failed ({type(e).__name__}: {why})"
        # A file name that is not UTF-8 comes back from the file system as lone surrogates,
        # which no server or record could take.
        return valid_text(_clip(out, self.budget))

    # -- paths -------------------------------------------------------------------------------
    def resolve(self, rel: Any) -> Path:
        """The archive path for `rel`, or ToolRefused. Checks each component with lstat, so a
        symbolic link anywhere on the way is refused rather than followed."""
        if not isinstance(rel, str):
            raise ToolRefused("path must be a string relative to the archive")
        if "\x00" in rel:
            raise ToolRefused("path contains a NUL byte")
        if valid_text(rel) != rel:  # a lone surrogate: no file system name
            raise ToolRefused("path is not valid UTF-8 text")
        if rel.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", rel):
            raise ToolRefused(f"{rel!r} is outside the archive: paths are relative to it")
        parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ToolRefused(f"{rel!r} is outside the archive: '..' is not allowed")
        if any(len(p.encode()) > 255 for p in parts):
            raise ToolRefused(f"{rel[:80]!r}…: a path component is over 255 bytes")
        path = self.root
        for p in parts:
            path = path / p
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                raise ToolRefused(f"{rel!r} does not exist") from None
            except NotADirectoryError:
                raise ToolRefused(f"{rel!r} does not exist: it goes through a file") from None
            except OSError as e:
                raise ToolRefused(f"{rel[:200]!r}: {e.strerror or 'cannot be read'}") from None
            if stat.S_ISLNK(mode):
                raise ToolRefused(f"{rel!r} is a symbolic link; links are not followed")
        return path

    # -- tools -------------------------------------------------------------------------------
    def ls(self, args: dict[str, Any]) -> str:
        path = self.resolve(args.get("path", "."))
        if not path.is_dir():
            raise ToolRefused(f"{args.get('path')!r} is not a folder")
        rows = []
        for p in sorted(path.iterdir()):
            if p.name.startswith("."):
                continue
            st = os.lstat(p)
            kind = ("link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode)
                    else "file" if stat.S_ISREG(st.st_mode) else "other")  # fmt: skip
            row = f"{p.name}{'/' if kind == 'dir' else ''}\t{kind}\t{st.st_size}"
            if kind == "dir" and path == self.root and p.name in self.archive:
                row += f"\t{self.archive.label(self.archive.get(p.name))}"  # a candidate
            rows.append(row)
        return "\n".join(rows) or "(empty)"

    def read(self, args: dict[str, Any]) -> str:
        path = self.resolve(args.get("path"))
        with _open_regular(path, args.get("path")) as fh:
            lines = fh.read().split("\n")
        start, end = _int(args.get("start", 1), "start"), _int(args.get("end", len(lines)), "end")
        start, end = max(1, start), min(len(lines), end)
        return "\n".join(f"{i:4d}  {lines[i - 1]}" for i in range(start, end + 1))

    def grep(self, args: dict[str, Any]) -> str:
        needle = args.get("pattern")
        if not isinstance(needle, str) or not needle:
            raise ToolRefused("grep needs a non-empty string pattern (a fixed string)")
        base = self.resolve(args.get("path", "."))
        mode = os.lstat(base).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a FIFO, a device, a socket
            raise ToolRefused(f"{args.get('path')!r} is not a regular file or a folder")
        low = needle.lower()
        hits: list[str] = []
        for folder in [base] if stat.S_ISREG(mode) else self._folders(base):
            for f, text, lowered in self._contents(folder, low):
                if low not in lowered:  # most files do not match: one scan, no split
                    continue
                rel = f.relative_to(self.root)
                for i, line in enumerate(text.split("\n"), 1):
                    if low in line.lower():
                        hits.append(f"{rel}:{i}: {line.rstrip()[:200]}")
                        if len(hits) >= 200:
                            return "\n".join(hits) + "\n…[more matches not shown]"
        return "\n".join(hits) or "(no match)"

    def _folders(self, base: Path) -> list[Path]:
        """`base`'s own files, then its sub-folders (candidate folders, in the archive root)."""
        files: list[Path] = []
        dirs: list[Path] = []
        with os.scandir(base) as it:
            for e in it:
                if e.name.startswith(".") or e.is_symlink():
                    continue
                if e.is_dir(follow_symlinks=False):
                    dirs.append(Path(e.path))
                elif e.is_file(follow_symlinks=False):  # not a FIFO, a device, a socket
                    files.append(Path(e.path))
        return sorted(files) + sorted(dirs)

    def _contents(self, path: Path, low: str) -> list[tuple[Path, str, str]]:
        """(file, text, lower-cased text) of the regular files under `path` that may hold
        `low`. A folder of small files is cached whole while its mtime holds (a candidate
        folder is written whole and renamed into place, never changed; re-reading it made a
        grep of a large archive slow, docs/measurements.md), with one lower-cased blob
        that rules the folder out in one scan. A folder with a file over CACHE_FILE_BYTES is
        never cached, and of a large file only the matching lines are kept, so memory stays
        small whatever a harness made its records."""
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            return [self._file(path, low)]
        key = st.st_mtime_ns
        hit = self._folders_cache.get(path)
        if hit is None or hit[0] != key:
            files = _files(path)
            if any(os.lstat(f).st_size > CACHE_FILE_BYTES for f in files):
                return [self._file(f, low) for f in files]
            entries = [self._file(f, low) for f in files]
            hit = self._folders_cache[path] = (key, entries, "\0".join(e[2] for e in entries))
        return hit[1] if low in hit[2] else []

    def _file(self, f: Path, low: str) -> tuple[Path, str, str]:
        """One file, read now; of a large one only the lines holding `low` are kept (the
        others blank, so that line numbers hold)."""
        with _open_regular(f, str(f.relative_to(self.root))) as fh:
            if os.fstat(fh.fileno()).st_size <= CACHE_FILE_BYTES:
                text = fh.read()
            else:
                text = "\n".join(line.rstrip("\n") if low in line.lower() else "" for line in fh)
        return f, text, text.lower()

    def diff(self, args: dict[str, Any]) -> str:
        a, b = str(args.get("a", "")), str(args.get("b", ""))
        sa, sb = self.archive.source(a), self.archive.source(b)
        return "".join(difflib.unified_diff(
            sa.splitlines(keepends=True), sb.splitlines(keepends=True), f"{a}/harness.py",
            f"{b}/harness.py")) or "(identical)"  # fmt: skip

    def top(self, args: dict[str, Any]) -> str:
        """The best candidates by accuracy under the current solver (the ranking), then the
        best of those scored under earlier weights, labelled: their scores do not compare."""
        k = max(1, min(50, _int(args.get("k", 5), "k")))
        rows = [f"{m.id}\t{m.accuracy_text()}\titeration {m.iteration}\tparent {m.parent_id}"
                f"\t{m.hypothesis[:100]}" for m in self.archive.top(k)]  # fmt: skip
        other = self.archive.earlier(k)
        if other:
            rows += ["scored under earlier weights (not comparable with the rows above):",
                     *(f"{m.id}\t{self.archive.label(m)}\titeration {m.iteration}\tparent "
                       f"{m.parent_id}\t{m.hypothesis[:100]}" for m in other)]  # fmt: skip
        return "\n".join(rows) or "(no scored candidate yet)"

    def failures(self, args: dict[str, Any]) -> str:
        """A candidate's failing examples (verifier: not `correct`). For a candidate scored
        under earlier weights whose source was scored again under the current ones, the
        current copy's failures come first; the candidate's own are labelled as earlier."""
        cid = str(args.get("id", ""))
        n = max(1, min(20, _int(args.get("n", 3), "n")))
        meta = self.archive.get(cid)
        out: list[str] = []
        if meta.rankable and not self.archive.comparable(meta) and meta.hash is not None:
            now = self.archive.by_hash(meta.hash)
            if now is not None:
                out += [f"{cid} was scored again under the current weights as {now.id}:",
                        self._failures(now.id, n, self.archive.label(now)), "",
                        f"earlier, under the weights of harness phase {meta.phase}:"]
        out.append(self._failures(cid, n, self.archive.label(meta)))
        return "\n".join(out)

    def _failures(self, cid: str, n: int, label: str) -> str:
        wrong = [o for o in self.archive.outcomes(cid) if not o.get("correct")]
        trajs = self.archive.trajectories(cid)
        out = [f"{cid} ({label}): {len(wrong)} failing examples; showing {min(n, len(wrong))}"]
        for o in wrong[:n]:
            out.append(f"\n## {o['question_id']}  status {o.get('status')}  score "
                       f"{o.get('score')}  answer {str(o.get('answer'))[:200]!r}")  # fmt: skip
            if o.get("error"):
                out.append(f"error: {str(o['error'])[-400:]}")
            t = trajs.get(o["question_id"])
            for call in (t.model_calls() if t else [])[-2:]:
                out.append(f"last prompt: {call.messages[-1]['content'][-300:]!r}")
                out.append(f"reply ({call.finish_reason}): {call.text[:400]!r}")
        return "\n".join(out)


def _files(root: Path) -> list[Path]:
    """Regular files under `root`, sorted; hidden entries and symbolic links are skipped (a
    link is never followed, to a file or a folder)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if not name.startswith(".") and stat.S_ISREG(os.lstat(p).st_mode):
                out.append(p)
    return out


def _open_regular(path: Path, shown: Any) -> io.TextIOWrapper:
    """`path` opened for reading text if it is a regular file, else ToolRefused. O_NONBLOCK:
    opening a FIFO would block until a writer came; O_NOFOLLOW: a link swapped in after
    `resolve` checked is not followed; the type is checked on the open descriptor."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolRefused(f"{shown!r} is not a regular file: not read")
        return open(fd, encoding="utf-8", errors="replace")
    except BaseException:
        os.close(fd)
        raise


def valid_text(text: str) -> str:
    """`text` with lone surrogates (valid JSON escapes, not encodable text) replaced, so that
    the session, the archive and the harness files it may become can be written."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ToolRefused(f"{name} must be an integer")
    return v


_CALL = re.compile(r"^CALL[ \t]+([A-Za-z_]+)[ \t]*(\{.*\})?[ \t]*$")
PROTOCOL_HELP = (
    'Write exactly one call per reply: a line `CALL name {"arg": value}` (JSON arguments on '
    "that line), then for submit the edits or the full harness on the following lines. "
    f"Tools: {', '.join(TOOL_NAMES)}."
)


def parse_call(text: str) -> ToolCall:
    """The call in a text-protocol reply, or ToolRefused saying what is wrong."""
    lines = text.strip().split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("CALL")), None)
    if at is None:
        raise ToolRefused(f"no CALL line in the reply. {PROTOCOL_HELP}")
    m = _CALL.match(lines[at].strip())
    if m is None:
        raise ToolRefused(f"malformed CALL line {lines[at][:120]!r}. {PROTOCOL_HELP}")
    name, raw = m.group(1), m.group(2)
    if name not in TOOL_NAMES:
        raise ToolRefused(f"unknown tool {name!r}. {PROTOCOL_HELP}")
    args = load_args(name, raw or "{}", f" {PROTOCOL_HELP}")
    return ToolCall(name, args, "\n".join(lines[at + 1 :]).strip("\n"))


def load_args(name: str, raw: Any, help_: str = "") -> dict[str, Any]:
    """A call's JSON arguments as a flat object of clean text and numbers, or ToolRefused.
    Every tool takes flat arguments, so nesting is refused (5,000 levels raised RecursionError
    in json.loads), and lone surrogates that the JSON escapes decode to are replaced (the
    reply was cleaned before they existed; `"\\ud800"` as a path raised UnicodeEncodeError)."""
    if isinstance(raw, dict):  # a backend that hands function arguments over decoded
        args: Any = raw
    elif not isinstance(raw, str):
        raise ToolRefused(f"the arguments of {name} must be a JSON object.{help_}")
    else:
        try:
            args = json.loads(raw)
        except RecursionError:
            raise ToolRefused(f"the arguments of {name} are nested too deep.{help_}") from None
        except ValueError as e:
            raise ToolRefused(f"the arguments of {name} are not valid JSON ({e}).{help_}") from None
    if not isinstance(args, dict):
        raise ToolRefused(f"the arguments of {name} must be a JSON object.{help_}")
    flat: dict[str, Any] = {}
    for k, v in args.items():
        if isinstance(v, dict | list):
            raise ToolRefused(f"the arguments of {name} must be flat: strings and integers, "
                              f"no lists or objects ({valid_text(str(k))[:80]!r}).{help_}")
        flat[valid_text(str(k))] = valid_text(v) if isinstance(v, str) else v
    return flat
