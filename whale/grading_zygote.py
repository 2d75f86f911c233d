"""The jailed side of grading (`whale.grading`): the zygote's source, sent to the jail as text.

`zygote_main` is self-contained: `whale.grading` sends its source with `python -I -S -c`,
so it imports nothing of whale. It loads its scorer once (the spec's "kind": "rg" builds a
Reasoning Gym dataset; "call" imports a user's module and function; "regex" needs only `re`),
then serves requests framed as 8-byte lengths and pickles of (request id, entry, answer,
timeout), forking one child per answer, up to the spec's "parallel" at once, and answers one
line per request: `<id> <n> <verdict>`, where n is how many children were scoring when this
one started (itself included). A child hands back one tag byte and at most 40 more: S and a
double (a score), E (raised; a "call" child adds the exception's class name), and for "call"
T (not a real number), N (NaN or infinite), R (outside [0, 1]).
"""

from __future__ import annotations


def zygote_main() -> None:  # pragma: no cover - runs inside the jail, tested through it
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
    spec = json.loads(sys.argv[-1])
    kind = spec.get("kind", "rg")
    folders = sys.argv[1:-1]  # the site folders, then the user's paths (as argv: `unsafe` maps
    cut = len(folders) - int(spec.get("user_paths", 0))  # argv to host paths, not JSON)
    sys.path.extend(folders[:cut])
    user = folders[cut:]

    def load() -> object:
        """The scorer: score(answer, entry) -> float (rg, regex) or any value (call)."""
        if kind == "regex":
            import re

            def regex(answer: str, entry: tuple) -> float:
                patterns, search = entry
                match = re.search if search else re.fullmatch
                return float(any(match(p, answer.strip()) is not None for p in patterns))

            return regex
        if kind == "call":
            import importlib
            import importlib.util

            if spec.get("file"):  # a .py file named by path: user[0]
                found = importlib.util.spec_from_file_location(spec["module"], user[0])
                assert found is not None and found.loader is not None, user[0]
                module = importlib.util.module_from_spec(found)
                sys.modules[spec["module"]] = module
                found.loader.exec_module(module)
            else:  # the module's file or top package folder: its folder goes on the path
                sys.path.extend(os.path.dirname(u) for u in user)
                module = importlib.import_module(spec["module"])
            fn = getattr(module, spec["function"])
            return lambda answer, entry: fn(entry[0], answer, entry[1])
        import reasoning_gym

        config = dict(spec["config"])
        if spec["family"] == "composite":
            from reasoning_gym.composite import DatasetSpec

            config["datasets"] = [DatasetSpec(**d) for d in config["datasets"]]
        ds = reasoning_gym.create_dataset(
            spec["family"], seed=spec["seed"], size=spec["size"], **config
        )
        try:  # warm the scorer's lazy imports and caches once, on the dataset's own entry 0
            first = ds[0]
            ds.score_answer(str(first["answer"] if first["answer"] is not None else "0"), first)
        except BaseException:
            pass
        return ds.score_answer

    try:
        score = load()
    except BaseException as e:
        sys.stderr.write(f"grader start failed: {type(e).__name__}: {e}\n")
        os.write(1, b"fail\n")
        os._exit(1)

    def verdict(value: object) -> bytes:
        """A "call" result as a tag: S and the score, or why it is not one."""
        import math
        import numbers

        if isinstance(value, bool):
            value = float(value)
        if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
            value = float(bool(value))  # type: ignore[arg-type]
        if not isinstance(value, numbers.Real):
            return b"T"
        v = float(value)
        if not math.isfinite(v):
            return b"N"
        if not 0.0 <= v <= 1.0:
            return b"R"
        return b"S" + struct.pack(">d", v)

    import gc

    gc.freeze()  # the children then copy fewer pages on write
    parallel = max(1, int(spec.get("parallel", 1)))
    os.write(1, b"ready\n")
    inbuf = bytearray()
    waiting: list[tuple[int, object, str, float]] = []  # requests past the parallel cap
    running: dict[int, list] = {}  # child's pipe -> [request id, pid, deadline, bytes, n]

    def start(rid: int, entry: object, answer: str, timeout: float) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)  # the child cannot write to the parent's pipes
                os.closerange(3, w)  # nor read its siblings' pipes
                os.closerange(w + 1, 4096)
                libc.prctl(1, signal.SIGKILL)
                cpu = int(timeout) + 1
                resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
                try:
                    value = score(answer, entry)  # type: ignore[operator]
                    if kind == "call":
                        msg = verdict(value)
                    else:
                        msg = b"S" + struct.pack(">d", float(value))
                except BaseException as e:
                    name = type(e).__name__.encode("ascii", "replace")[:40]
                    if kind != "call" or not name.replace(b"_", b"").isalnum():
                        name = b""  # Reasoning Gym's: the word only, as before
                    msg = b"E" + name
                os.write(w, msg)
            finally:
                os._exit(0)
        os.close(w)
        # n: the children scoring at once, this one included (what the parent's tests read)
        running[r] = [rid, pid, time.monotonic() + timeout, b"", len(running) + 1]

    def finish(r: int, verdict: bytes) -> None:
        rid, pid, _, _, n = running.pop(r)
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.write(1, b"%d %d %s\n" % (rid, n, verdict))

    while True:
        while waiting and len(running) < parallel:
            start(*waiting.pop(0))
        deadline = min((c[2] for c in running.values()), default=None)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = select.select([0, *running], [], [], left)[0]
        for fd in ready:
            if fd == 0:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    os._exit(0)  # the parent closed the pipe (or died); children die with us
                inbuf += chunk
                while len(inbuf) >= 8:
                    size = struct.unpack(">Q", bytes(inbuf[:8]))[0]
                    if len(inbuf) < 8 + size:
                        break
                    waiting.append(pickle.loads(bytes(inbuf[8 : 8 + size])))
                    del inbuf[: 8 + size]
                continue
            child = running[fd]
            chunk = os.read(fd, 64)
            child[3] += chunk
            got = child[3]
            if chunk and len(got) <= 41:
                continue
            if got[:1] == b"E" and len(got) <= 41:
                finish(fd, b"error " + got[1:] if len(got) > 1 else b"error")
            elif len(got) == 9 and got[:1] == b"S":
                finish(fd, b"ok " + repr(struct.unpack(">d", got[1:])[0]).encode())
            elif got in (b"T", b"N", b"R"):
                finish(fd, {b"T": b"notnumber", b"N": b"notfinite", b"R": b"range"}[got])
            else:
                finish(fd, b"crash")
        now = time.monotonic()
        for fd in [fd for fd, c in running.items() if c[2] <= now]:
            finish(fd, b"timeout")
