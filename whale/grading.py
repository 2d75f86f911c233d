"""Grading: in process for audited scorers, in a jail for every other one.

`grade(task, question, answer, sandbox)` is what the evaluator calls. A task that offers
`jailed_grading(question, answer)` (Reasoning Gym: `whale.tasks.rg`) says per answer whether its
scorer may run here; where it may not, the answer never reaches eval/exec/parse_expr/sympify in
this process:

1. screen: answers of the families whose scorer evaluates them (`rg.SCREENS`) must pass a pure
   string check first, or score 0 with feedback `REJECTED` and are not sent anywhere;
2. jail: the answer is scored by a jailed grader process (`whale.grading_zygote`, in a jail
   of `whale.harness.sandbox` of the run's kind: nsjail, bwrap, or `unsafe` where the user
   chose it), one per dataset (family, size, seed, config), kept for this process's life
   (`close_all` at exit) and started once: it imports reasoning_gym, builds the dataset,
   then forks one child per answer, up to `GradingLimits.parallel` at once (the evaluator
   grades a dataset's answers from up to its `workers` threads). The child scores one
   answer and hands the zygote 9 bytes (a tag and a float); the zygote kills a child past
   `GradingLimits.timeout_s` and answers with one fixed-format line per request id
   (`<id> <n> ok <float>`, `timeout`, `error`, `crash`). Only that float (clamped to
   [0, 1], NaN is 0) and fixed feedback strings come back: never text the answer controls.

User graders (`whale.tasks.graders.JailedCall`: a task's `py:module:function` grader, or a
`regex` grader with a hostile answer's backtracking) run the same way, one zygote per grader:
it imports the user's module (its file or top package folder bound read-only into the jail;
from the site-packages when installed there) and forks a child per answer that calls
`function(question, answer, reference)`. A result that is not a real number (`NOT_A_NUMBER`), is
NaN or infinite (`NOT_FINITE`) or is outside [0, 1] (`OUT_OF_RANGE`) is an error there, not a
clamped score; a function that raises is `SCORER_ERROR` plus the exception's class name; one
past the timeout, or killed for memory, is `TIMEOUT` or `CRASHED`. The task's own timeout,
memory cap and score threshold for `correct` replace the defaults.

The jail mounts the venv's site-packages read-only (reasoning_gym and sympy must import);
it has no network, a scratch tmpfs, rlimits, an unprivileged uid, and none of the parent's
memory: the references of other questions, the eval split and the run directory are not
there. The zygote is not dumpable (a child cannot ptrace it), has PR_SET_PDEATHSIG, and exits
when its request pipe closes (its whale died). The parent also kills a zygote that does not
answer within timeout + `REPLY_MARGIN_S` (every answer waiting on it is then a crash), and
one interrupted in the middle of a request frame; replies are matched to requests by id, so
a late reply is never read as another answer's score.

Not covered: an answer that gets code past the screen (none is known) runs inside the jail
and can forge its own score or the scores of later or concurrent answers of the same
zygote; the screen, not the jail, is what keeps scores honest. A child's own children are
not killed one by one (the jail's process cap bounds them; they die with the zygote). Where
no memory cgroup is writable, each of the parallel children may use `memory_mb`.

Audit of the other tasks (2026-12, grep for eval/exec/compile/sympy/sympify/parse_expr/
literal_eval/pickle/__import__ in whale/tasks): math.py, mhqa.py, judged.py, qa_files.py and
answers.py evaluate no answer text; they compare strings, `Fraction`s and regex matches, and
judged.py sends the answer to a judge model as text. One cost, not code, finding:
`Fraction("1e999999999")` computes a billion-digit integer (minutes of CPU), so answers.py's
`parse_number` refuses numbers over 200 characters or with an exponent past 400.
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import itertools
import math
import os
import pickle
import re
import select
import struct
import subprocess
import sysconfig
import textwrap
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from whale.grading_zygote import zygote_main
from whale.harness.budget import Limits
from whale.harness.sandbox import Jailed, Sandbox, SandboxUnavailable, python_executable
from whale.tasks.base import Grade, Question, Task, checked_grade, graded_here, grader_error
from whale.tasks.graders import JailedCall

REJECTED = "answer rejected: not a plain expression"
TOO_LONG = "answer rejected: too long for the grader"
TIMEOUT = "grading timeout"
SCORER_ERROR = "scorer error (in the grading jail)"
CRASHED = "grading crashed"
UNAVAILABLE = "not graded: grading jail unavailable"
NOT_A_NUMBER = "grader returned a non-number"
NOT_FINITE = "grader returned NaN or infinity"
OUT_OF_RANGE = "grader returned a score outside [0, 1]"
_WORDS = {b"timeout": TIMEOUT, b"error": SCORER_ERROR, b"notnumber": NOT_A_NUMBER,
          b"notfinite": NOT_FINITE, b"range": OUT_OF_RANGE}  # fmt: skip
_ERROR_NAME = re.compile(rb"error ([A-Za-z_][A-Za-z0-9_]{0,39})")
REPLY_MARGIN_S = 5.0
_SITE_INSIDE = "/whale/site"


@dataclass(frozen=True)
class GradingLimits:
    timeout_s: float = 10.0  # one answer, from fork to score
    start_timeout_s: float = 120.0  # import reasoning_gym and build the dataset
    memory_mb: int = 2048  # RLIMIT_AS of the zygote and its children
    max_answer_chars: int = 1_000_000  # longer answers score 0 without being sent
    zygotes: int = 4  # jailed graders kept at once (least recently used closed first)
    # answers of one dataset scored at once, one child each (the evaluator sends up to its
    # workers); each child has its own RLIMIT_AS of memory_mb, a memory cgroup caps the sum
    parallel: int = 8


LIMITS = GradingLimits()


def grade(
    task: Task,
    question: Question,
    answer: str,
    sandbox: str = "auto",
    limits: GradingLimits | None = None,
) -> Grade:
    """Grade one answer: in process where the task says its scorer may run here, otherwise
    screened and then in a jail of kind `sandbox`. Never raises for a bad answer or a broken
    grading jail: the reason is the feedback of a zero grade."""
    try:  # a user task's own code, on an untrusted answer (as graded_here)
        verdict = task.precheck(question, answer)
        spec = None if verdict is not None else task.jailed_grading(question, answer)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - reported as this answer's grade
        return grader_error(e)
    if verdict is not None:
        return checked_grade(verdict)
    if spec is None:
        return graded_here(task, question, answer)
    lim = limits or LIMITS
    if isinstance(spec, JailedCall):  # the task's own limits, where it sets them
        if spec.timeout_s is not None:
            lim = dataclasses.replace(lim, timeout_s=spec.timeout_s)
        if spec.memory_mb is not None:
            lim = dataclasses.replace(lim, memory_mb=spec.memory_mb)
    if not spec.passes_screen(answer):
        return Grade(0.0, False, REJECTED)
    if len(answer) > lim.max_answer_chars:
        return Grade(0.0, False, TOO_LONG)
    g = _grader(spec.dataset_key, spec, sandbox, lim).grade(spec.entry, answer)
    if isinstance(spec, JailedCall) and not g.feedback:  # a score: correct at the threshold
        g = Grade(g.score, g.score >= spec.threshold)
    return g


_ZYGOTE_CODE = textwrap.dedent(inspect.getsource(zygote_main)) + "\nzygote_main()\n"


def site_folders() -> list[str]:
    """Host folders the jailed grader needs on its path: where reasoning_gym, sympy and
    their dependencies are installed (the venv's site-packages)."""
    import reasoning_gym

    found = [
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
        os.path.dirname(os.path.dirname(os.path.abspath(reasoning_gym.__file__))),
    ]
    out: list[str] = []
    for d in found:
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in out:
            out.append(real)
    return out


# --- the parent's side -----------------------------------------------------------------------


class _Broken(Exception):
    """The zygote is gone or out of step: kill it; the next answer starts a fresh one."""


class _Waiter:
    """One answer sent to a zygote: its grade, set by the zygote's reader thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.grade = Grade(0.0, False, CRASHED)


class _Zygote:
    """One jailed grader for one dataset. Up to `GradingLimits.parallel` answers are in flight
    at once (`slots`), each tagged with a request id; the zygote forks one child per answer
    and replies as each ends, and a reader thread hands each reply to its waiter by id.
    `lock` guards the state and the request pipe (one frame is written whole)."""

    def __init__(self, spec_json: str, sandbox: str, limits: GradingLimits,
                 mounts: tuple[tuple[str, str], ...] = ()) -> None:  # fmt: skip
        self.spec_json, self.sandbox, self.limits = spec_json, sandbox, limits
        self.mounts = mounts  # host path -> path in the jail, read-only (a user's grader)
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(max(1, limits.parallel))
        self.jailed: Jailed | None = None
        self.failed: str | None = None  # a start failure, sticky after two tries
        self.starts = 0
        self.pending: dict[int, _Waiter] = {}
        self.peak = 0  # the most children the zygote said were scoring at once
        self._ids = itertools.count(1)

    # -- life ------------------------------------------------------------------------------
    def _start(self) -> Jailed:
        """Start the jail from a thread of its own, which then reads its replies: a jail dies
        with the thread that started it (PR_SET_PDEATHSIG), and this one lives as long as the
        jail does, whichever thread asked for a grade (a grading pool's threads come and go)."""
        if self.failed is not None and self.starts >= 2:
            raise _Broken(self.failed)
        self.starts += 1
        started = threading.Event()
        box: dict[str, Any] = {}
        reader = threading.Thread(target=self._serve, args=(started, box), daemon=True,
                                  name="whale-grader")  # fmt: skip
        reader.start()
        started.wait()
        if "jailed" not in box:
            self.failed = box.get("error", "grader did not start")
            raise _Broken(self.failed)
        self.failed = None
        self.starts = 0
        self.jailed = box["jailed"]
        return self.jailed

    def _spawn(self) -> Jailed:
        sites = site_folders()
        inside = [f"{_SITE_INSIDE}{i}" for i in range(len(sites))]
        lim = self.limits
        jail_limits = Limits(
            memory_mb=lim.memory_mb,
            cpu_s=3600,  # the zygote's own life; each child has its own RLIMIT_CPU
            file_size_mb=16,
            open_files=64,
            processes=max(1, lim.parallel) + 6,  # the zygote, its children, some slack
            scratch_mb=16,
        )
        return Sandbox(self.sandbox).spawn(  # type: ignore[arg-type]
            [
                python_executable(),
                "-I",
                "-S",
                "-c",
                _ZYGOTE_CODE,
                *inside,
                *(jail for _, jail in self.mounts),
                self.spec_json,
            ],  # fmt: skip
            jail_limits,
            ro_files={**dict(zip(sites, inside, strict=True)), **dict(self.mounts)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def _serve(self, started: threading.Event, box: dict[str, Any]) -> None:
        """The reader thread: start the jail, wait for "ready", then hand each reply line
        (`<id> <children scoring> <verdict>`) to its waiter until the jail ends or says
        something out of form; then the zygote is killed and every waiter still pending gets
        CRASHED."""
        try:
            jailed = self._spawn()
        except (SandboxUnavailable, OSError) as e:
            box["error"] = f"{type(e).__name__}: {e}"
            started.set()
            return
        err = bytearray()
        assert jailed.proc.stderr is not None and jailed.proc.stdin is not None
        assert jailed.proc.stdout is not None
        drainer = threading.Thread(target=_drain, args=(jailed.proc.stderr, err), daemon=True)
        drainer.start()
        os.set_blocking(jailed.proc.stdin.fileno(), False)
        lines = _Lines(jailed.proc.stdout.fileno())
        try:
            line = lines.next(time.monotonic() + self.limits.start_timeout_s)
        except _Broken:
            line = b""
        if line != b"ready":
            _close_jail(jailed)
            drainer.join(timeout=2)  # the last words of a failed start
            tail = bytes(err[-400:]).decode("utf-8", "replace").strip()
            box["error"] = f"grader did not start ({tail or 'no output'})"
            started.set()
            _close_quietly(jailed.proc.stdout)
            return
        box["jailed"] = jailed
        started.set()
        try:
            while True:
                rid, n, verdict = _split_reply(lines.next(None))
                with self.lock:
                    waiter = self.pending.pop(rid, None)
                    self.peak = max(self.peak, n)
                if waiter is not None:  # None: an interrupted request, or a stale id
                    waiter.grade = _parse_reply(verdict)
                    waiter.done.set()
        except _Broken:
            pass
        with self.lock:
            if self.jailed is jailed:  # else whoever replaced it has killed it already
                self._kill()
        _close_quietly(jailed.proc.stdout)

    def _kill(self) -> None:
        """Under `lock`: end the jail; every answer still waiting on it is a crash."""
        jailed, self.jailed = self.jailed, None
        if jailed is not None:
            _close_jail(jailed)
        for waiter in self.pending.values():
            waiter.done.set()  # its grade is CRASHED until a reply sets it
        self.pending.clear()

    def close(self) -> None:
        with self.lock:
            self._kill()

    # -- one answer ------------------------------------------------------------------------
    def grade(self, entry: Any, answer: str) -> Grade:
        timeout = self.limits.timeout_s
        with self.slots:
            with self.lock:
                if self.jailed is not None and self.jailed.proc.poll() is not None:
                    self._kill()  # died between answers
                try:
                    jailed = self.jailed or self._start()
                except _Broken as e:
                    return Grade(0.0, False, f"{UNAVAILABLE}: {e}")
                rid, waiter = next(self._ids), _Waiter()
                self.pending[rid] = waiter
                try:
                    body = pickle.dumps((rid, entry, answer, timeout),
                                        protocol=pickle.HIGHEST_PROTOCOL)  # fmt: skip
                    deadline = time.monotonic() + timeout + REPLY_MARGIN_S
                    _write(jailed, struct.pack(">Q", len(body)) + body, deadline)
                except _Broken as e:
                    self._kill()
                    return Grade(0.0, False, TIMEOUT if str(e) == "timeout" else CRASHED)
                except BaseException:  # an interrupt mid-frame: the pipe is out of step
                    self._kill()
                    raise
            try:
                answered = waiter.done.wait(timeout + REPLY_MARGIN_S)
            except BaseException:  # an interrupt: the reply, when it comes, finds no waiter
                with self.lock:
                    self.pending.pop(rid, None)
                raise
            if not answered:  # the zygote's own timeout did not fire: it is stuck
                with self.lock:
                    self.pending.pop(rid, None)
                    if self.jailed is jailed:
                        self._kill()
                return Grade(0.0, False, TIMEOUT)
            return waiter.grade


def _write(jailed: Jailed, data: bytes, deadline: float) -> None:
    assert jailed.proc.stdin is not None
    fd = jailed.proc.stdin.fileno()
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [fd], [], left)[1]:
            raise _Broken("timeout")
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        except OSError as e:  # the zygote died
            raise _Broken("crash") from e
        view = view[n:]


class _Lines:
    """Reply lines of a zygote's stdout, each at most 64 bytes (else the zygote is out of
    form: `_Broken`)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def next(self, deadline: float | None) -> bytes:
        while b"\n" not in self.buf:
            if len(self.buf) > 64:
                raise _Broken("crash")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and (left <= 0 or not select.select([self.fd], [], [], left)[0]):
                raise _Broken("timeout")
            try:
                chunk = os.read(self.fd, 4096)
            except OSError as e:
                raise _Broken("crash") from e
            if not chunk:
                raise _Broken("crash")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        if len(line) > 64:
            raise _Broken("crash")
        return line


def _split_reply(line: bytes) -> tuple[int, int, bytes]:
    parts = line.split(b" ", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        raise _Broken("crash")
    return int(parts[0]), int(parts[1]), parts[2]


def _close_jail(jailed: Jailed) -> None:
    jailed.kill()
    _close_quietly(jailed.proc.stdin)


def _close_quietly(stream: Any) -> None:
    try:
        if stream is not None:
            stream.close()
    except OSError:
        pass


def _drain(stream: Any, tail: bytearray) -> None:
    """Keep the last 4 KB of the zygote's stderr (read only for start-up failures, before any
    answer was sent); draining keeps the zygote from blocking on a full pipe."""
    try:
        while chunk := stream.read1(4096):
            tail += chunk
            del tail[:-4096]
    except (OSError, ValueError):
        pass
    finally:
        stream.close()


def _parse_reply(line: bytes) -> Grade:
    if line in _WORDS:
        return Grade(0.0, False, _WORDS[line])
    named = _ERROR_NAME.fullmatch(line)  # a user grader's exception: its class name only
    if named:
        return Grade(0.0, False, f"{SCORER_ERROR}: {named.group(1).decode()}")
    if line.startswith(b"ok ") and len(line) <= 40:
        try:
            score = float(line[3:].decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return Grade(0.0, False, CRASHED)
        score = min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0
        return Grade(score, score == 1.0)
    return Grade(0.0, False, CRASHED)


_POOL: OrderedDict[tuple[str, str], _Zygote] = OrderedDict()
_POOL_LOCK = threading.Lock()


def _grader(key: str, spec: Any, sandbox: str, limits: GradingLimits) -> _Zygote:
    """The zygote of this dataset and jail kind (started on its first answer)."""
    import json

    if sandbox not in ("nsjail", "bwrap", "unsafe"):
        sandbox = "auto"
    pool_key = (key, sandbox)
    evicted: list[_Zygote] = []
    with _POOL_LOCK:
        z = _POOL.get(pool_key)
        if z is None or z.limits != limits:
            if z is not None:
                evicted.append(z)
            if isinstance(spec, JailedCall):
                body, mounts = spec.zygote_spec(), spec.mounts
            else:
                body = {"family": spec.family, "size": spec.size, "seed": spec.seed,
                        "config": json.loads(spec.config_json)}  # fmt: skip
                mounts = ()
            spec_json = json.dumps({**body, "parallel": limits.parallel,
                                    "user_paths": len(mounts)})  # fmt: skip
            z = _POOL[pool_key] = _Zygote(spec_json, sandbox, limits, mounts)
        _POOL.move_to_end(pool_key)
        while len(_POOL) > max(1, limits.zygotes):
            evicted.append(_POOL.popitem(last=False)[1])
    for old in evicted:
        old.close()
    return z


def close_all() -> None:
    """Stop every jailed grader (also done at exit; each also exits when whale dies)."""
    with _POOL_LOCK:
        zygotes = list(_POOL.values())
        _POOL.clear()
    for z in zygotes:
        z.close()


def peak_parallel() -> int:
    """The most answers any live jailed grader has scored at once (for tests and benchmarks)."""
    with _POOL_LOCK:
        return max((z.peak for z in _POOL.values()), default=0)


def live_zygotes() -> list[int]:
    """Process ids of the running jailed graders (for tests and the benchmark)."""
    with _POOL_LOCK:
        return [z.jailed.proc.pid for z in _POOL.values() if z.jailed is not None]


atexit.register(close_all)
