"""Linux /proc, read one way by every part of whale that finds, spares or kills processes.

A process's name (field 2 of /proc/PID/stat, in parentheses) is any 15 bytes the process chose,
spaces, ")" and bytes that are not UTF-8 included. So the file is read as bytes and split after
its *last* ")": what follows is ASCII. Fields are numbered here from the state (field 3 of
proc(5)) as 0, so the parent pid is `fields[PPID]` and the start time (clock ticks since boot,
which tells a reused pid apart) `fields[START]`.

Not covered: the Ray reaper (whale.harness.ray_support) runs as a script of its own in a fresh
interpreter and keeps its own three lines of the same reading.
"""

from __future__ import annotations

import os

STATE, PPID, START = 0, 1, 19


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the name, or None if there is no such process (or the
    file does not read as one). `pid` may be "self"."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:  # gone, or never was; a process of another pid namespace
        return None
    _, paren, rest = raw.rpartition(b")")
    fields = rest.decode("ascii", errors="replace").split()
    return fields if paren and len(fields) > START else None


def start_time(pid: int | str) -> str | None:
    """The process's start time as /proc writes it, or None if there is no such process."""
    fields = stat_fields(pid)
    return fields[START] if fields else None


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every live process; zombies are left out (they have
    exited: nothing is left to kill, and their children have already been handed on)."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (fields := stat_fields(d)) and fields[STATE] != "Z":
            out[int(d)] = (int(fields[PPID]), fields[START])
    return out


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> dict[int, str]:
    """The live processes below `root` (children, theirs, ...): pid -> start time. `table` is a
    snapshot from `processes()`, read now if not given."""
    table = processes() if table is None else table
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = {}, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        # a table read while pids were reused can hold a cycle, through `root` too: `root` is
        # never listed (the Ray reaper SIGKILLs the list while this process lives on)
        if pid not in found and pid != root:
            found[pid] = table[pid][1]
            todo += kids.get(pid, [])
    return found


def ancestors(pid: int) -> list[int]:
    """`pid`'s parent, its parent, ... up to init (a process gone on the way ends the list)."""
    out: list[int] = []
    while pid > 1 and len(out) < 4096 and (fields := stat_fields(pid)):
        pid = int(fields[PPID])
        out.append(pid)
    return out
