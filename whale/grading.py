"""Grading: in process for audited scorers, in a jail for every other one.

`grade(task, question, answer, sandbox)` is what the evaluator calls. A task that offers
`jailed_grading(question, answer)` (Reasoning Gym: `whale.tasks.rg`) says per answer whether its
scorer may run here; where it may not, the answer never reaches eval/exec/parse_expr/sympify in
this process:

1. screen: answers of the families whose scorer evaluates them (`rg.SCREENS`) must pass a pure
   string check first, or score 0 with feedback `REJECTED` and are not sent anywhere;
2. jail: the answer is scored by a jailed grader process (`whale.harness.sandbox`, the same
   kind as the run's: nsjail, bwrap, or `unsafe` where the user chose it), one per dataset
   (family, size, seed, config), kept for this process's life (`close_all` at exit) and
   started once: it imports reasoning_gym, builds the dataset, then forks one child per
   answer. The child scores one answer and hands the zygote 9 bytes (a tag and a float); the
   zygote kills a child past `GradingLimits.timeout_s` and answers with one fixed-format line
   (`ok <float>`, `timeout`, `error`, `crash`). Only that float (clamped to [0, 1], NaN is 0)
   and fixed feedback strings come back: never text the answer controls.

The jail mounts the venv's site-packages read-only (reasoning_gym and sympy must import);
it has no network, a scratch tmpfs, rlimits, an unprivileged uid, and none of the parent's
memory: the references of other questions, the eval split and the run directory are not
there. The zygote is not dumpable (a child cannot ptrace it), has PR_SET_PDEATHSIG, and exits
when its request pipe closes (its whale died). The parent also kills a zygote that does not
answer within timeout + `REPLY_MARGIN_S`, and any zygote left in an unknown state (an
interrupt mid-request), so a stale reply is never read as the next answer's score.

Not covered: an answer that gets code past the screen (none is known) runs inside the jail
and can forge its own score or the scores of later answers of the same zygote; the screen,
not the jail, is what keeps scores honest. A child's own children are not killed one by one
(the jail's process cap bounds them; they die with the zygote).

Audit of the other tasks (2026-12, grep for eval/exec/compile/sympy/sympify/parse_expr/
literal_eval/pickle/__import__ in whale/tasks): math.py, mhqa.py, judged.py, qa_files.py and
answers.py evaluate no answer text; they compare strings, `Fraction`s and regex matches, and
judged.py sends the answer to a judge model as text. One cost, not code, finding:
`Fraction("1e999999999")` computes a billion-digit integer (minutes of CPU), so answers.py's
`parse_number` refuses numbers over 200 characters or with an exponent past 400.
"""

from __future__ import annotations

import atexit
import inspect
import math
import os
import pickle
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

from whale.harness.budget import Limits
from whale.harness.sandbox import Jailed, Sandbox, SandboxUnavailable, python_executable
from whale.tasks.base import Grade, Question, Task

REJECTED = "answer rejected: not a plain expression"
TOO_LONG = "answer rejected: too long for the grader"
TIMEOUT = "grading timeout"
SCORER_ERROR = "scorer error (in the grading jail)"
CRASHED = "grading crashed"
UNAVAILABLE = "not graded: grading jail unavailable"
REPLY_MARGIN_S = 5.0
_SITE_INSIDE = "/whale/site"


@dataclass(frozen=True)
class GradingLimits:
    timeout_s: float = 10.0  # one answer, from fork to score
    start_timeout_s: float = 120.0  # import reasoning_gym and build the dataset
    memory_mb: int = 2048  # RLIMIT_AS of the zygote and its children
    max_answer_chars: int = 1_000_000  # longer answers score 0 without being sent
    zygotes: int = 4  # jailed graders kept at once (least recently used closed first)


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
    pre = getattr(task, "precheck", None)
    verdict = pre(question, answer) if pre is not None else None
    if verdict is not None:
        return verdict
    spec_of = getattr(task, "jailed_grading", None)
    spec = spec_of(question, answer) if spec_of is not None else None
    if spec is None:
        return task.grade(question, answer)
    lim = limits or LIMITS
    if not spec.passes_screen(answer):
        return Grade(0.0, False, REJECTED)
    if len(answer) > lim.max_answer_chars:
        return Grade(0.0, False, TOO_LONG)
    return _grader(spec.dataset_key, spec, sandbox, lim).grade(spec.entry, answer)


# --- the jailed side -------------------------------------------------------------------------


def _zygote_main() -> None:  # pragma: no cover - runs inside the jail, tested through it
    """The jailed grader: argv = site folders..., dataset spec (JSON). Self-contained: its
    source is sent with `python -I -S -c`, so it imports nothing of whale."""
    import ctypes
    import json
    import os
    import pickle
    import resource
    import select
    import signal
    import struct
    import sys
    import time

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the jail's first process
    libc.prctl(4, 0)  # PR_SET_DUMPABLE = 0: a child of ours cannot ptrace us
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"  # threads count against the jail's process cap
    sys.path.extend(sys.argv[1:-1])
    spec = json.loads(sys.argv[-1])

    def read_exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = os.read(0, n - len(buf))
            if not chunk:
                return b""
            buf += chunk
        return buf

    try:
        import reasoning_gym

        config = dict(spec["config"])
        if spec["family"] == "composite":
            from reasoning_gym.composite import DatasetSpec

            config["datasets"] = [DatasetSpec(**d) for d in config["datasets"]]
        ds = reasoning_gym.create_dataset(
            spec["family"], seed=spec["seed"], size=spec["size"], **config
        )
    except BaseException as e:
        sys.stderr.write(f"grader start failed: {type(e).__name__}: {e}\n")
        os.write(1, b"fail\n")
        os._exit(1)
    try:  # warm the scorer's lazy imports and caches once, on the dataset's own entry 0
        first = ds[0]
        ds.score_answer(str(first["answer"] if first["answer"] is not None else "0"), first)
    except BaseException:
        pass
    import gc

    gc.freeze()  # the children then copy fewer pages on write
    os.write(1, b"ready\n")
    while True:
        head = read_exact(8)
        if not head:
            os._exit(0)  # the parent closed the pipe (or died)
        body = read_exact(struct.unpack(">Q", head)[0])
        if not body:
            os._exit(0)
        entry, answer, timeout = pickle.loads(body)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)  # the child cannot write to the parent's pipes
                os.closerange(3, w)
                os.closerange(w + 1, 4096)
                libc.prctl(1, signal.SIGKILL)
                cpu = int(timeout) + 1
                resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
                try:
                    msg = b"S" + struct.pack(">d", float(ds.score_answer(answer, entry)))
                except BaseException:
                    msg = b"E"
                os.write(w, msg)
            finally:
                os._exit(0)
        os.close(w)
        deadline = time.monotonic() + timeout
        got, timed_out = b"", False
        while len(got) <= 9:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                timed_out = True
                break
            chunk = os.read(r, 16)
            if not chunk:
                break
            got += chunk
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        if timed_out:
            reply = b"timeout\n"
        elif got == b"E":
            reply = b"error\n"
        elif len(got) == 9 and got[:1] == b"S":
            reply = b"ok " + repr(struct.unpack(">d", got[1:])[0]).encode() + b"\n"
        else:
            reply = b"crash\n"
        os.write(1, reply)


_ZYGOTE_CODE = textwrap.dedent(inspect.getsource(_zygote_main)) + "\n_zygote_main()\n"


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


class _Zygote:
    """One jailed grader for one dataset. Requests are serialized by `lock`."""

    def __init__(self, spec_json: str, sandbox: str, limits: GradingLimits) -> None:
        self.spec_json, self.sandbox, self.limits = spec_json, sandbox, limits
        self.lock = threading.Lock()
        self.jailed: Jailed | None = None
        self.failed: str | None = None  # a start failure, sticky after two tries
        self.starts = 0
        self._err = bytearray()

    # -- life ------------------------------------------------------------------------------
    def _start(self) -> Jailed:
        if self.failed is not None and self.starts >= 2:
            raise _Broken(self.failed)
        self.starts += 1
        sites = site_folders()
        inside = [f"{_SITE_INSIDE}{i}" for i in range(len(sites))]
        lim = self.limits
        jail_limits = Limits(
            memory_mb=lim.memory_mb,
            cpu_s=3600,  # the zygote's own life; each child has its own RLIMIT_CPU
            file_size_mb=16,
            open_files=64,
            processes=8,
            scratch_mb=16,
        )
        try:
            jailed = Sandbox(self.sandbox).spawn(  # type: ignore[arg-type]
                [python_executable(), "-I", "-S", "-c", _ZYGOTE_CODE, *inside, self.spec_json],
                jail_limits,
                ro_files=dict(zip(sites, inside, strict=True)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except (SandboxUnavailable, OSError) as e:
            self.failed = f"{type(e).__name__}: {e}"
            raise _Broken(self.failed) from e
        self._err = err = bytearray()
        assert jailed.proc.stderr is not None
        drainer = threading.Thread(target=_drain, args=(jailed.proc.stderr, err), daemon=True)
        drainer.start()
        assert jailed.proc.stdin is not None
        os.set_blocking(jailed.proc.stdin.fileno(), False)
        self.jailed = jailed
        try:
            line = self._readline(time.monotonic() + lim.start_timeout_s)
        except _Broken:
            line = b""
        if line != b"ready":
            self._kill()
            drainer.join(timeout=2)  # the last words of a failed start
            tail = bytes(self._err[-400:]).decode("utf-8", "replace").strip()
            self.failed = f"grader did not start ({tail or 'no output'})"
            raise _Broken(self.failed)
        self.failed = None
        self.starts = 0
        return jailed

    def _kill(self) -> None:
        jailed, self.jailed = self.jailed, None
        if jailed is not None:
            jailed.kill()
            for stream in (jailed.proc.stdin, jailed.proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass

    def close(self) -> None:
        with self.lock:
            self._kill()

    # -- one answer ------------------------------------------------------------------------
    def grade(self, entry: Any, answer: str) -> Grade:
        timeout = self.limits.timeout_s
        with self.lock:
            if self.jailed is not None and self.jailed.proc.poll() is not None:
                self._kill()  # died between answers (e.g. the thread that started it ended)
            try:
                jailed = self.jailed or self._start()
            except _Broken as e:
                return Grade(0.0, False, f"{UNAVAILABLE}: {e}")
            try:
                body = pickle.dumps((entry, answer, timeout), protocol=pickle.HIGHEST_PROTOCOL)
                deadline = time.monotonic() + timeout + REPLY_MARGIN_S
                self._write(jailed, struct.pack(">Q", len(body)) + body, deadline)
                line = self._readline(deadline)
            except _Broken as e:
                self._kill()
                return Grade(0.0, False, TIMEOUT if str(e) == "timeout" else CRASHED)
            except BaseException:  # an interrupt mid-request: the reply would be stale
                self._kill()
                raise
        return _parse_reply(line)

    def _write(self, jailed: Jailed, data: bytes, deadline: float) -> None:
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

    def _readline(self, deadline: float) -> bytes:
        """One reply line (at most 64 bytes), or _Broken."""
        assert self.jailed is not None and self.jailed.proc.stdout is not None
        fd = self.jailed.proc.stdout.fileno()
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Broken("timeout")
            chunk = os.read(fd, 64)
            if not chunk or len(buf) + len(chunk) > 64:
                raise _Broken("crash")
            buf += chunk
        if buf.count(b"\n") != 1:
            raise _Broken("crash")
        return buf[:-1]


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
    if line == b"timeout":
        return Grade(0.0, False, TIMEOUT)
    if line == b"error":
        return Grade(0.0, False, SCORER_ERROR)
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
            spec_json = json.dumps(
                {"family": spec.family, "size": spec.size, "seed": spec.seed,
                 "config": json.loads(spec.config_json)}
            )  # fmt: skip
            z = _POOL[pool_key] = _Zygote(spec_json, sandbox, limits)
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


def live_zygotes() -> list[int]:
    """Process ids of the running jailed graders (for tests and the benchmark)."""
    with _POOL_LOCK:
        return [z.jailed.proc.pid for z in _POOL.values() if z.jailed is not None]


atexit.register(close_all)
